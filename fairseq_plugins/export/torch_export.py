"""``torch.export`` of the suite's models, the route PyTorch recommends for deployment.

    encoder, step = export_model(model)          # two torch.export.ExportedProgram
    state = encoder.module()(src_tokens)         # tuple, named by state_names(model)
    log_probs, *state = step.module()(prev_token, *state)

With ``export_model(model, attention=True)`` the step returns, last, the step's attention over
the source [B, S] as ``extra["attn"]`` gives it (RNNsearch's α, the Transformer's alignment
layer averaged over heads; the families without attention return none).
The encoder program maps left-padded ``src_tokens`` [B, S] to the decoder's initial state; the
step program takes the previous target token [B, 1] and that state and returns the next
token's log-probabilities [B, V] and the new state, so any search (greedy, beam: reorder the
state rows with ``index_select``) runs outside. Batch and source length are dynamic
(``torch.export.Dim``). The recurrent encoders run as one ``scan`` over time when exported
(the eager code's Python loop and packed sequences cannot be traced for an unknown length);
each step is the eager model's own code.

Families: ``rnnsearch`` and ``rnnencdec`` (state: ``s`` and the per-sentence context
tensors), ``seq2seq_lstm`` (``h``, ``c`` per layer), ``vaswani_transformer`` (every layer's
encoder–decoder keys/values [B, 2, h, S, d_k] and self-attention keys/values so far
[B, t, 1, 2, h, d_k], t = 0 after the encoder, and the source padding mask [B, S]); for the
Transformer the target length t is dynamic too (up to ``--max-target-positions``). Every state
tensor is batch-first. The Transformer's step is the eager decoder's code on a cache handed in
without a preallocated buffer, which grows by concatenation (eagerly it is written in place);
:func:`export_encoder` exports its encoder alone.
"""
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.rnnsearch import ConditionalGRUDecoder
from fairseq_plugins.models.seq2seq_lstm import LSTMDecoder
from fairseq_plugins.models.transformer import VaswaniTransformerDecoder, VaswaniTransformerEncoder

# the incremental-state entry each decoder keeps its state in, and which of its tensors
# have a source-length dimension (dim 1: RNNsearch's annotations)
STATES = {ConditionalGRUDecoder: ("cache", {"h", "U_a_h", "padding_mask"}), LSTMDecoder: ("state", set())}
# beam search's map from hypotheses to their sentences (None outside a beam): not a program input
BEAM_ONLY = ("rows",)


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
    if isinstance(model.decoder, VaswaniTransformerDecoder):
        layers = range(len(model.decoder.layers))
        return ([f"layers.{i}.encoder_attn.kv" for i in layers] + [f"layers.{i}.self_attn.kv" for i in layers]
                + ["encoder_padding_mask"])
    _states(model.decoder)
    with torch.no_grad():
        src = _example_source(model.encoder.dictionary)
        cache = model.decoder.initial_cache(model.encoder(src))
        return [name for name in cache if name not in BEAM_ONLY]


class EncoderProgram(nn.Module):
    def __init__(self, model, names: List[str]):
        super().__init__()
        self.encoder, self.decoder, self.names = model.encoder, model.decoder, names

    def forward(self, src_tokens: Tensor) -> Tuple[Tensor, ...]:
        state = self.decoder.initial_cache(self.encoder(src_tokens))
        return tuple(state[name] for name in self.names)


class DecoderStepProgram(nn.Module):
    """One step of the eager decoder, its incremental state built from the inputs."""

    def __init__(self, model, names: List[str], attention: bool = False):
        super().__init__()
        self.decoder, self.names, self.key = model.decoder, names, _states(model.decoder)[0]
        self.attention = attention

    def forward(self, prev_token: Tensor, *state: Tensor) -> Tuple[Tensor, ...]:
        incremental_state: Dict[str, Dict[str, Tensor]] = {}
        cache = dict(zip(self.names, state))
        cache.update({name: None for name in BEAM_ONLY if isinstance(self.decoder, ConditionalGRUDecoder)})
        self.decoder.set_incremental_state(incremental_state, self.key, cache)
        logits, extra = self.decoder(prev_token, None, incremental_state=incremental_state)
        new_state = self.decoder.get_incremental_state(incremental_state, self.key)
        log_probs = F.log_softmax(logits[:, -1].float(), dim=-1)  # as fairseq's get_normalized_probs
        return (log_probs,) + tuple(new_state[name] for name in self.names) + _attention(extra, self.attention)


def _attention(extra, wanted: bool) -> Tuple[Tensor, ...]:
    """The step's attention row [B, S] when ``wanted`` and the decoder has attention."""
    attn = extra["attn"][0] if extra and extra.get("attn") else None
    return (attn[:, -1].float(),) if wanted and attn is not None else ()


def export_model(model, attention: bool = False) -> Tuple[ExportedProgram, ExportedProgram]:
    """The encoder and decoder-step programs of a model of any family (put in eval mode); with
    ``attention`` the step also returns its attention row (see the module's doc)."""
    model.eval()
    names = state_names(model)
    transformer = isinstance(model.decoder, VaswaniTransformerDecoder)
    batch = Dim("batch", min=1)
    # the Transformer's position tables bound its lengths (the step's position is t + 1)
    src_len = Dim("src_len", min=1, max=model.encoder.max_positions()) if transformer else Dim("src_len", min=1)
    src = _example_source(model.encoder.dictionary)
    programs = (TransformerEncoderProgram(model), TransformerStepProgram(model, attention)) if transformer else (
        EncoderProgram(model, names), DecoderStepProgram(model, names, attention))
    with torch.no_grad():
        encoder = torch.export.export(programs[0], (src,), dynamic_shapes=({0: batch, 1: src_len},))
        state = programs[0](src)
        prev = torch.full((src.size(0), 1), model.decoder.dictionary.eos())
        if transformer:
            for _ in range(2):  # a traced length of 0 or 1 would be specialised
                state = programs[1](prev, *state)[1:len(names) + 1]
            tgt_len = Dim("tgt_len", min=0, max=model.decoder.max_positions() - 1)
            state_shapes = tuple({0: batch, 3: src_len} if name.endswith("encoder_attn.kv") else
                                 {0: batch, 1: tgt_len} if name.endswith("self_attn.kv") else
                                 {0: batch, 1: src_len} for name in names)
        else:
            with_length = _states(model.decoder)[1]
            state_shapes = tuple({0: batch, 1: src_len} if name in with_length else {0: batch} for name in names)
        step = torch.export.export(programs[1], (prev, *state),
                                   dynamic_shapes=({0: batch}, state_shapes))  # *state: one group
    return encoder, step


class TransformerEncoderProgram(nn.Module):
    """``src_tokens`` -> the Transformer decoder's initial state (see :func:`state_names`)."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.decoder = model.encoder, model.decoder

    def forward(self, src_tokens: Tensor) -> Tuple[Tensor, ...]:
        encoder_out = self.encoder(src_tokens)["encoder_out"][0]  # [B, S, d]
        cross = [layer.encoder_attn.encoder_kv(encoder_out) for layer in self.decoder.layers]  # [B, 2, h, S, d_k]
        # no self-attention entries yet: [B, t = 0, G = 1, 2, h, d_k]
        empty = [kv.new_zeros(kv.size(0), 0, 1, kv.size(1), kv.size(2), kv.size(4)) for kv in cross]
        return (*cross, *empty, src_tokens.eq(self.encoder.padding_idx))


class TransformerStepProgram(nn.Module):
    """One step of the eager Transformer decoder, its incremental state built from the inputs."""

    def __init__(self, model, attention: bool = False):
        super().__init__()
        self.decoder, self.attention = model.decoder, attention

    def forward(self, prev_token: Tensor, *state: Tensor) -> Tuple[Tensor, ...]:
        layers = self.decoder.layers
        cross, past, padding = state[:len(layers)], state[len(layers):-1], state[-1]
        incremental_state: Dict[str, Dict[str, Tensor]] = {}
        for layer, kv, past_kv in zip(layers, cross, past):
            layer.encoder_attn.set_incremental_state(incremental_state, "static_kv", {"kv": kv})
            # no buffer: the cache grows by concatenation, which export traces for any length
            layer.self_attn.set_incremental_state(incremental_state, "self_kv", {"buf": None, "kv": past_kv})
        # the decoder reads the newest token and, from the prefix length, its position
        prefix = prev_token.expand(-1, past[0].size(1) + 1)
        logits, extra = self.decoder(prefix, {"encoder_out": [], "encoder_padding_mask": [padding]},
                                     incremental_state=incremental_state)
        log_probs = F.log_softmax(logits[:, -1].float(), dim=-1)  # as fairseq's get_normalized_probs
        new = [layer.self_attn.get_incremental_state(incremental_state, "self_kv")["kv"] for layer in layers]
        return (log_probs, *cross, *new, padding) + _attention(extra, self.attention)


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
