"""What the benchmarks run: model sizes per preset, the pairs' flags, and the data.

Pairs, on the same data and with the same flags (sizes of each preset in ``PRESETS``):

* ``vaswani_transformer`` vs fairseq's ``transformer`` of identical size;
* ``rnnsearch`` vs fairseq's ``lstm`` (bidirectional encoder, attention) at equal hidden sizes.
"""
import os
import subprocess
import sys
from typing import Dict, List

from fairseq_plugins.data.synthetic_corpus import preprocess_args, write_corpus
from fairseq_plugins.errors import ConfigError, PluginError
from fairseq_plugins_lab.experiment import USER_DIR

PAIR_NAMES = ("transformer", "rnnsearch")
MODELS = ("ours", "theirs")
COMPILED = "compiled"  # ours decoding with --compile-decoding, a third generation measurement of each pair
# Sizes per preset. Transformer: layers per side, d_model, d_ff, heads. RNN: embedding E,
# encoder hidden H per direction, decoder hidden, attention hidden n', maxout l (= lstm's
# decoder-out-embed-dim, so both end in an l x V softmax). cpu: the anchor of
# docs/FAIRSEQ_NOTES.md (speeds of fairseq's built-in models); base/big: the papers' sizes (for GPUs).
PRESETS = {
    "tiny": dict(layers=1, d_model=32, d_ff=64, heads=2, transformer_archs=("vaswani_transformer", "transformer"),
                 embed=16, enc_hidden=32, dec_hidden=64, att_hidden=64, maxout=32,
                 warmup=1, updates=2, sentences=4, gen_batch=4, max_tokens=256, corpus=(300, 10, 20, 5, 12),
                 budget=3),
    "cpu": dict(layers=3, d_model=256, d_ff=1024, heads=4, transformer_archs=("vaswani_transformer", "transformer"),
                embed=256, enc_hidden=256, dec_hidden=512, att_hidden=512, maxout=256,
                warmup=3, updates=30, sentences=200, gen_batch=32, max_tokens=4096, corpus=(10000, 100, 200, 10, 40),
                budget=25),
    "base": dict(layers=6, d_model=512, d_ff=2048, heads=8,
                 transformer_archs=("vaswani_transformer_base", "transformer"),
                 embed=620, enc_hidden=1000, dec_hidden=1000, att_hidden=1000, maxout=500,
                 warmup=10, updates=200, sentences=1000, gen_batch=128, max_tokens=4096,
                 corpus=(20000, 100, 1000, 10, 40), budget=7),
    "big": dict(layers=6, d_model=1024, d_ff=4096, heads=16,
                transformer_archs=("vaswani_transformer_big", "transformer_vaswani_wmt_en_de_big"),
                embed=620, enc_hidden=1000, dec_hidden=1000, att_hidden=1000, maxout=500,
                warmup=10, updates=200, sentences=1000, gen_batch=128, max_tokens=4096,
                corpus=(20000, 100, 1000, 10, 40), budget=7),
}
MAX_LEN_A, MAX_LEN_B = 1.2, 10  # generation length limit a·|x| + b (fairseq-generate's flags)


def pair_flags(pair: str, preset: dict, shared_dictionary: bool) -> Dict[str, List[str]]:
    """Model flags of ours and theirs; every size flag is given to both."""
    if pair == "transformer":
        sizes = []
        for side in ("encoder", "decoder"):
            sizes += [f"--{side}-layers", preset["layers"], f"--{side}-embed-dim", preset["d_model"],
                      f"--{side}-ffn-embed-dim", preset["d_ff"], f"--{side}-attention-heads", preset["heads"]]
        sizes.append("--share-all-embeddings" if shared_dictionary else "--share-decoder-input-output-embed")
        ours_arch, theirs_arch = preset["transformer_archs"]
        return {"ours": ["--arch", ours_arch, *sizes], "theirs": ["--arch", theirs_arch, *sizes]}
    sizes = ["--encoder-embed-dim", preset["embed"], "--decoder-embed-dim", preset["embed"],
             "--encoder-hidden-size", preset["enc_hidden"], "--decoder-hidden-size", preset["dec_hidden"],
             "--encoder-layers", 1, "--decoder-layers", 1]
    return {"ours": ["--arch", "rnnsearch", *sizes, "--attention-hidden-size", preset["att_hidden"],
                     "--maxout-dim", preset["maxout"]],
            "theirs": ["--arch", "lstm", *sizes, "--encoder-bidirectional", "--decoder-attention", "1",
                       "--decoder-out-embed-dim", preset["maxout"]]}


def device_flags(device: str = "cpu", fp16: bool = False) -> List[str]:
    return (["--cpu"] if device == "cpu" else []) + (["--fp16"] if fp16 else [])


def training_argv(args, model_flags: List[str], save_dir: str, criterion: str = "label_smoothed_cross_entropy",
                  device: str = "cpu", fp16: bool = False, num_workers: int = 0) -> List[str]:
    """fairseq-train's flags (without the program) for ``args.data``, ``args.lang_flags``, ``args.max_tokens``."""
    return [str(a) for a in [
        args.data, "--user-dir", USER_DIR, "--task", "translation", *args.lang_flags, *model_flags,
        "--dropout", 0.1, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", 7e-4,
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 20, "--warmup-init-lr", 1e-7,
        "--criterion", criterion, "--label-smoothing", 0.1,
        "--max-tokens", args.max_tokens, "--seed", 1, "--num-workers", num_workers,
        "--disable-validation", "--no-progress-bar", "--save-dir", save_dir, *device_flags(device, fp16)]]


def length_limits(args):
    """(a, b) of the length limit a·|x| + b: ``--max-len`` L fixes it at L (with ``--min-len`` L)."""
    return (0, args.max_len) if args.max_len else (MAX_LEN_A, MAX_LEN_B)


def generation_argv(args) -> List[str]:
    max_len_a, max_len_b = length_limits(args)
    return [str(a) for a in [
        args.data, "--user-dir", USER_DIR, "--task", "translation", *args.lang_flags, "--gen-subset", "test",
        "--beam", args.beam, "--batch-size", args.gen_batch, "--max-len-a", max_len_a, "--max-len-b", max_len_b,
        "--min-len", args.min_len,
        "--seed", 1, "--num-workers", 0, *device_flags(args.device, args.fp16)]]


def prepare_data(args, preset: dict, work_dir: str) -> str:
    """The synthetic corpus of the preset, preprocessed with a joined dictionary."""
    train, valid, test, min_len, max_len = preset["corpus"]
    raw, data = os.path.join(work_dir, "raw"), os.path.join(work_dir, "data-bin")
    write_corpus(raw, train, valid, test, min_len, max_len, seed=1)
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", *preprocess_args(raw, data, workers=2)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise PluginError(f"preparing the corpus failed: fairseq-preprocess: {proc.stdout[-500:]}")
    return data


def _dictionaries(data: str, args, need_test: bool = True) -> List[str]:
    if args.source_lang and args.target_lang:
        langs = [args.source_lang, args.target_lang]
    else:
        langs = sorted(n[len("dict."):-len(".txt")] for n in os.listdir(data)
                       if n.startswith("dict.") and n.endswith(".txt"))
    paths = [os.path.join(data, f"dict.{lang}.txt") for lang in langs]
    if len(paths) != 2 or not all(os.path.isfile(p) for p in paths):
        raise PluginError(f"--data {data}: expected fairseq-preprocess output with two dict.LANG.txt files "
                          "(pass --source-lang/--target-lang)")
    if need_test and not any(n.startswith("test.") for n in os.listdir(data)):
        raise PluginError(f"--data {data}: no test split (generation runs on it)")
    return paths


def _same_file(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def complete_run_args(args, preset: dict, positive):
    """What both benchmark commands check alike (ConfigError, one line), and what follows from
    it: ``args.lang_flags`` and ``args.data_label``."""
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.budget_minutes <= 0:
        raise ConfigError(f"--budget-minutes must be positive, got {args.budget_minutes}")
    if args.data is not None and not os.path.isdir(args.data):
        raise ConfigError(f"--data {args.data}: no such directory")
    if bool(args.source_lang) != bool(args.target_lang):
        raise ConfigError("--source-lang and --target-lang go together")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise ConfigError(f"--out {args.out}: its directory does not exist")
    args.lang_flags = ["--source-lang", args.source_lang, "--target-lang", args.target_lang] if args.source_lang else []
    train, _, test, min_len, max_len = preset["corpus"]
    args.data_label = (args.data if args.data else
                       f"synthetic corpus ({train} training pairs, {min_len}-{max_len} tokens, test {test})")
