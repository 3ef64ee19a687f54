"""Shared pieces of the tests: run the real command-line tools in subprocesses."""
import os
import subprocess
import sys

import fairseq_plugins

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
    cmd = ["fairseq-plugins-make-corpus", "--out", out, "--train", train, "--valid", valid, "--test", test,
           "--min-len", min_len, "--max-len", max_len]
    for key, value in flags.items():
        cmd += ["--" + key.replace("_", "-"), value]
    run(cmd)
    return out


def preprocess(raw, dest, joined=True, extra=()):
    cmd = ["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
           "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", dest, "--workers", "1"]
    run(cmd + (["--joined-dictionary"] if joined else []) + list(extra))
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
