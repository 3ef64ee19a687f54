"""Training oracles: the suite's models train as their independent twins train.

* ``vaswani_transformer`` against fairseq's built-in ``transformer``: ours starts from the
  built-in's *initial* weights (converted before any update), both are trained by fairseq's
  ``Trainer`` (what fairseq-train runs) on the same batches, ours with the suite's criterion,
  the built-in with fairseq's. Dropout is 0 so nothing random is left; label smoothing is on.
* ``rnnsearch`` against the paper's equations written out (tests/paper_references.py) and the
  label-smoothed loss and Adam written from their formulas, on the same initial weights.

Losses must agree at every update and the parameters after the last one. Floating-point
summation order differs (fairseq's attention vs ours, batched vs per-sentence loops), so
equality is up to a tolerance stated beside each assertion with what was measured.
"""
import copy
import math

import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

import fairseq_plugins  # noqa: F401  (registers the suite)
from fairseq_plugins.models.transformer_convert import convert_args, convert_state_dict
from helpers import USER_DIR
from paper_references import ref_attention, ref_decoder, ref_encoder_gru

UPDATES = 50
COMMON = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--cpu", "--seed", "1",
          "--num-workers", "0", "--max-tokens", "200", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
          "--lr", "0.003", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10", "--label-smoothing", "0.1",
          "--dropout", "0"]
D_MODEL = 32
TRANSFORMER_SIZES = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", str(D_MODEL),
                     "--decoder-embed-dim", str(D_MODEL), "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                     "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                     "--attention-dropout", "0", "--activation-dropout", "0"]


def fairseq_trainer(data, flags):
    """fairseq-train's Trainer, task, model and criterion, built as fairseq_cli.train builds them."""
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [data, "--user-dir", USER_DIR, *COMMON, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", combine=False, epoch=1)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion), args


def batches(trainer, count):
    """``count`` training batches in fairseq-train's order (epochs repeat as they would)."""
    out, epoch_itr = [], trainer.get_train_iterator(epoch=1)
    while len(out) < count:
        out += list(epoch_itr.next_epoch_itr(shuffle=True))
        epoch_itr = trainer.get_train_iterator(epoch=epoch_itr.epoch + 1)
    return out[:count]


def train(trainer, samples):
    """Per update, the criterion's loss per target token (natural log) as the trainer computed it."""
    losses = []
    hook = trainer.criterion.register_forward_hook(
        lambda module, inputs, output: losses.append(float(output[0]) / float(output[1])))
    for sample in samples:
        trainer.train_step([sample])
    hook.remove()
    assert len(losses) == len(samples)
    return losses


def relative_difference(ours, theirs):
    return max((a - b).abs().max().item() / b.abs().max().item() for a, b in zip(ours, theirs))


def test_vaswani_transformer_trains_as_fairseqs_transformer_from_the_same_weights(data_bin):
    sharing = "--share-all-embeddings"  # one matrix for three uses: the tied gradients are summed
    theirs, _ = fairseq_trainer(data_bin, ["--arch", "transformer", *TRANSFORMER_SIZES, sharing,
                                                    "--criterion", "label_smoothed_cross_entropy"])
    ours, _ = fairseq_trainer(data_bin, ["--arch", "vaswani_transformer", *TRANSFORMER_SIZES, sharing,
                                         "--fairseq-positions", "--criterion", "label_smoothed_xent"])
    converted = convert_args(theirs.cfg.model)  # as a checkpoint of it would be converted
    ours.model.load_state_dict(convert_state_dict(theirs.model.state_dict(), converted), strict=True)
    samples = batches(theirs, UPDATES)
    their_losses, our_losses = train(theirs, samples), train(ours, samples)

    assert their_losses[-1] < their_losses[0] - 1.0  # it learned: the comparison is not of two idle runs
    # Measured (AMD EPYC, torch 2.13, fairseq 0.12.3.1): at most 1.4e-6 apart at any update (float32
    # sums in another order), where one update changes the loss by about 1e-2 to 1e-1.
    assert max(abs(a - b) for a, b in zip(our_losses, their_losses)) < 1e-5, (our_losses, their_losses)
    final = without_key_biases(convert_state_dict(theirs.model.state_dict(), converted), D_MODEL)
    ours_final = without_key_biases(ours.model.state_dict(), D_MODEL)
    # Measured: at most 2e-5 relative after 50 updates (Adam divides by √v: parameters with tiny
    # gradients magnify round-off); a wrong gradient anywhere gives > 1e-2.
    assert relative_difference([ours_final[k] for k in final], list(final.values())) < 1e-4
    sample = samples[0]["net_input"]
    torch.testing.assert_close(log_probs(ours.model, sample), log_probs(theirs.model, sample), atol=1e-5, rtol=0)


def without_key_biases(state, d):
    """The state without the attention's key biases. Their exact gradient is zero (a bias added
    to every key adds one constant to a query's scores: softmax ignores it), so Adam turns each
    run's round-off gradient into steps of its own size: measured up to 5e-3 relative apart after
    50 updates, with no effect on any output (the test compares the outputs of the trained models)."""
    out = dict(state)
    for name, bias in state.items():
        if name.endswith("in_proj.bias"):  # [q; k; v]
            out[name] = torch.cat([bias[:d], bias[2 * d:]])
        elif name.endswith("kv_proj.bias"):  # [k; v]
            out[name] = bias[d:]
    return out


def log_probs(model, net_input):
    model.eval()
    with torch.no_grad():
        return model.get_normalized_probs(model(**net_input), log_probs=True)


# ---------------------------------------------------------------- RNNsearch: the equations, trained

RNNSEARCH = ["--arch", "rnnsearch_tiny", "--encoder-embed-dim", "8", "--decoder-embed-dim", "8",
             "--encoder-hidden-size", "8", "--decoder-hidden-size", "10", "--attention-hidden-size", "10",
             "--maxout-dim", "6", "--criterion", "label_smoothed_xent", "--lr-scheduler", "inverse_sqrt_warmup",
             "--lr", "0.01", "--max-tokens", "60"]
EPSILON, WARMUP, PEAK, BETAS, ADAM_EPS = 0.1, 10, 0.01, (0.9, 0.98), 1e-8


def ref_sentence_loss(model, src, prev, target):
    """-Σ_t Σ_v q_t(v) log p_t(v) of one sentence by Bahdanau et al.'s equations, q_t the smoothed
    target (1 - ε on y_t, ε / (V - 1) on every other word)."""
    layer, dec = model.encoder.layers[0], model.decoder
    x = model.encoder.embed_tokens.weight[src]  # Ē x_j
    h = torch.cat([ref_encoder_gru(layer, x, 0), ref_encoder_gru(layer, x, 1)], dim=1)  # [→h_j; ←h_j]
    s0 = torch.tanh(dec.W_s.weight @ h[0, layer.hidden_size:] + dec.W_s.bias)  # s_0 = tanh(W_s ←h_1)
    logits, _ = ref_decoder(dec, s0, lambda s: ref_attention(dec.context.attention, s, h), prev, False)
    log_p = torch.log_softmax(logits, dim=-1)  # [T, V]
    q = torch.full_like(log_p, EPSILON / (log_p.size(1) - 1))
    q[torch.arange(len(target)), target] = 1 - EPSILON
    return -(q * log_p).sum()


def ref_train(model, samples, pad):
    """Per update, the loss per target token; Adam (Kingma & Ba, Algorithm 1) with the rate of
    eq. 3 of Vaswani et al. at the 1-based update t, on the summed loss divided by the tokens."""
    params = [p for p in model.parameters()]
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    losses = []
    for t, sample in enumerate(samples, start=1):
        src, prev, target = (sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"],
                             sample["target"])
        loss = sum(ref_sentence_loss(model, src[b][src[b].ne(pad)], prev[b][target[b].ne(pad)],
                                     target[b][target[b].ne(pad)]) for b in range(src.size(0)))
        tokens = int(target.ne(pad).sum())
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        lr = PEAK * min(t / WARMUP, math.sqrt(WARMUP / t))
        step = lr * math.sqrt(1 - BETAS[1] ** t) / (1 - BETAS[0] ** t)
        with torch.no_grad():
            for p, g, m_p, v_p in zip(params, grads, m, v):
                if g is None:  # not in the loss: no gradient, no Adam step
                    continue
                g = g / tokens
                m_p.mul_(BETAS[0]).add_((1 - BETAS[0]) * g)
                v_p.mul_(BETAS[1]).add_((1 - BETAS[1]) * g * g)
                p.sub_(step * m_p / (v_p.sqrt() + ADAM_EPS))
        losses.append(loss.item() / tokens)
    return losses


def test_rnnsearch_trains_as_its_equations_train(data_bin):
    ours, _ = fairseq_trainer(data_bin, RNNSEARCH)
    reference = copy.deepcopy(ours.model)  # the same initial weights, read only by the equations
    samples = batches(ours, UPDATES)
    our_losses = train(ours, samples)
    ref_losses = ref_train(reference, samples, ours.task.target_dictionary.pad())

    assert ref_losses[-1] < ref_losses[0] - 0.5, ref_losses  # it learned
    # Measured: at most 1.6e-6 apart at any update (per-sentence loops vs batched products).
    assert max(abs(a - b) for a, b in zip(our_losses, ref_losses)) < 1e-5, (our_losses, ref_losses)
    our_state, ref_state = ours.model.state_dict(), reference.state_dict()
    # Measured: at most 1e-6 relative after 50 updates; a wrong gradient anywhere gives > 1e-2.
    assert relative_difference([our_state[k] for k in ref_state], list(ref_state.values())) < 1e-5
