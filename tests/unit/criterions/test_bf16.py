"""bf16 training with ``--autocast-bf16`` of the ``label_smoothed_xent`` criterion: the
forward runs under ``torch.autocast(bfloat16)``, weights, gradients and the loss stay fp32.
Training 30 updates against fp32: tests/integration/test_bf16_training.py."""
import argparse

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from helpers import USER_DIR, needs_native_bf16

import fairseq_plugins  # noqa: F401  (registers the models)
from fairseq_plugins.criterions import label_smoothed_xent
from fairseq_plugins.criterions.label_smoothed_xent import LabelSmoothedXentCriterion
from fairseq_plugins.errors import ConfigError

DICT = Dictionary()
for _w in range(30):
    DICT.add_symbol(f"w{_w}")
BUILTIN_TINY = {"encoder_layers": 1, "decoder_layers": 1, "encoder_embed_dim": 32, "decoder_embed_dim": 32,
                "encoder_ffn_embed_dim": 64, "decoder_ffn_embed_dim": 64, "encoder_attention_heads": 2,
                "decoder_attention_heads": 2}
ARCHS = {"vaswani_transformer_tiny": {}, "rnnsearch_tiny": {}, "rnnencdec_tiny": {}, "seq2seq_lstm_tiny": {},
         "transformer": BUILTIN_TINY, "lstm": {"encoder_embed_dim": 32, "decoder_embed_dim": 32,
                                               "encoder_hidden_size": 32, "decoder_hidden_size": 32,
                                               "decoder_out_embed_dim": 32, "criterion": "label_smoothed_xent"}}


class Task:
    source_dictionary = DICT
    target_dictionary = DICT


def build(arch):
    args = argparse.Namespace(arch=arch, dropout=0.0, **ARCHS[arch])
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, Task)


def batch(bsz=4, src_len=7, tgt_len=6):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(DICT.nspecial, len(DICT), (bsz, src_len), generator=g)
    src[:, -1] = DICT.eos()
    # the last sentence is 2 tokens shorter: left-padded, sorted by length, as fairseq batches
    src[-1, :2] = DICT.pad()
    target = torch.randint(DICT.nspecial, len(DICT), (bsz, tgt_len), generator=g)
    target[:, -1] = DICT.eos()
    prev = torch.cat([torch.full((bsz, 1), DICT.eos()), target[:, :-1]], dim=1)
    lengths = src.ne(DICT.pad()).sum(1)
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    return {"net_input": net_input, "target": target, "ntokens": int(target.numel())}


def linear_output_dtypes(model, criterion, sample):
    """Loss and the dtypes of every nn.Linear output and of the logits during one forward."""
    dtypes = []
    hooks = [m.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    logits = []
    hooks.append(model.register_forward_hook(lambda m, i, out: logits.append(out[0].dtype)))
    loss, _, _ = criterion(model, sample)
    for h in hooks:
        h.remove()
    return loss, set(dtypes), logits[0]


@needs_native_bf16
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_runs_in_bf16_and_weights_stay_fp32(arch):
    model, sample = build(arch).train(), batch()
    fp32_loss, fp32_linear, fp32_logits = linear_output_dtypes(
        model, LabelSmoothedXentCriterion(Task, label_smoothing=0.1), sample)
    assert fp32_linear == {torch.float32} and fp32_logits == torch.float32  # the flag is off by default

    loss, linear, logits = linear_output_dtypes(
        model, LabelSmoothedXentCriterion(Task, label_smoothing=0.1, autocast_bf16=True), sample)
    assert linear == {torch.bfloat16} and logits == torch.bfloat16  # every projection ran in bf16
    assert loss.dtype == torch.float32
    # bf16 keeps 8 significant bits (relative rounding 2^-9 per operation): the same weights
    # give the same loss to within about 1%.
    assert loss.item() == pytest.approx(fp32_loss.item(), rel=1e-2)
    loss.backward()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    """oneDNN's capability check answers False, as on most AVX2 laptops (the criterion caches its answer)."""
    label_smoothed_xent._check_native_bf16.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    yield
    monkeypatch.undo()
    label_smoothed_xent._check_native_bf16.cache_clear()


def test_autocast_bf16_is_refused_in_one_line_on_a_cpu_without_bf16(cpu_without_bf16, data_bin, tmp_path):
    """fairseq-train (its main, in this process) with --autocast-bf16 stops before the first update,
    with the suite's one-line error (a PluginError: the excepthook prints only its message), and saves nothing."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    save = tmp_path / "save"
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny", "--criterion", "label_smoothed_xent",
        "--autocast-bf16", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--max-update", "2",
        "--save-dir", str(save), "--cpu", "--no-progress-bar", "--num-workers", "0", "--disable-validation"])
    with pytest.raises(ConfigError) as refused:
        train.main(convert_namespace_to_omegaconf(args))
    assert str(refused.value) == ("--autocast-bf16: this cpu device has no native bfloat16 support; "
                                  "train in fp32 (or with --fp16 on a GPU)")
    assert not save.exists() or not list(save.iterdir())  # no checkpoint written
    # without the flag the same CPU trains: the refusal is that of --autocast-bf16 alone
    model, sample = build("vaswani_transformer_tiny"), batch()
    loss, _, _ = LabelSmoothedXentCriterion(Task, label_smoothing=0.1)(model, sample)
    assert torch.isfinite(loss)
