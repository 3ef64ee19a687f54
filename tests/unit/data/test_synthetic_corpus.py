"""The embedded corpus: deterministic, long sentences on demand, the target-side phenomena."""
import collections

import pytest

from fairseq_plugins.cli import make_corpus
from fairseq_plugins.data import synthetic_corpus


def generate(tmp_path, *flags):
    make_corpus.main(["--out", str(tmp_path), "--train", "400", "--valid", "20", "--test", "20", *flags])
    read = lambda name: (tmp_path / name).read_text().splitlines()  # noqa: E731
    return {f"{s}.{side}": read(f"{s}.{side}") for s in synthetic_corpus.SPLITS for side in ("src", "tgt")}


def test_deterministic_and_seeded(tmp_path):
    a = generate(tmp_path / "a", "--seed", "3")
    b = generate(tmp_path / "b", "--seed", "3")
    c = generate(tmp_path / "c", "--seed", "4")
    assert a == b
    assert a["train.src"] != c["train.src"]
    # every split has its own stream: no split repeats another's first sentences (20 lines each here)
    assert a["train.src"][:20] != a["test.src"] and a["valid.src"] != a["test.src"]
    assert len(a["test.src"]) == len(a["valid.src"]) == 20


def test_lengths_and_alignment_of_lines(tmp_path):
    files = generate(tmp_path, "--min-len", "20", "--max-len", "50", "--test-max-len", "80")
    for split in synthetic_corpus.SPLITS:
        assert len(files[f"{split}.src"]) == len(files[f"{split}.tgt"])
    train_lengths = [len(line.split()) for line in files["train.src"]]
    test_lengths = [len(line.split()) for line in files["test.src"]]
    assert min(train_lengths) >= 20 and max(train_lengths) <= 50
    assert max(test_lengths) <= 80 and max(test_lengths) > 50


def test_distinct_vocabularies_and_target_phenomena(tmp_path):
    files = generate(tmp_path)
    src_vocab = {w for line in files["train.src"] for w in line.split()}
    tgt_vocab = {w for line in files["train.tgt"] for w in line.split()}
    assert not src_vocab & tgt_vocab
    tgt_words = collections.Counter(w for line in files["train.tgt"] for w in line.split())
    # Articles that depend on the noun: elided, masculine, feminine, plural forms all occur.
    assert all(tgt_words[a] > 0 for a in ("l'", "le", "la", "les", "un", "une"))
    src_words = collections.Counter(w for line in files["train.src"] for w in line.split())
    assert src_words["the"] > 0 and src_words["because"] > 0 and src_words["that"] > 0


def test_adjective_follows_noun(tmp_path):
    """'the ADJ NOUN VERB ...' in the source comes out as 'ART NOUN ADJ ...' in the target."""
    lex = synthetic_corpus.Lexicon(1)
    adjectives = dict(lex.adjs)
    nouns = {s: t for s, t, _ in lex.nouns}
    files = generate(tmp_path)
    checked = 0
    for src, tgt in zip(files["train.src"], files["train.tgt"]):
        words = src.split()
        if words[0] == "the" and words[1] in adjectives and words[2] in nouns:
            tgt_words = tgt.split()
            assert tgt_words[1] == nouns[words[2]]
            assert tgt_words[2].startswith(adjectives[words[1]])
            checked += 1
    assert checked > 5


def test_rare_words_fall_outside_a_shortlist(tmp_path):
    common = generate(tmp_path / "c")
    rare = generate(tmp_path / "r", "--rare-rate", "0.3")
    count = lambda f: len({w for line in f["train.src"] for w in line.split()})  # noqa: E731
    assert count(rare) > count(common) + 100


@pytest.mark.parametrize("flags, flag", [
    (["--min-len", "30", "--max-len", "10"], "--min-len 30"),
    (["--train", "0"], "--train 0"),
    (["--min-len", "2"], "--min-len 2"),
])
def test_impossible_settings(tmp_path, capsys, flags, flag):
    with pytest.raises(SystemExit) as exit_info:
        make_corpus.main(["--out", str(tmp_path), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err
    assert not any(tmp_path.iterdir())
