"""fairseq generation options for every model: those the suite fixes (fairseq_plugins/patches/):
``--no-repeat-ngram-size`` on CPU and ``--match-source-len``; and the padding side of the sources."""
import math

import pytest
import torch
from conftest import GENERATION_FAMILIES
from helpers import generate, generate_in_process, parse_generation, teacher_forced_log2probs

pytestmark = pytest.mark.slow


def ngrams(words, n):
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def has_repeat(words, n):
    grams = ngrams(words, n)
    return len(set(grams)) < len(grams)


# Hypotheses held past the length where these undertrained models stop: there they repeat bigrams on every
# fairseq version (at their own length, 0.12.2's Transformer happened not to), which the oracle needs.
LONG = ("--min-len", "10", "--max-len-a", "2", "--max-len-b", "10", "--nbest", "2")


@pytest.mark.parametrize("family", list(GENERATION_FAMILIES))
def test_no_repeat_ngram_size_bans_repeats(generation_models, data_bin, family):
    path = generation_models[family]
    free = generate(data_bin, path, *LONG)  # the same command without --no-repeat-ngram-size
    assert any(has_repeat(h.split(), 2) for s in free.values() for h in s["nbest"]), "the oracle needs repeats"
    blocked = generate(data_bin, path, *LONG, "--no-repeat-ngram-size", "2")
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



@pytest.mark.parametrize("family", ["vaswani_transformer", "rnnsearch"])
def test_match_source_len_constrains_sampling(generation_models, data_bin, family):
    """fairseq's SequenceGenerator with its Sampling search and match_source_len: every sample has |S|
    words, its positional scores are the model's log-probabilities of them and the EOS, and the samples
    differ from one another (it did sample). Seeded, so the draws are the same on every run."""
    from fairseq import checkpoint_utils, search
    from fairseq.sequence_generator import SequenceGenerator

    path = generation_models[family]
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data_bin})
    task.load_dataset("test")
    dataset, d = task.dataset("test"), task.target_dictionary
    sample = dataset.collater([dataset[i] for i in range(12)])
    generator = SequenceGenerator(models, d, beam_size=3, match_source_len=True, max_len_a=1, max_len_b=5,
                                  search_strategy=search.Sampling(d))
    torch.manual_seed(3)
    with torch.no_grad():
        hypos = generator.generate(models, sample)
    distinct = 0
    for row, sentence in enumerate(hypos):
        src = sample["net_input"]["src_tokens"][row]
        words = src[src.ne(d.pad()) & src.ne(d.eos())]
        assert [len(h["tokens"]) for h in sentence] == [len(words) + 1] * 3  # |S| words and the EOS
        distinct += len({tuple(h["tokens"].tolist()) for h in sentence}) > 1
        if row < 3:
            hyp = sentence[0]
            reference = teacher_forced_log2probs(path, d.string(words), d.string(hyp["tokens"][:-1]))
            assert (hyp["positional_scores"] / math.log(2)).tolist() == pytest.approx(reference, abs=2e-4)
    assert distinct >= 3


def beam_search_by_padding_side(path, data_bin, left_pad_source):
    """{sentence id: [(tokens, score)] of beam 2} of the test set, in batches of 10 sentences of different
    lengths, with the sources padded as ``left_pad_source`` says (fairseq's dataset does the padding)."""
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data_bin, "left_pad_source": left_pad_source})
    task.load_dataset("test")
    dataset, pad = task.dataset("test"), task.source_dictionary.pad()
    generator = SequenceGenerator(models, task.target_dictionary, beam_size=2, max_len_a=1, max_len_b=5)
    found = {}
    for start in range(0, len(dataset), 10):
        sample = dataset.collater([dataset[i] for i in range(start, start + 10)])
        src = sample["net_input"]["src_tokens"]
        assert src[:, -1 if left_pad_source else 0].ne(pad).all() and src.eq(pad).any()
        with torch.no_grad():
            for sid, hypos in zip(sample["id"].tolist(), generator.generate(models, sample)):
                found[sid] = [(h["tokens"].tolist(), h["score"].item()) for h in hypos]
    return found


@pytest.mark.parametrize("family", ["vaswani_transformer", "rnnsearch", "rnnencdec", "seq2seq_lstm"])
def test_right_padded_sources_translate_as_left_padded(generation_models, data_bin, family):
    """docs/MODELS.md: any padding side. The same batches padded on the right (fairseq's left_pad_source=False;
    fairseq-generate has no flag to turn its True default off) give the same hypotheses, scores to
    float32 rounding."""
    left, right = (beam_search_by_padding_side(generation_models[family], data_bin, side) for side in (True, False))
    assert len(left) == len(right) == 30
    for sid in left:
        assert [t for t, _ in right[sid]] == [t for t, _ in left[sid]], f"{family} sentence {sid}"
        assert [s for _, s in right[sid]] == pytest.approx([s for _, s in left[sid]], abs=1e-4)
