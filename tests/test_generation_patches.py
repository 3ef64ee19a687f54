"""fairseq generation options the suite fixes for every model (fairseq_plugins/patches/):
``--no-repeat-ngram-size`` on CPU and ``--match-source-len``."""
import pytest
from conftest import GENERATION_FAMILIES
from helpers import generate, teacher_forced_log2probs

pytestmark = pytest.mark.slow


def ngrams(words, n):
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def has_repeat(words, n):
    grams = ngrams(words, n)
    return len(set(grams)) < len(grams)


@pytest.mark.parametrize("family", list(GENERATION_FAMILIES))
def test_no_repeat_ngram_size_bans_repeats(generation_models, plain_generations, data_bin, family):
    path = generation_models[family]
    free = plain_generations[family]  # the same command without --no-repeat-ngram-size
    assert any(has_repeat(h.split(), 2) for s in free.values() for h in s["nbest"]), "the oracle needs repeats"
    blocked = generate(data_bin, path, "--no-repeat-ngram-size", "2", "--nbest", "2")
    repeats = [h for s in blocked.values() for h in s["nbest"] if has_repeat(h.split(), 2)]
    assert not repeats, f"{family}: repeated bigrams survive: {repeats[:3]}"


@pytest.mark.parametrize("family", list(GENERATION_FAMILIES))
def test_match_source_len(generation_models, data_bin, family):
    path = generation_models[family]
    out = generate(data_bin, path, "--match-source-len")
    for i, lines in out.items():
        src, hyp = lines["S"].split(), lines["H"][1].split()
        assert len(hyp) == len(src), f"{family} sentence {i}: |H| = {len(hyp)}, |S| = {len(src)}"
    for i in list(out)[:3]:
        scores = [float(s) for s in out[i]["P"].split()]
        reference = teacher_forced_log2probs(path, out[i]["S"], out[i]["H"][1])
        assert scores == pytest.approx(reference, abs=2e-4), f"{family} sentence {i}"
