"""``torch.export`` of the suite's models, the route PyTorch recommends for deployment.

    encoder, step = export_model(model)          # two torch.export.ExportedProgram
    state = encoder.module()(src_tokens)         # tuple, named by state_names(model)
    log_probs, *state = step.module()(prev_token, *state)

The encoder program maps left-padded ``src_tokens`` [B, S] to the decoder's initial state; the
step program takes the previous target token [B, 1] and that state and returns the next
token's log-probabilities [B, V] and the new state, so any search (greedy, beam: reorder the
state rows with ``index_select``) runs outside. Batch and source length are dynamic
(``torch.export.Dim``). The recurrent encoders run as one ``scan`` over time when exported
(the eager code's Python loop and packed sequences cannot be traced for an unknown length);
each step is the eager model's own code.

Families: ``rnnsearch`` and ``rnnencdec`` (state: ``s`` and the per-sentence context
tensors), ``seq2seq_lstm`` (``h``, ``c`` per layer), ``vaswani_transformer`` (the encoder output
and padding mask, the self-attention keys/values of the tokens so far [B, L, 2, h, t, d_k] and
the encoder–decoder ones [B, L, 2, h, S, d_k]; the target length t is dynamic too). Every
state tensor is batch-first. :func:`export_encoder` exports the Transformer's encoder alone.
"""
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.rnnsearch import ConditionalGRUDecoder
from fairseq_plugins.models.seq2seq_lstm import LSTMDecoder
from fairseq_plugins.models.transformer import VaswaniTransformerEncoder

# the incremental-state entry each decoder keeps its state in, and which of its tensors
# have a source-length dimension (dim 1: RNNsearch's annotations)
STATES = {ConditionalGRUDecoder: ("cache", {"h", "U_a_h", "padding_mask"}), LSTMDecoder: ("state", set())}


def _example_source(dictionary, lengths=(7, 5)) -> Tensor:
    """Left-padded [B, S] tokens ending in EOS (a padded row, so padding is traced too)."""
    rows = [[dictionary.pad()] * (max(lengths) - n) + [dictionary.nspecial + i % 5 for i in range(n - 1)]
            + [dictionary.eos()] for n in lengths]
    return torch.tensor(rows)


def _states(decoder: nn.Module):
    for cls, states in STATES.items():
        if isinstance(decoder, cls):
            return states
    raise ConfigError(f"{type(decoder).__name__}: no step-wise export for this decoder "
                      f"(supported: {', '.join(c.__name__ for c in STATES)})")


def state_names(model) -> List[str]:
    """Names of the state tensors, in the order the programs take and return them."""
    if isinstance(model.encoder, VaswaniTransformerEncoder):
        return list(TRANSFORMER_STATES)
    _states(model.decoder)
    with torch.no_grad():
        src = _example_source(model.encoder.dictionary)
        return list(model.decoder.initial_cache(model.encoder(src)))


class EncoderProgram(nn.Module):
    def __init__(self, model, names: List[str]):
        super().__init__()
        self.encoder, self.decoder, self.names = model.encoder, model.decoder, names

    def forward(self, src_tokens: Tensor) -> Tuple[Tensor, ...]:
        state = self.decoder.initial_cache(self.encoder(src_tokens))
        return tuple(state[name] for name in self.names)


class DecoderStepProgram(nn.Module):
    """One step of the eager decoder, its incremental state built from the inputs."""

    def __init__(self, model, names: List[str]):
        super().__init__()
        self.decoder, self.names, self.key = model.decoder, names, _states(model.decoder)[0]

    def forward(self, prev_token: Tensor, *state: Tensor) -> Tuple[Tensor, ...]:
        incremental_state: Dict[str, Dict[str, Tensor]] = {}
        self.decoder.set_incremental_state(incremental_state, self.key, dict(zip(self.names, state)))
        logits, _ = self.decoder(prev_token, None, incremental_state=incremental_state)
        new_state = self.decoder.get_incremental_state(incremental_state, self.key)
        log_probs = F.log_softmax(logits[:, -1].float(), dim=-1)  # as fairseq's get_normalized_probs
        return (log_probs,) + tuple(new_state[name] for name in self.names)


class TransformerEncoderProgram(nn.Module):
    """``vaswani_transformer``: the encoder output, its padding mask, an empty self-attention
    cache and each decoder layer's encoder–decoder keys and values, all batch-first."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.decoder = model.encoder, model.decoder

    def forward(self, src_tokens: Tensor) -> Tuple[Tensor, ...]:
        out = self.encoder(src_tokens)
        encoder_out, padding_mask = out["encoder_out"][0], out["encoder_padding_mask"][0]
        # [K W^K, V W^V] of every layer, as the layers cache them: [B, L, 2, h, S, d_k]
        cross_kv = torch.stack([layer.encoder_attn._split(layer.encoder_attn.kv_proj(encoder_out), 2)
                                for layer in self.decoder.layers], dim=1)
        self_kv = cross_kv[:, :, :, :, :0]  # no target token yet: [B, L, 2, h, 0, d_k]
        return encoder_out, padding_mask, self_kv, cross_kv


class TransformerStepProgram(nn.Module):
    """One step of the eager decoder with its caches built from the inputs; the position is
    the self-attention cache's length."""

    def __init__(self, model):
        super().__init__()
        self.decoder = model.decoder

    def forward(self, prev_token: Tensor, encoder_out: Tensor, padding_mask: Tensor, self_kv: Tensor,
                cross_kv: Tensor) -> Tuple[Tensor, ...]:
        incremental_state: Dict[str, Dict[str, Tensor]] = {}
        for k, layer in enumerate(self.decoder.layers):
            layer.self_attn.set_incremental_state(incremental_state, "prev_kv", {"kv": self_kv[:, k]})
            layer.encoder_attn.set_incremental_state(incremental_state, "static_kv", {"kv": cross_kv[:, k]})
        # the decoder reads the prefix's length (the position) and its last token only
        prefix = prev_token.expand(-1, self_kv.size(4) + 1)
        encoder = {"encoder_out": [encoder_out], "encoder_padding_mask": [padding_mask], "src_rows": []}
        logits, _ = self.decoder(prefix, encoder, incremental_state=incremental_state)
        self_kv = torch.stack([layer.self_attn.get_incremental_state(incremental_state, "prev_kv")["kv"]
                               for layer in self.decoder.layers], dim=1)
        return F.log_softmax(logits[:, -1].float(), dim=-1), encoder_out, padding_mask, self_kv, cross_kv


TRANSFORMER_STATES = ["encoder_out", "encoder_padding_mask", "self_kv", "cross_kv"]


def _export_transformer(model) -> Tuple[ExportedProgram, ExportedProgram]:
    src = _example_source(model.encoder.dictionary)
    batch = Dim("batch", min=1)
    src_len = Dim("src_len", min=1, max=model.encoder.max_positions())
    steps = Dim("steps", min=0, max=model.decoder.max_positions() - 1)
    model.decoder.need_attn = False  # the step returns no alignment
    with torch.no_grad():
        encoder = torch.export.export(TransformerEncoderProgram(model), (src,),
                                      dynamic_shapes=({0: batch, 1: src_len},))
        state = list(TransformerEncoderProgram(model)(src))
        prev = torch.full((src.size(0), 1), model.decoder.dictionary.eos())
        for _ in range(2):  # example caches of two tokens (a size of 1 would be taken as fixed)
            _, *state = TransformerStepProgram(model)(prev, *state)
        step = torch.export.export(
            TransformerStepProgram(model), (prev, *state),
            dynamic_shapes=({0: batch}, {0: batch, 1: src_len}, {0: batch, 1: src_len},
                            {0: batch, 4: steps}, {0: batch, 4: src_len}))
    return encoder, step


def export_model(model) -> Tuple[ExportedProgram, ExportedProgram]:
    """The encoder and decoder-step programs of a model of any family (put in eval mode)."""
    model.eval()
    if isinstance(model.encoder, VaswaniTransformerEncoder):
        return _export_transformer(model)
    names = state_names(model)
    batch, src_len = Dim("batch", min=1), Dim("src_len", min=1)
    src = _example_source(model.encoder.dictionary)
    with torch.no_grad():
        encoder = torch.export.export(EncoderProgram(model, names), (src,),
                                      dynamic_shapes=({0: batch, 1: src_len},))
        state = EncoderProgram(model, names)(src)
        prev = torch.full((src.size(0), 1), model.decoder.dictionary.eos())
        with_length = _states(model.decoder)[1]
        state_shapes = tuple({0: batch, 1: src_len} if name in with_length else {0: batch} for name in names)
        step = torch.export.export(DecoderStepProgram(model, names), (prev, *state),
                                   dynamic_shapes=({0: batch}, state_shapes))  # *state: one group
    return encoder, step


class _TransformerEncoderProgram(nn.Module):
    def __init__(self, encoder: VaswaniTransformerEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, src_tokens: Tensor) -> Tuple[Tensor, Tensor]:
        out = self.encoder(src_tokens)
        return out["encoder_out"][0], out["encoder_padding_mask"][0]


def export_encoder(model) -> ExportedProgram:
    """``vaswani_transformer``'s encoder: ``src_tokens`` [B, S] -> (encoder_out [B, S, d],
    padding mask [B, S]); batch and length dynamic."""
    model.eval()
    src = _example_source(model.encoder.dictionary)
    batch, src_len = Dim("batch", min=1), Dim("src_len", min=1, max=model.encoder.max_positions())
    with torch.no_grad():
        return torch.export.export(_TransformerEncoderProgram(model.encoder), (src,),
                                   dynamic_shapes=({0: batch, 1: src_len},))
