"""``torch.export`` of the suite's models, the route PyTorch recommends for deployment.

    encoder, step = export_model(model)          # two torch.export.ExportedProgram
    state = encoder.module()(src_tokens)         # tuple, named by state_names(model)
    log_probs, *state = step.module()(prev_token, *state)

The encoder program maps left-padded ``src_tokens`` [B, S] to the decoder's initial state; the
step program takes the previous target token [B, 1] and that state and returns the next
token's log-probabilities [B, V] and the new state (with ``export_model(model, attention=True)``,
last, the step's attention over the source [B, S] as ``extra["attn"]`` gives it: RNNsearch's α,
the Transformer's alignment layer averaged over heads; the families without attention return
none), so any search (greedy, beam: reorder the
state rows with ``index_select``) runs outside. Batch and source length are dynamic
(``torch.export.Dim``). Both programs are the eager models' own code: the recurrent encoders
run as one ``scan`` over time whenever autograd is off (``modules/recurrence.py``).

The state is the decoder's :class:`~fairseq_plugins.modules.beam_cache.BeamCache` flattened
into tensors, in the order :func:`state_names` gives: ``rnnsearch`` ``s``, ``h``, ``U_a_h``,
``padding_mask``; ``rnnencdec`` ``s``, ``c``; ``seq2seq_lstm`` ``h``, ``c`` (per layer);
``vaswani_transformer`` every layer's encoder–decoder keys and values [B, h, S, d_k]
(``layers.i.encoder_attn.k``, ``.v``), every layer's self-attention keys and values so far
[B, h, t, d_k] (``layers.i.self_attn.k``, ``.v``; t = 0 after the encoder) and the source
padding mask [B, S]. Every state tensor is batch-first. The programs run the decoder's
own ``start_cache`` and decoding step on a BeamCache in its concatenating layout (self-attention
entries grow by concatenation, which ``torch.export`` traces for any target length; eagerly they
are written in place), made by ``BeamCache.from_state`` and read by ``state()``. Which dimensions are dynamic (batch, source length, target
length, the latter two bounded by the Transformer's position tables) is found by running the
programs on examples that differ in one of them. :func:`export_encoder` exports the
Transformer's encoder alone.
"""
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.transformer import VaswaniTransformerDecoder, VaswaniTransformerEncoder
from fairseq_plugins.modules.beam_cache import BeamCache, BeamCacheDecoder, IncrementalState, put_cache

TRACED_STEPS = 2  # decoding steps before the step is traced: a traced length of 0 or 1 would be specialised


def _example_source(dictionary, lengths=(7, 5)) -> Tensor:
    """Left-padded [B, S] tokens ending in EOS (a padded row, so padding is traced too)."""
    rows = [[dictionary.pad()] * (max(lengths) - n) + [dictionary.nspecial + i % 5 for i in range(n - 1)]
            + [dictionary.eos()] for n in lengths]
    return torch.tensor(rows)


class EncoderProgram(nn.Module):
    """``src_tokens`` -> the decoder's initial state, as its ``start_cache`` makes it."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.decoder = model.encoder, model.decoder

    def forward(self, src_tokens: Tensor) -> Tuple[Tensor, ...]:
        return self.start(src_tokens).state()

    def start(self, src_tokens: Tensor) -> BeamCache:
        cache = BeamCache(src_tokens.size(0), 1, src_tokens.device, concatenate=True)
        self.decoder.start_cache(self.encoder(src_tokens), cache)
        return cache


class DecoderStepProgram(nn.Module):
    """One step of the eager decoder on the state handed in."""

    def __init__(self, model, kinds: Dict[str, str], attention: bool = False):
        super().__init__()
        self.decoder, self.kinds, self.attention = model.decoder, kinds, attention

    def forward(self, prev_token: Tensor, *state: Tensor) -> Tuple[Tensor, ...]:
        cache = BeamCache.from_state(self.kinds, state)
        incremental_state: IncrementalState = {}
        put_cache(self.decoder, incremental_state, cache)
        # the decoder reads the newest token and, from the prefix length, its position (Transformer)
        prefix = prev_token.expand(-1, cache.steps + 1)
        logits, extra = self.decoder(prefix, None, incremental_state=incremental_state)
        log_probs = F.log_softmax(logits[:, -1].float(), dim=-1)  # as fairseq's get_normalized_probs
        return (log_probs,) + cache.state() + _attention(extra, self.attention)


def _attention(extra, wanted: bool) -> Tuple[Tensor, ...]:
    """The step's attention row [B, S] when ``wanted`` and the decoder has attention."""
    attn = extra["attn"][0] if wanted and extra and extra.get("attn") else None
    return (attn[:, -1].float(),) if attn is not None else ()


def state_kinds(model) -> Dict[str, str]:
    """State name -> its BeamCache kind, in the programs' order: ``rows`` (one per hypothesis,
    changed by every step), ``sentences`` (the encoder's, the step returns them unchanged) or
    ``entries`` (self-attention keys/values, one more per step)."""
    if not isinstance(model.decoder, BeamCacheDecoder):
        raise ConfigError(f"{type(model.decoder).__name__}: no step-wise export for this decoder "
                          f"(it keeps no BeamCache)")
    with torch.no_grad():
        return dict(EncoderProgram(model).start(_example_source(model.encoder.dictionary)).kinds)


def state_names(model) -> List[str]:
    """Names of the state tensors, in the order the programs take and return them."""
    return list(state_kinds(model))


def _example_state(model, kinds, lengths, steps):
    """(prev_token, state after ``steps`` greedy steps) for sources of ``lengths``."""
    encoder, step = EncoderProgram(model), DecoderStepProgram(model, kinds)
    src = _example_source(model.encoder.dictionary, lengths)
    state = encoder(src)
    prev = torch.full((src.size(0), 1), model.decoder.dictionary.eos())
    for _ in range(steps):
        state = step(prev, *state)[1:]
    return src, prev, state


def _dynamic_shapes(model, kinds, dims: Dict[str, Dim]):
    """For each state tensor, its dimensions that change with the batch, the source length or
    the number of steps, from examples that differ in one of them."""
    base = _example_state(model, kinds, (7, 5), TRACED_STEPS)[2]
    varied = {"batch": _example_state(model, kinds, (7, 5, 6), TRACED_STEPS)[2],
              "src_len": _example_state(model, kinds, (9, 5), TRACED_STEPS)[2],
              "tgt_len": _example_state(model, kinds, (7, 5), TRACED_STEPS + 1)[2]}
    return tuple({d: dims[what] for what, other in varied.items() for d in range(t.dim()) if t.size(d) != other[i].size(d)}
                 for i, t in enumerate(base))


def export_model(model, attention: bool = False) -> Tuple[ExportedProgram, ExportedProgram]:
    """The encoder and decoder-step programs of a model of any family (put in eval mode); with
    ``attention`` the step also returns its attention row (see the module's doc)."""
    model.eval()
    kinds = state_kinds(model)
    # the Transformer's position tables bound its lengths (the step's position is t + 1)
    bounded = isinstance(model.decoder, VaswaniTransformerDecoder)
    dims = {"batch": Dim("batch", min=1),
            "src_len": Dim("src_len", min=1, max=model.encoder.max_positions()) if bounded else Dim("src_len", min=1),
            "tgt_len": Dim("tgt_len", min=0, max=model.decoder.max_positions() - 1)}
    with torch.no_grad():
        src, prev, state = _example_state(model, kinds, (7, 5), TRACED_STEPS)
        encoder = torch.export.export(EncoderProgram(model), (src,),
                                      dynamic_shapes=({0: dims["batch"], 1: dims["src_len"]},))
        step = torch.export.export(DecoderStepProgram(model, kinds, attention), (prev, *state),
                                   dynamic_shapes=({0: dims["batch"]}, _dynamic_shapes(model, kinds, dims)))
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
