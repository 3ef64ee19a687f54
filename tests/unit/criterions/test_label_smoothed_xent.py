"""label_smoothed_xent against fairseq's label_smoothed_cross_entropy and the formula."""
import math

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.data import Dictionary

from fairseq_plugins.criterions import label_smoothed_xent as label_smoothed_xent_module
from fairseq_plugins.criterions.label_smoothed_xent import LabelSmoothedXentCriterion, label_smoothed_xent
from fairseq_plugins.errors import ConfigError


class Task:
    def __init__(self, dictionary):
        self.target_dictionary = dictionary


class FixedLogits(torch.nn.Module):
    """A 'model' that returns given logits, so both criteria see the same numbers."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, **net_input):
        return self.logits, None

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return (torch.log_softmax if log_probs else torch.softmax)(net_output[0].float(), dim=-1)

    def get_targets(self, sample, net_output):
        return sample["target"]


def make_batch(vocab=13, bsz=3, tgt_len=5, seed=0):
    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    target[0, -2:] = d.pad()  # right-padded targets, as fairseq batches them
    target[2, -1:] = d.pad()
    logits = torch.randn(bsz, tgt_len, len(d), generator=g, requires_grad=True)
    ntokens = int(target.ne(d.pad()).sum())
    sample = {"net_input": {}, "target": target, "ntokens": ntokens}
    return d, logits, sample


@pytest.mark.parametrize("sentence_avg", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_equals_fairseq_builtin(eps, sentence_avg):
    d, logits, sample = make_batch(tgt_len=6)  # 3 sentences of 6 positions: sizes not to be mixed up
    ours = LabelSmoothedXentCriterion(Task(d), label_smoothing=eps, sentence_avg=sentence_avg)
    theirs = LabelSmoothedCrossEntropyCriterion(Task(d), sentence_avg=sentence_avg, label_smoothing=eps)
    loss, size, log = ours(FixedLogits(logits), sample)
    ref_loss, ref_size, ref_log = theirs(FixedLogits(logits), sample)
    assert size == ref_size == (3 if sentence_avg else sample["ntokens"])
    for key in ("ntokens", "nsentences", "sample_size"):
        assert log[key] == ref_log[key], key
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(log["nll_loss"], ref_log["nll_loss"], rtol=1e-6, atol=1e-5)
    # Gradients too: they are what training sees.
    (g_ours,) = torch.autograd.grad(loss, logits)
    (g_ref,) = torch.autograd.grad(ref_loss, logits)
    torch.testing.assert_close(g_ours, g_ref)


def test_formula_and_padding():
    d, logits, sample = make_batch(seed=1)
    eps = 0.1
    loss, _, log = LabelSmoothedXentCriterion(Task(d), label_smoothing=eps)(FixedLogits(logits), sample)
    lprobs = torch.log_softmax(logits.detach(), -1)
    vocab = lprobs.size(-1)
    expected_loss, expected_nll = 0.0, 0.0
    for b in range(sample["target"].size(0)):
        for t in range(sample["target"].size(1)):
            y = int(sample["target"][b, t])
            if y == d.pad():
                continue
            q = torch.full((vocab,), eps / (vocab - 1))
            q[y] = 1 - eps
            expected_loss += float(-(q * lprobs[b, t]).sum())
            expected_nll += float(-lprobs[b, t, y])
    assert math.isclose(float(loss), expected_loss, rel_tol=1e-5)
    assert math.isclose(float(log["nll_loss"]), expected_nll, rel_tol=1e-5)


def test_sums_over_batch_split():
    """Two halves of a batch sum to the whole, so fairseq's normalisation by sample_size is exact."""
    d, logits, sample = make_batch(bsz=4, seed=2)
    crit = LabelSmoothedXentCriterion(Task(d), label_smoothing=0.1)
    whole, n_whole, _ = crit(FixedLogits(logits), sample)
    parts, n_parts = 0.0, 0
    for rows in (slice(0, 1), slice(1, 4)):
        target = sample["target"][rows]
        part = {"net_input": {}, "target": target, "ntokens": int(target.ne(d.pad()).sum())}
        loss, n, _ = crit(FixedLogits(logits[rows]), part)
        parts, n_parts = parts + loss, n_parts + n
    torch.testing.assert_close(whole, parts)
    assert n_whole == n_parts


@pytest.mark.parametrize("eps", [1.5, 1.0, -0.1])
def test_bad_epsilon_is_a_config_error(eps):
    d, _, _ = make_batch()
    with pytest.raises(ConfigError, match=rf"^--label-smoothing {eps}: must be in \[0, 1\)$"):
        LabelSmoothedXentCriterion(Task(d), label_smoothing=eps)


class Tempered(FixedLogits):
    """A model whose distribution is not the softmax of its output (as with an adaptive softmax)."""

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return torch.log_softmax(net_output[0].float() / 2, dim=-1)


def test_loss_uses_the_models_own_distribution():
    d, logits, sample = make_batch()
    loss, _, log = LabelSmoothedXentCriterion(Task(d), label_smoothing=0.0)(Tempered(logits), sample)
    target = sample["target"].view(-1)
    keep = target.ne(d.pad())
    lprobs = torch.log_softmax(logits.detach().view(-1, len(d)) / 2, dim=-1)
    expected = -lprobs[keep].gather(1, target[keep].unsqueeze(1)).sum()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-6, atol=1e-5)
    plain = -torch.log_softmax(logits.detach().view(-1, len(d)), -1)[keep].gather(1, target[keep].unsqueeze(1)).sum()
    assert not torch.isclose(loss.detach(), plain)  # the softmax of the logits would give another loss


@pytest.mark.parametrize("arch", ["vaswani_transformer_tiny", "rnnsearch_tiny", "rnnencdec_tiny", "seq2seq_lstm_tiny",
                                  "transformer", "lstm"])
def test_loss_of_suite_and_builtin_models_is_that_of_the_log_softmax_of_their_logits(arch):
    """What the criterion computed before it asked the model: the same numbers, bit for bit."""
    from test_bf16 import DICT, batch, build
    from test_bf16 import Task as ModelTask

    model, sample = build(arch).eval(), batch()
    loss, _, log = LabelSmoothedXentCriterion(ModelTask, label_smoothing=0.1)(model, sample)
    logits = model(**sample["net_input"])[0].float()
    lprobs = torch.log_softmax(logits, dim=-1).view(-1, logits.size(-1))
    ref_loss, ref_nll = label_smoothed_xent(lprobs, sample["target"].view(-1), 0.1, DICT.pad())
    assert torch.equal(loss, ref_loss) and torch.equal(log["nll_loss"], ref_nll)


def test_logged_metrics_equal_fairseqs_over_two_workers():
    """What fairseq-train prints (loss and nll_loss in base 2, ppl, accuracy), reduced from two batches' logging
    outputs as from two workers: fairseq's label_smoothed_cross_entropy, given its own outputs, is the oracle."""
    from fairseq import metrics

    def reduced(criterion_class, outputs):
        with metrics.aggregate(new_root=True) as agg:
            criterion_class.reduce_metrics(outputs)
            return agg.get_smoothed_values()

    for accuracy in (True, False):  # without --report-accuracy, no accuracy columns (nor a division by 0)
        ours_out, theirs_out = [], []
        for seed in (3, 4):
            d, logits, sample = make_batch(seed=seed)
            ours_out.append(LabelSmoothedXentCriterion(Task(d), 0.1, report_accuracy=accuracy)(
                FixedLogits(logits), sample)[2])
            theirs_out.append(LabelSmoothedCrossEntropyCriterion(Task(d), sentence_avg=False, label_smoothing=0.1,
                                                                 report_accuracy=accuracy)(FixedLogits(logits), sample)[2])
        ours = reduced(LabelSmoothedXentCriterion, ours_out)
        theirs = reduced(LabelSmoothedCrossEntropyCriterion, theirs_out)
        assert ours.keys() == theirs.keys() and ("accuracy" in theirs) == accuracy, (accuracy, ours.keys())
        assert theirs["nll_loss"] > 0 and (not accuracy or 0 < theirs["accuracy"] < 100)  # not degenerate
        for key in theirs:
            assert ours[key] == theirs[key], key  # as printed: rounded alike (loss, nll_loss to 3 decimals)
    # one target token in all, predicted right: accuracy 100 (a count of 1 is a count)
    one = {"loss": torch.tensor(0.5), "nll_loss": torch.tensor(0.4), "ntokens": 1, "nsentences": 1,
           "sample_size": 1, "n_correct": torch.tensor(1), "total": torch.tensor(1)}
    ours, theirs = reduced(LabelSmoothedXentCriterion, [one]), reduced(LabelSmoothedCrossEntropyCriterion, [one])
    assert dict(ours) == dict(theirs) and ours["accuracy"] == 100.0


def test_autocast_bf16_on_another_device_is_one_line():
    with pytest.raises(ConfigError, match=r"^--autocast-bf16: runs on cpu or cuda devices, not on mps$"):
        label_smoothed_xent_module._check_native_bf16("mps")


def test_no_smoothing_is_the_nll_even_where_the_model_gives_a_word_probability_zero():
    """ε = 0 is plain NLL: a word the model rules out (log p = -inf, e.g. a masked output) must not
    turn the loss into NaN through 0 · (-inf) in the smoothing term."""
    lprobs = torch.log_softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    lprobs[:, 5] = float("-inf")  # never a target below
    target = torch.tensor([1, 2, 0, 3])
    loss, nll = label_smoothed_xent(lprobs, target, 0.0, padding_idx=0)
    expected = -(lprobs[0, 1] + lprobs[1, 2] + lprobs[3, 3])  # row 2's target is padding (0): left out
    assert torch.equal(loss, nll) and torch.isclose(nll, expected)


@pytest.mark.parametrize("gpu, cpu_flag, asked", [(False, False, "oneDNN"), (True, True, "oneDNN"),
                                                   (True, False, "CUDA")])
def test_native_bf16_is_asked_of_the_training_devices_own_backend(monkeypatch, gpu, cpu_flag, asked):
    """--autocast-bf16's check at build time: oneDNN answers for a CPU, CUDA (native, not emulated)
    for a GPU, each faked to say yes while the other says no; the device is fairseq's Trainer's
    (a GPU if there is one and not --cpu), so a CPU with bf16 is never refused for a missing GPU."""
    label_smoothed_xent_module._check_native_bf16.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: asked == "oneDNN")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True:
                        asked == "CUDA" and not including_emulation)
    d, _, _ = make_batch()
    try:
        LabelSmoothedXentCriterion(Task(d), 0.1, autocast_bf16=True, cpu=cpu_flag)  # no ConfigError
    finally:
        label_smoothed_xent_module._check_native_bf16.cache_clear()


def test_defaults_are_fairseqs_but_the_papers_smoothing():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig

    ours, theirs = label_smoothed_xent_module.LabelSmoothedXentConfig(), LabelSmoothedCrossEntropyCriterionConfig()
    assert ours.report_accuracy == theirs.report_accuracy and ours.label_smoothing == 0.1
