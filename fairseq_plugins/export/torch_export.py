"""``torch.export`` of the suite's models, the route PyTorch recommends for deployment.

    encoder, step = export_model(model)          # two torch.export.ExportedProgram
    state = encoder.module()(src_tokens)         # tuple, named by state_names(model)
    log_probs, *state = step.module()(prev_token, *state)

The encoder program maps left-padded ``src_tokens`` [B, S] to the decoder's initial state; the
step program takes each hypothesis's previous target token, beam-major [R, G], and that state,
and returns the next token's log-probabilities [R·G, V] and the new state (with
``export_model(model, attention=True)``, last, the step's attention over the source [R·G, S] as
``extra["attn"]`` gives it: RNNsearch's α, the Transformer's alignment layer averaged over heads;
the families without attention return none), so any search (greedy, beam) runs outside. Batch,
beam size, source and target lengths are dynamic (``torch.export.Dim``). Both programs are the
eager models' own code: the recurrent encoders run as one ``scan`` over time whenever autograd
is off (``modules/recurrence.py``).

The state is the decoder's :class:`~fairseq_plugins.modules.beam_cache.BeamCache` in its
concatenating layout, flattened into tensors in the order :func:`state_names` gives, R beams of
G hypotheses (G = 1 after the encoder): ``rnnsearch`` ``s`` [R, G, n], ``h``, ``U_a_h``,
``padding_mask`` (per sentence, [R, ...]); ``rnnencdec`` ``s``, ``c``; ``seq2seq_lstm`` ``h``,
``c`` (per layer); ``vaswani_transformer`` every layer's encoder–decoder keys and values
[R, h, S, d_k] (``layers.i.encoder_attn.k``, ``.v``), every layer's self-attention keys and
values so far [R, h, t, G, d_k] (``layers.i.self_attn.k``, ``.v``; step j's entry of a beam's
hypothesis g at [:, :, j, g]; t = 0 after the encoder) and the source padding mask [R, S]; last,
for every family, ``slots`` [R, G, t], the hypothesis (within its beam) whose entry at each step
each hypothesis reads. A search outside, like the ONNX runtime (``fairseq_plugins_onnx.py``):

- after the first step, :func:`expand_beams` makes G copies of every sentence's hypothesis;
- after each step, row g of a beam continuing row p: the ``rows`` tensors (per hypothesis) and
  ``slots`` take row p (``index_select`` on the flattened R·G rows), nothing else moves;
- when sentences finish, every tensor keeps the beams that go on (``index_select`` of dim 0).

The programs run the decoder's own ``start_cache`` and decoding step on a BeamCache made by
``BeamCache.from_state`` and read by ``state()``; its self-attention entries grow by
concatenation, which ``torch.export`` traces for any target length. Which dimensions are dynamic
is found by running the programs on examples that differ in one of them. :func:`export_encoder`
exports the Transformer's encoder alone.
"""
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.transformer import VaswaniTransformerDecoder, VaswaniTransformerEncoder
from fairseq_plugins.modules.beam_cache import (
    PER_BEAM,
    PER_HYPOTHESIS,
    SELF_ATTENTION,
    BeamCache,
    BeamCacheDecoder,
    IncrementalState,
    put_cache,
)

TRACED_STEPS = 2  # decoding steps before the step is traced: a traced length of 0 or 1 would be specialised
TRACED_BEAM = 3  # and the beam size it is traced with (1 would be specialised; 2 is the batch's size)
SLOTS = "slots"  # the last state tensor's name
# the exported state's kinds, as the folders' interface (version 2) names a BeamCache's
STATE_KINDS = {PER_HYPOTHESIS: "rows", PER_BEAM: "sentences", SELF_ATTENTION: "entries"}


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
        """``kinds``: as :func:`state_kinds` gives them."""
        super().__init__()
        cache_kind = {exported: kind for kind, exported in STATE_KINDS.items()}
        self.decoder, self.attention = model.decoder, attention
        self.kinds = {name: cache_kind[kind] for name, kind in kinds.items()}  # the BeamCache's

    def forward(self, prev_token: Tensor, *state: Tensor) -> Tuple[Tensor, ...]:
        """prev_token [R, G]; ``state`` as :meth:`BeamCache.state` gives it."""
        cache = BeamCache.from_state(self.kinds, state)
        incremental_state: IncrementalState = {}
        put_cache(self.decoder, incremental_state, cache)
        # the decoder reads the newest token and, from the prefix length, its position (Transformer)
        prefix = prev_token.reshape(-1, 1).expand(-1, cache.steps + 1)
        logits, extra = self.decoder(prefix, None, incremental_state=incremental_state)
        log_probs = F.log_softmax(logits[:, -1].float(), dim=-1)  # as fairseq's get_normalized_probs
        return (log_probs,) + cache.state() + _attention(extra, self.attention)


def _attention(extra, wanted: bool) -> Tuple[Tensor, ...]:
    """The step's attention row [B, S] when ``wanted`` and the decoder has attention."""
    attn = extra["attn"][0] if wanted and extra and extra.get("attn") else None
    return (attn[:, -1].float(),) if attn is not None else ()


def state_kinds(model) -> Dict[str, str]:
    """State name -> its kind, in the programs' order: ``rows`` (the BeamCache's per hypothesis,
    changed by every step), ``sentences`` (per beam: the encoder's, the step returns them
    unchanged) or ``entries`` (self-attention keys/values, one more per step)."""
    if not isinstance(model.decoder, BeamCacheDecoder):
        raise ConfigError(f"{type(model.decoder).__name__}: no step-wise export for this decoder "
                          f"(it keeps no BeamCache)")
    with torch.no_grad():
        kinds = EncoderProgram(model).start(_example_source(model.encoder.dictionary)).kinds
    return {name: STATE_KINDS[kind] for name, kind in kinds.items()}


def state_names(model) -> List[str]:
    """Names of the state tensors, in the order the programs take and return them."""
    return [*state_kinds(model), SLOTS]


def expand_beams(kinds: Dict[str, str], state: Sequence[Tensor], beam: int) -> Tuple[Tensor, ...]:
    """A state of one hypothesis per beam (G = 1) as beams of ``beam`` copies of it: the ``rows``,
    ``entries`` and ``slots`` repeated along their G axis."""
    axes = [{"rows": 1, "entries": 3}.get(kind) for kind in kinds.values()] + [1]  # slots: [R, G, t]
    return tuple(t if axis is None else t.repeat_interleave(beam, dim=axis) for t, axis in zip(state, axes))


def _example_state(model, kinds, lengths, steps, beam=TRACED_BEAM):
    """(src_tokens, prev_token, state after ``steps`` greedy steps: the first with one hypothesis
    per sentence, the others with ``beam``) for sources of ``lengths``."""
    encoder, step = EncoderProgram(model), DecoderStepProgram(model, kinds)
    src = _example_source(model.encoder.dictionary, lengths)
    state = encoder(src)
    for t in range(steps):
        if t == 1:
            state = expand_beams(kinds, state, beam)
        state = step(_example_prev(model, state), *state)[1:]
    return src, _example_prev(model, state), state


def _example_prev(model, state) -> Tensor:
    return torch.full(state[-1].shape[:2], model.decoder.dictionary.eos())  # [R, G]


def _dynamic_shapes(model, kinds, dims: Dict[str, Dim], beam: int):
    """For each state tensor, its dimensions that change with the batch, the beam size (if in
    ``dims``), the source length or the number of steps, from examples that differ in one of them."""
    base = _example_state(model, kinds, (7, 5), TRACED_STEPS, beam)[2]
    varied = {"batch": _example_state(model, kinds, (7, 5, 6), TRACED_STEPS, beam)[2],
              "src_len": _example_state(model, kinds, (9, 5), TRACED_STEPS, beam)[2],
              "tgt_len": _example_state(model, kinds, (7, 5), TRACED_STEPS + 1, beam)[2]}
    if "beam" in dims:
        varied["beam"] = _example_state(model, kinds, (7, 5), TRACED_STEPS, beam + 1)[2]
    return tuple({d: dims[what] for what, other in varied.items() for d in range(t.dim()) if t.size(d) != other[i].size(d)}
                 for i, t in enumerate(base))


def export_model(model, attention: bool = False, beams: bool = False) -> Tuple[ExportedProgram, ExportedProgram]:
    """The encoder and decoder-step programs of a model of any family (put in eval mode); with
    ``attention`` the step also returns its attention row; with ``beams`` its beam size G is
    dynamic, otherwise 1 (see the module's doc)."""
    model.eval()
    kinds = state_kinds(model)
    # the Transformer's position tables bound its lengths (the step's position is t + 1)
    bounded = isinstance(model.decoder, VaswaniTransformerDecoder)
    dims = {"batch": Dim("batch", min=1),
            "src_len": Dim("src_len", min=1, max=model.encoder.max_positions()) if bounded else Dim("src_len", min=1),
            "tgt_len": Dim("tgt_len", min=0, max=model.decoder.max_positions() - 1)}
    if beams:
        dims["beam"] = Dim("beam", min=1)
    beam = TRACED_BEAM if beams else 1
    with torch.no_grad():
        src, prev, state = _example_state(model, kinds, (7, 5), TRACED_STEPS, beam)
        encoder = torch.export.export(EncoderProgram(model), (src,),
                                      dynamic_shapes=({0: dims["batch"], 1: dims["src_len"]},))
        # with R and G both dynamic, torch's view rules check sizes of 1 (R·G = R?), which it
        # traced as above 1: those checks run with the program, not when exporting
        step = torch.export.export(DecoderStepProgram(model, kinds, attention), (prev, *state),
                                   dynamic_shapes=({0: dims["batch"], 1: dims.get("beam")},
                                                   _dynamic_shapes(model, kinds, dims, beam)),
                                   prefer_deferred_runtime_asserts_over_guards=beams)
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
