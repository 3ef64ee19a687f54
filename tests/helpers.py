"""Shared pieces of the tests: run the real command-line tools in subprocesses."""
import os
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_plugins
from fairseq_plugins.data.synthetic_corpus import preprocess_args, write_corpus
from fairseq_plugins.network import free_port
from fairseq_plugins_lab.experiment import run_parallel

USER_DIR = os.path.dirname(os.path.abspath(fairseq_plugins.__file__))
REPO = os.path.dirname(USER_DIR)
BIN = os.path.dirname(sys.executable)


def cli_env(extra=None):
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the suite must not need it
    env.update(extra or {})
    return env


ONE_THREAD = {"OMP_NUM_THREADS": "1"}

# --autocast-bf16 refuses a CPU without native bf16 (oneDNN's check, as the criterion's), so the tests
# that train or run in bf16 skip there; test_bf16 checks that refusal with the check faked.
needs_native_bf16 = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="this CPU has no native bf16 (torch.ops.mkldnn._is_mkldnn_bf16_supported() is False): "
           "--autocast-bf16 refuses it")


def slurm_env(rank, tasks):
    """What srun sets for task ``rank`` of a one-node job of ``tasks`` tasks (the suite's launch patch reads it)."""
    return {"SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": str(tasks), "SLURM_NNODES": "1",
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_JOB_ID": "7"}


def slurm_tasks(cmd, tasks, env=None, port=None, timeout=600):
    """[(exit status, output)] of ``tasks`` processes of ``cmd`` as srun starts them (the same command,
    SLURM_PROCID 0, 1, ...; gloo on localhost at ``port``, a free one if None); one plain process for 1."""
    if tasks > 1:
        cmd = [*cmd, "--distributed-port", port or free_port()]
    procs = [subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=cli_env({**(env or {}), **(slurm_env(r, tasks) if tasks > 1 else {})}))
             for r in range(tasks)]
    return [(p.wait(timeout=timeout), p.communicate()[0]) for p in procs]


def in_parallel(calls):
    """Call every function of ``calls`` (each runs its own subprocesses), two at a time: CI has two
    cores, and a tiny model trained with ``ONE_THREAD`` uses one. Returns their results in order."""
    return run_parallel(calls, 2)


def run(cmd, cwd=None, env=None, check=True, input_text=None):
    """Run ``cmd`` (a list), ``input_text`` on its stdin; return stdout+stderr. With ``check``, a
    non-zero exit fails the test."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=cli_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, input=input_text)
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


def train(data, save_dir, arch_args, max_update, extra=(), env=None):
    """fairseq-train with small defaults; ``arch_args`` and ``extra`` come last, so they override them."""
    cmd = ["fairseq-train", data, "--user-dir", USER_DIR, "--optimizer", "adam", "--lr", "0.002",
           "--max-tokens", "1000", "--max-update", max_update, "--save-dir", save_dir, "--cpu", "--seed", "1",
           "--no-progress-bar", "--log-interval", "1", "--num-workers", "0", *arch_args, *extra]
    return run(cmd, env=env)


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


def generate(data, checkpoint, *flags, beam=2):
    """fairseq-generate on the test set; returns {sentence id: {"S"/"T"/"H"/"P"/"A": fields}} of the best
    hypothesis (H: [score, text]; P: the positional scores, base 2) and "nbest": the texts of all."""
    return parse_generation(run(["fairseq-generate", *generate_args(data, checkpoint, *flags, beam=beam)]))


def generate_args(data, checkpoint, *flags, beam=2):
    return [data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", str(beam), "--cpu", "--max-len-a", "1",
            "--max-len-b", "5", "--batch-size", "8", *map(str, flags)]


def generate_in_process(results_dir, data, checkpoint, *flags, beam=2):
    """fairseq-generate's main in this process (no interpreter start, ~5 s less), the same arguments
    as :func:`generate`; returns what it prints (written to ``results_dir``)."""
    from fairseq import options
    from fairseq_cli import generate as fairseq_generate

    fairseq_generate.main(options.parse_args_and_arch(options.get_generation_parser(), [
        *generate_args(data, checkpoint, *flags, beam=beam), "--results-path", str(results_dir)]))
    with open(os.path.join(results_dir, "generate-test.txt")) as f:
        return f.read()


def parse_generation(out):
    """{sentence id: {"S"/"T"/"H"/"P"/"A": fields}} of fairseq-generate's output (see :func:`generate`)."""
    lines = {}
    for line in out.splitlines():
        key, _, rest = line.partition("\t")
        if len(key) > 2 and key[1] == "-" and key[0] in "STHPA" and key[2:].isdigit():
            fields, entry = rest.split("\t"), lines.setdefault(int(key[2:]), {"nbest": []})
            if key[0] == "H":
                entry["nbest"].append(fields[-1])
            entry.setdefault(key[0], fields if key[0] == "H" else fields[-1])
    return lines


def teacher_forced_log2probs(path, src_words, hyp_words):
    """log2 p(y_t | y_<t, x) of each hypothesis word and the final EOS, from one full forward."""
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    model = models[0].eval()
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src = src_dict.encode_line(src_words, add_if_not_exist=False).long()[None]
    tgt = tgt_dict.encode_line(hyp_words, add_if_not_exist=False).long()[None]  # words + EOS
    prev = torch.cat([tgt.new_tensor([[tgt_dict.eos()]]), tgt[:, :-1]], dim=1)
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(src, torch.tensor([src.size(1)]), prev), log_probs=True)
    return (lprobs[0].gather(1, tgt[0][:, None])[:, 0] / torch.log(torch.tensor(2.0))).tolist()


def pre_2019_layout(state):
    """A state dict of fairseq's ``transformer`` in the layout of its checkpoints before 2019 (the
    published WMT models): fused in_proj_weight/bias, the encoder's layer norms numbered."""
    old = {}
    for key, value in state.items():
        if ".q_proj." in key:
            part = key.rsplit(".", 1)[1]
            old[key.replace(f"q_proj.{part}", f"in_proj_{part}")] = torch.cat(
                [value, state[key.replace("q_proj", "k_proj")], state[key.replace("q_proj", "v_proj")]])
        elif ".k_proj." in key or ".v_proj." in key:
            continue
        elif key.startswith("encoder.layers.") and "_layer_norm." in key:
            name = key.split(".")[3]
            old[key.replace(name, "layer_norms." + ("0" if name == "self_attn_layer_norm" else "1"))] = value
        else:
            old[key] = value
    return old


def num_updates(state):
    """The update count of a loaded checkpoint state."""
    return state["optimizer_history"][-1]["num_updates"]


def assert_beam_agrees(found, expected, max_len):
    """``found`` and ``expected``: {sentence id: (hypothesis, score in bits)} of two beam searches.
    Every hypothesis equal, its score within 1e-3 bits, except where one of the two reaches the
    length limit (``max_len`` tokens): there the order in which the searches cut their beams
    decides. Returns the ids of those."""
    assert expected.keys() == found.keys()
    at_limit = []
    for i, (text, score) in sorted(found.items()):
        want_text, want_score = expected[i]
        if text != want_text:
            assert max(len(text.split()), len(want_text.split())) >= max_len, (i, text, want_text)
            at_limit.append(i)
        else:
            assert abs(score - want_score) < 1e-3, (i, text, score, want_score)
    return at_limit


# A toy lexicon: English word -> (German, French); translations are word for word, so the token counts
# of a pair are equal on both sides after tokenization (the fake WMT'14 corpora, the text tools' tests).
LEXICON = {
    "the": ("die", "la"), "house": ("Haus", "maison"), "is": ("ist", "est"), "small": ("klein", "petite"),
    "a": ("eine", "une"), "city": ("Stadt", "ville"), "green": ("grün", "verte"), "river": ("Fluss", "rivière"),
    "near": ("nahe", "près"), "we": ("wir", "nous"), "see": ("sehen", "voyons"), "old": ("alt", "vieille"),
    "bridge": ("Brücke", "pont"), "today": ("heute", "demain"), "and": ("und", "et"), "it": ("es", "il"),
    "was": ("war", "était"), "well-known": ("wohl-bekannt", "bien-connu"), "two": ("zwei", "deux"),
    "cars": ("Autos", "voitures"),
}
WORDS = sorted(LEXICON)
