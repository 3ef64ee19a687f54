"""Shared pieces of the tests: run the real command-line tools in subprocesses."""
import os
import subprocess
import sys

import fairseq_plugins
from fairseq_plugins.data.synthetic_corpus import preprocess_args, write_corpus

USER_DIR = os.path.dirname(os.path.abspath(fairseq_plugins.__file__))
REPO = os.path.dirname(USER_DIR)
BIN = os.path.dirname(sys.executable)


def cli_env(extra=None):
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the suite must not need it
    env.update(extra or {})
    return env


def run(cmd, cwd=None, env=None, check=True):
    """Run ``cmd`` (a list); return stdout+stderr. With ``check``, a non-zero exit fails the test."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=cli_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if check:
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
    return proc.stdout if check else proc


def make_corpus(out, train=300, valid=30, test=30, min_len=5, max_len=12, **flags):
    """The embedded corpus, small: {train,valid,test}.{src,tgt} under ``out``."""
    return write_corpus(out, train, valid, test, min_len, max_len, **flags)


def preprocess(raw, dest, joined=True, extra=()):
    run(["fairseq-preprocess", *preprocess_args(raw, dest, joined=joined), *extra])
    return dest


# A fairseq built-in transformer small enough to train a few updates in seconds.
TINY_BUILTIN_TRANSFORMER = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def train(data, save_dir, arch_args, max_update, extra=()):
    """fairseq-train with small defaults; ``arch_args`` and ``extra`` come last, so they override them."""
    cmd = ["fairseq-train", data, "--user-dir", USER_DIR, "--optimizer", "adam", "--lr", "0.002",
           "--max-tokens", "1000", "--max-update", max_update, "--save-dir", save_dir, "--cpu", "--seed", "1",
           "--no-progress-bar", "--log-interval", "1", "--num-workers", "0", *arch_args, *extra]
    return run(cmd)


def first_non_finite_module(model, net_input, autocast_dtype=None):
    """The name of the first module whose forward output holds NaN/Inf on ``net_input``.

    Found with plain forward hooks, independently of the suite's NanDetector: a module's hook
    fires when its forward returns, so children are seen before their parents.
    """
    import torch

    names = {module: name for name, module in model.named_modules()}
    found = []

    def tensors(value):
        if torch.is_tensor(value):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from tensors(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from tensors(v)

    def hook(module, inputs, output):
        if not found and any(t.is_floating_point() and not torch.isfinite(t).all() for t in tensors(output)):
            found.append(names[module])

    handles = [module.register_forward_hook(hook) for module in model.modules()]
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            model(**net_input)
    finally:
        for handle in handles:
            handle.remove()
    assert found, "no module output holds NaN/Inf"
    return found[0]
