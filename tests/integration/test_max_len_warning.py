"""Issue 18's guard: fairseq-generate says when most hypotheses stopped at the length limit
instead of at end of sentence, and the RNN models' log names their initialisation."""
import os

import pytest
import torch
from helpers import USER_DIR, generate_in_process, parse_generation, run, train

from fairseq_plugins.checkpoints import load_state, save_state

pytestmark = pytest.mark.slow

LIMIT = 7  # --max-len-b, with --max-len-a 0: every hypothesis may have at most 7 tokens + EOS


@pytest.fixture(scope="module")
def checkpoints(data_bin, tmp_path_factory):
    """rnnsearch_tiny after one update (default init), and two edits of it: the EOS logit
    pushed to -1e4 (never ends a sentence) or +1e4 (ends every sentence at once)."""
    save_dir = tmp_path_factory.mktemp("guard")
    log = train(data_bin, save_dir, ["--arch", "rnnsearch_tiny"], 1, extra=["--no-epoch-checkpoints"])
    assert "rnnsearch_tiny: initialisation pytorch (the paper's is --init paper)" in log
    state = load_state(os.path.join(save_dir, "checkpoint_last.pt"))
    eos = 2  # fairseq's Dictionary: <s>=0, <pad>=1, </s>=2
    paths = {}
    for name, bias in (("never_stops", -1e4), ("stops", 1e4)):
        weights = dict(state["model"])
        weights["decoder.W_o.bias"] = weights["decoder.W_o.bias"].clone()
        weights["decoder.W_o.bias"][eos] = bias
        paths[name] = os.path.join(save_dir, f"{name}.pt")
        save_state(dict(state, model=weights), paths[name])
    return paths


def generate(data_bin, checkpoint, *extra):
    return run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "4",
                "--batch-size", "8", "--max-len-b", LIMIT, "--cpu", "--num-workers", "0", *extra])


def hypotheses(out):
    return [line.split("\t")[2].split() for line in out.splitlines() if line.startswith("H-")]


@pytest.mark.parametrize("extra", [[], ["--print-alignment"], ["--task", "translation_wu", "--wu-lenpen", "0.6"]])
def test_a_model_that_never_ends_a_sentence_gets_one_warning(checkpoints, data_bin, extra):
    out = generate(data_bin, checkpoints["never_stops"], *extra)
    hypos = hypotheses(out)
    assert hypos and all(len(h) == LIMIT for h in hypos)  # the oracle: every output is cut at the limit
    warnings = [line for line in out.splitlines() if "stopped at the maximum length" in line]
    assert len(warnings) == 1, out[-3000:]
    assert warnings[0].endswith(
        f"{len(hypos)} of {len(hypos)} hypotheses (100%) stopped at the maximum length (--max-len-a 0 x source "
        f"length + --max-len-b {LIMIT}), not at end of sentence: the model has not learned to stop (train longer) "
        "or the limit is too small")


def test_a_model_that_ends_its_sentences_gets_no_warning(checkpoints, data_bin):
    out = generate(data_bin, checkpoints["stops"])
    hypos = hypotheses(out)
    assert hypos and all(len(h) < LIMIT for h in hypos)
    assert "maximum length" not in out


def test_the_limit_of_the_warning_grows_with_max_len_a(checkpoints, data_bin):
    """With --max-len-a 1 the limit grows with each batch's padded source length (fairseq's
    formula); the never-stopping model still reaches it every time, and the count follows."""
    out = generate(data_bin, checkpoints["never_stops"], "--max-len-a", "1", "--beam", "1")
    lengths = {len(h) for h in hypotheses(out)}
    assert min(lengths) > LIMIT  # the limit grew with the source length
    assert sum("stopped at the maximum length (--max-len-a 1 x source length" in line for line in out.splitlines()) == 1


def test_the_warning_counts_only_sentences_cut_at_the_limit(generation_models, data_bin, tmp_path, caplog):
    """The briefly trained RNNsearch (tests/conftest.py) ends some sentences and runs others to the
    limit: the warning's "N of M" is the number of best hypotheses with exactly --max-len-b words
    (EOS forced there), counted here from the printed H- lines; below half there is no warning."""
    seen = {}
    for limit in (6, 8):
        caplog.clear()
        out = generate_in_process(tmp_path / str(limit), data_bin, generation_models["rnnsearch"],
                                  "--max-len-a", "0", "--max-len-b", limit, beam=4)
        best = [lines["H"][1].split() for lines in parse_generation(out).values()]
        assert len(best) == 30 and max(map(len, best)) <= limit
        cut = sum(len(words) == limit for words in best)
        seen[limit] = cut
        warnings = [r.getMessage() for r in caplog.records if "stopped at the maximum length" in r.getMessage()]
        if cut * 2 > len(best):
            assert warnings == [f"{cut} of 30 hypotheses ({100 * cut / 30:.0f}%) stopped at the maximum length "
                                f"(--max-len-a 0 x source length + --max-len-b {limit}), not at end of sentence: "
                                "the model has not learned to stop (train longer) or the limit is too small"]
        else:
            assert warnings == []
    # the oracle needs both cases (measured: 23 and 8 of 30), each a mixed batch
    assert 15 < seen[6] < 30 and 0 < seen[8] <= 15, seen
