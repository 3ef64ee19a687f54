"""``--replace-unk [DICT]`` on binarized and raw data, with and without ``--print-alignment``, in
fairseq-generate and fairseq-interactive, for RNNsearch and the Transformer.

Oracle: each ``<unk>`` of the plain hypothesis becomes the source word with the largest attention
weight in fairseq's own ``--print-alignment soft`` row for that target word (EOS excluded), or its
entry in the alignment dictionary; every other word stays as it was."""
import pytest
from helpers import ONE_THREAD, USER_DIR, generate, in_parallel, make_corpus, preprocess, run, train

pytestmark = pytest.mark.slow
FAMILIES = {"rnnsearch": ["--arch", "rnnsearch_tiny", "--init", "pytorch"],
            "vaswani_transformer": ["--arch", "vaswani_transformer_tiny", "--encoder-layers", "1",
                                    "--decoder-layers", "1"]}


@pytest.fixture(scope="module")
def unk_setup(tmp_path_factory):
    """Rare target words are <unk> (--thresholdtgt 2); the source vocabulary keeps every word, and
    the test set is training sentences, so the aligned source words are known."""
    root = tmp_path_factory.mktemp("replace-unk")
    raw = make_corpus(str(root / "raw"), train=400, valid=20, test=20, max_len=10, rare_rate=0.5, seed=3)
    for side in ("src", "tgt"):
        lines = open(f"{raw}/train.{side}").read().splitlines()[:20]
        open(f"{raw}/test.{side}", "w").write("\n".join(lines) + "\n")
    data = preprocess(raw, str(root / "bin"), joined=False, extra=["--thresholdtgt", "2"])
    raw_data = str(root / "raw-bin")
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--testpref", f"{raw}/test",
         "--destdir", raw_data, "--srcdict", f"{data}/dict.src.txt", "--tgtdict", f"{data}/dict.tgt.txt",
         "--dataset-impl", "raw", "--workers", "1"])
    align_dict = root / "align.txt"  # every source word -> "X" + word: shows the dictionary was used
    words = [line.split()[0] for line in open(f"{data}/dict.src.txt")]
    align_dict.write_text("".join(f"{w} X{w}\n" for w in words))
    in_parallel([lambda family=family, arch=arch: train(data, root / family, arch, 150,
                                                        ["--lr", "0.005", "--no-epoch-checkpoints"], ONE_THREAD)
                 for family, arch in FAMILIES.items()])
    paths = {family: str(root / family / "checkpoint_last.pt") for family in FAMILIES}
    return {"data": data, "raw_data": raw_data, "raw": raw, "dict": {w: "X" + w for w in words},
            "dict_path": str(align_dict), "paths": paths}


def expected(plain, align_dict=None):
    """{id: hypothesis with each <unk> replaced by its soft-alignment argmax source word}."""
    out = {}
    for i, lines in plain.items():
        source, words = lines["S"].split(), lines["H"][1].split()
        rows = [[float(p) for p in row.split(",")] for row in lines["A"].split()]
        for t, word in enumerate(words):
            if word == "<unk>":
                best = max(range(len(rows[t]) - 1), key=rows[t].__getitem__)  # last column: EOS
                words[t] = (align_dict or {}).get(source[best], source[best])
        out[i] = " ".join(words)
    return out


def hypotheses(out):
    return {i: lines["H"][1] for i, lines in out.items()}


@pytest.fixture(scope="module")
def soft(unk_setup):
    """{family: fairseq-generate --print-alignment soft of the binarized test set}: the oracle's input."""
    return {family: generate(unk_setup["data"], path, "--print-alignment", "soft")
            for family, path in unk_setup["paths"].items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_replace_unk_binarized(unk_setup, soft, family):
    data, path, plain = unk_setup["data"], unk_setup["paths"][family], soft[family]
    assert sum(h["H"][1].split().count("<unk>") for h in plain.values()) >= 5, "the oracle needs <unk>s"
    assert hypotheses(generate(data, path, "--replace-unk")) == expected(plain)
    assert hypotheses(generate(data, path, "--replace-unk", unk_setup["dict_path"])) == \
        expected(plain, unk_setup["dict"])


def test_replace_unk_with_print_alignment_and_raw_data(unk_setup, soft):
    data, path = unk_setup["data"], unk_setup["paths"]["rnnsearch"]
    want = expected(soft["rnnsearch"])
    assert hypotheses(generate(data, path, "--replace-unk", "--print-alignment")) == want
    assert hypotheses(generate(unk_setup["raw_data"], path, "--dataset-impl", "raw", "--replace-unk")) == want


def test_interactive_and_ensemble_replace_unk(unk_setup, soft):
    """docs/RECIPES.md's commands: fairseq-interactive, one model and an ensemble of two families. One
    model must give the oracle's output, the ensemble fairseq-generate's."""
    data, paths = unk_setup["data"], unk_setup["paths"]
    sources = open(f"{unk_setup['raw']}/test.src").read()
    ensemble = f"{paths['rnnsearch']}:{paths['vaswani_transformer']}"
    for path, batch in ((paths["rnnsearch"], expected(soft["rnnsearch"], unk_setup["dict"])),
                        (ensemble, hypotheses(generate(data, ensemble, "--replace-unk", unk_setup["dict_path"])))):
        proc = run(["fairseq-interactive", data, "--user-dir", USER_DIR, "--path", path, "--source-lang", "src",
                    "--target-lang", "tgt", "--beam", "2", "--cpu", "--max-len-a", "1", "--max-len-b", "5",
                    "--replace-unk", unk_setup["dict_path"]], env=None, check=False, input_text=sources)
        assert proc.returncode == 0, proc.stdout[-2000:]
        interactive = {int(line.split("\t")[0][2:]): line.split("\t")[2]
                       for line in proc.stdout.splitlines() if line.startswith("H-")}
        assert interactive == batch
        assert any("X" in h for h in interactive.values())
