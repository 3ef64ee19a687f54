"""Label-smoothed cross-entropy of the Transformer paper (Vaswani et al. 2017, §5.4).

The smoothed target puts 1 - ε_ls on the reference token and spreads ε_ls uniformly over
the other V - 1 types (the distribution fairseq's ``label_smoothed_cross_entropy`` uses):

    loss = -(1 - ε) log p(y) - ε/(V-1) Σ_{v ≠ y} log p(v)

Padding positions contribute nothing. Losses are summed over the batch; fairseq divides
by ``sample_size`` (target tokens, or sentences with ``--sentence-avg``), which makes the
gradient normalisation correct across GPUs and ``--update-freq``.

``--autocast-bf16`` runs the model's forward under ``torch.autocast(bfloat16)`` on the
parameters' device (matrix products in bf16, weights and optimizer state in fp32); the loss
below is computed in fp32 either way. It serves every model, fairseq's built-ins included,
where fairseq's own ``--bf16`` needs a TPU.
"""
import functools
import math
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.hardware import native_bf16


@dataclass
class LabelSmoothedXentConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.1, metadata={"help": "epsilon_ls of the smoothed target distribution (paper: 0.1); 0 = plain NLL"}
    )
    report_accuracy: bool = field(default=False, metadata={"help": "also log token accuracy"})
    autocast_bf16: bool = field(
        default=False,
        metadata={"help": "run the model's forward under torch.autocast in bfloat16 (CPU or GPU; "
                          "weights and optimizer stay fp32); needs native bf16 support"},
    )
    sentence_avg: bool = II("optimization.sentence_avg")
    cpu: bool = II("common.cpu")


def label_smoothed_xent(lprobs, target, epsilon, padding_idx):
    """Summed smoothed loss and summed NLL over the non-padding positions.

    lprobs: (N, V) log-probabilities; target: (N,).
    """
    keep = target.ne(padding_idx)  # (N,)
    lprobs, target = lprobs[keep], target[keep]
    nll = -lprobs.gather(1, target.unsqueeze(1)).sum()
    if epsilon == 0.0:
        return nll, nll
    vocab = lprobs.size(-1)
    # -Σ_v log p(v) includes the reference; its share is added back with the (1 - ε) weight.
    smooth = -lprobs.sum()
    eps_other = epsilon / (vocab - 1)
    loss = (1.0 - epsilon - eps_other) * nll + eps_other * smooth
    return loss, nll


@functools.lru_cache(maxsize=None)
def _check_native_bf16(device_type):
    """Raise unless ``device_type`` has bf16 kernels (software emulation is slower than fp32)."""
    if device_type not in ("cpu", "cuda"):
        raise ConfigError(f"--autocast-bf16: runs on cpu or cuda devices, not on {device_type}")
    if not native_bf16(device_type):
        raise ConfigError(f"--autocast-bf16: this {device_type} device has no native bfloat16 support; "
                          "train in fp32 (or with --fp16 on a GPU)")


def bf16_autocast(device_type):
    """The autocast context of ``--autocast-bf16`` on ``device_type`` ("cpu" or "cuda")."""
    _check_native_bf16(device_type)
    return torch.autocast(device_type, dtype=torch.bfloat16)


@register_criterion("label_smoothed_xent", dataclass=LabelSmoothedXentConfig)
class LabelSmoothedXentCriterion(FairseqCriterion):
    def __init__(self, task, label_smoothing, report_accuracy=False, autocast_bf16=False, sentence_avg=False,
                 cpu=False):
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"--label-smoothing {label_smoothing}: must be in [0, 1)")
        if autocast_bf16:  # refuse before training starts (a failed first update would leave crash.pt)
            _check_native_bf16("cuda" if torch.cuda.is_available() and not cpu else "cpu")  # fairseq's Trainer's choice
        self.eps = label_smoothing
        self.report_accuracy = report_accuracy
        self.autocast_bf16 = autocast_bf16
        self.sentence_avg = sentence_avg

    def forward(self, model, sample, reduce=True):
        precision = bf16_autocast(next(model.parameters()).device.type) if self.autocast_bf16 else nullcontext()
        with precision:
            net_output = model(**sample["net_input"])
        # The model's own distribution (an adaptive softmax is not a softmax of net_output[0]);
        # fairseq's decoders take it in fp32 even when the model runs in half precision.
        lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
        lprobs = lprobs.view(-1, lprobs.size(-1))
        target = model.get_targets(sample, net_output).view(-1)
        loss, nll_loss = label_smoothed_xent(lprobs, target, self.eps, self.padding_idx)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            keep = target.ne(self.padding_idx)
            logging_output["n_correct"] = lprobs.argmax(-1).eq(target).masked_select(keep).sum().data
            logging_output["total"] = keep.sum().data
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return utils.item(sum(log.get(key, 0) for log in logging_outputs))

        loss, nll, ntokens, sample_size = total("loss"), total("nll_loss"), total("ntokens"), total("sample_size")
        # Logged in base 2, as fairseq's criteria do, so perplexities compare across tools.
        metrics.log_scalar("loss", loss / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        if total("total") > 0:
            metrics.log_scalar("n_correct", total("n_correct"))
            metrics.log_scalar("total", total("total"))
            metrics.log_derived(
                "accuracy", lambda meters: round(meters["n_correct"].sum * 100.0 / meters["total"].sum, 3)
            )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
