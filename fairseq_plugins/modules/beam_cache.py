"""One decoding cache for every family: :class:`BeamCache` (design: docs/DECODING.md).

fairseq decodes N rows (hypotheses) step by step and, between steps, calls
``reorder_incremental_state(state, new_order)``: row n then continues old row ``new_order[n]``,
for any ``new_order`` (rows of other sentences, repeated, dropped). Beam search's orders have a
shape worth exploiting: its first ``reorder_encoder_out`` repeats every sentence G times
consecutively, and later orders move hypotheses within their beam and drop finished beams.

A BeamCache holds three kinds of tensors, each by name:

- ``rows``: one row per hypothesis, [N, ...] (a recurrent state);
- ``sentences``: one row per beam of G hypotheses, [N / G, ...] (encoder keys/values,
  annotations, ``U_a h_j``, masks): computed and read once per sentence, never copied by a
  reorder within beams;
- ``entries``: self-attention keys or values written step by step, [h, d_k] per hypothesis and
  step, kept heads first, [N / G, h, capacity, G, d_k]: step j's entry stays in the slot (0..G-1)
  of the hypothesis that wrote it; ``slots`` [N / G, G, t] says which slot holds each
  hypothesis's ancestor at each step, and :meth:`begin_step` turns it into the additive
  attention mask that makes every hypothesis read its own history.

G (``beam``) is set once, when the cache is made, from the encoder output's first reorder
(:func:`reorder_encoder_out` records it). :meth:`reorder` takes the fast path for orders within
beams (the rows and ``slots`` follow the order; ``sentences`` and ``entries`` move only when
beams finish) and a general ``index_select`` path for any other order, after which the cache
has one row per hypothesis (G = 1) for good. Neither path raises or asserts on the device;
choosing between them reads one flag on the host, in the reorder, never in a decoder step.

fairseq keeps the cache as one entry of its ``incremental_state``; :class:`BeamCacheDecoder`
makes it at a decoding's first step and reorders it.
"""
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor

EncoderOut = Dict[str, List[Tensor]]
BEAM = "beam"  # the encoder output's record of G: a [N, G] tensor (values unused), reordered with the rest
CACHE = "beam_cache"  # the decoder's one incremental-state entry
INITIAL_CAPACITY = 16  # decoding steps an entries buffer holds before it first doubles
KINDS = ("rows", "sentences", "entries")


def reorder_encoder_out(encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
    """fairseq's contract for batch-first encoder outputs: row n of every returned tensor is row
    ``new_order[n]``. The first reorder of a fresh output also records G: the number of times
    each row is repeated when ``new_order`` is beam search's expansion (each row G times,
    consecutively; checked once per decoding), else 1. Later reorders record 1: their rows need
    not be beams any more (a cache made before them already knows its G)."""
    reordered = {key: [t.index_select(0, new_order) for t in tensors]
                 for key, tensors in encoder_out.items() if key != BEAM}
    group = 1
    if BEAM not in encoder_out:
        rows = _num_rows(encoder_out)
        if rows and new_order.numel() % rows == 0 and new_order.numel() > rows:
            expansion = torch.arange(rows, device=new_order.device).repeat_interleave(new_order.numel() // rows)
            group = new_order.numel() // rows if torch.equal(new_order, expansion) else 1
    reordered[BEAM] = [torch.zeros(new_order.numel(), group, dtype=torch.uint8, device=new_order.device)]
    return reordered


def _num_rows(encoder_out: EncoderOut) -> int:
    return next((t.size(0) for tensors in encoder_out.values() for t in tensors), 0)


def get_cache(decoder, incremental_state) -> Optional["BeamCache"]:
    return decoder.get_incremental_state(incremental_state, CACHE)


def put_cache(decoder, incremental_state, cache: "BeamCache") -> None:
    decoder.set_incremental_state(incremental_state, CACHE, cache)


class BeamCache:
    """The decoding state of one decoder for N hypotheses in beams of G (see the module doc)."""

    def __init__(self, rows: int, beam: int = 1, device: Optional[torch.device] = None):
        self.beam = beam  # G
        self.tensors: Dict[str, Tensor] = {}
        self.kinds: Dict[str, str] = {}  # name -> one of KINDS; insertion order is the state's order
        self.slots = torch.empty(rows // beam, beam, 0, dtype=torch.long, device=device)  # [N / G, G, t]
        self.self_attn_mask: Optional[Tensor] = None  # this step's, from begin_step
        self._steps = 0

    @classmethod
    def for_encoder_out(cls, encoder_out: EncoderOut) -> "BeamCache":
        """An empty cache for the rows of ``encoder_out``, in beams of the G its first reorder recorded."""
        rows = _num_rows({k: v for k, v in encoder_out.items() if k != BEAM})
        beam = encoder_out[BEAM][0].size(1) if encoder_out.get(BEAM) else 1
        device = next(t.device for tensors in encoder_out.values() for t in tensors)
        return cls(rows, beam, device)

    @property
    def steps(self) -> int:
        """Self-attention entries written so far per hypothesis."""
        return self._steps

    # ------------------------------------------------------------------ filling and reading

    def per_sentence(self, encoder_out: EncoderOut) -> EncoderOut:
        """``encoder_out``'s rows standing for their beams (every G-th; all of them for G = 1):
        what ``sentences`` tensors are computed from."""
        if self.beam == 1:
            return encoder_out
        return {key: [t[::self.beam] for t in tensors] for key, tensors in encoder_out.items()}

    def put(self, kind: str, name: str, tensor: Tensor) -> None:
        """Stores ``tensor`` as ``rows`` [N, ...] or ``sentences`` [N / G, ...]."""
        self.tensors[name], self.kinds[name] = tensor, kind

    def get(self, name: str) -> Tensor:
        """A stored tensor; for ``entries`` those written so far, as attention reads them:
        [N / G, h, t·G, d_k], step-major and slot-minor along t·G."""
        tensor = self.tensors[name]
        if self.kinds[name] == "entries":
            beams, heads, _, group, d_k = tensor.shape
            return tensor[:, :, :self._steps].reshape(beams, heads, self._steps * group, d_k)
        return tensor

    def names(self, kind: Optional[str] = None) -> List[str]:
        return [name for name, k in self.kinds.items() if kind is None or k == kind]

    def reserve(self, name: str, heads: int, d_k: int, like: Tensor) -> None:
        """Room for self-attention keys or values of ``heads`` × ``d_k`` per hypothesis and step."""
        self.kinds[name] = "entries"
        self.tensors[name] = like.new_empty(self.slots.size(0), heads, INITIAL_CAPACITY, self.beam, d_k)

    def begin_step(self) -> Optional[Tensor]:
        """Advances the bookkeeping by one step, in which every hypothesis writes its own slot.
        Sets and returns ``self_attn_mask``: additive [N / G, 1, G, (t+1)·G], 0 where a hypothesis
        reads an entry (its ancestors' and its own), -inf elsewhere; None for G = 1."""
        self._steps += 1
        if self.beam == 1:
            self.self_attn_mask = None
            return None
        beams, group = self.slots.size(0), self.beam
        own = torch.arange(group, device=self.slots.device)
        self.slots = torch.cat([self.slots, own.view(1, group, 1).expand(beams, group, 1)], dim=2)
        reads = (self.slots.unsqueeze(3) == own).view(beams, 1, group, self._steps * group)
        self.self_attn_mask = torch.zeros(reads.shape, device=reads.device).masked_fill_(~reads, float("-inf"))
        return self.self_attn_mask

    def append(self, name: str, new: Tensor) -> Tensor:
        """Writes this step's entries ``new`` [N, h, d_k] (after :meth:`begin_step`) and returns
        all entries so far as :meth:`get` does. The buffer doubles when full (amortised O(1))."""
        buf, t = self.tensors[name], self._steps - 1
        beams, heads, capacity, group, d_k = buf.shape
        if t == capacity:
            bigger = buf.new_empty(beams, heads, 2 * capacity, group, d_k)
            bigger[:, :, :t] = buf
            self.tensors[name] = buf = bigger
        buf[:, :, t] = new.view(beams, group, heads, d_k).transpose(1, 2)
        return self.get(name)

    # ------------------------------------------------------------------ fairseq's reorder

    def reorder(self, new_order: Tensor) -> None:
        """Row n continues old row ``new_order[n]``, for any ``new_order``."""
        shared = [name for name, kind in self.kinds.items() if kind != "rows"]
        if self.beam == 1 or not shared:
            self._select_all(new_order)
            return
        within, moved = self._beam_pattern(new_order)
        if within:
            self._reorder_within_beams(new_order, moved)
        else:
            self._flatten(new_order)

    def _select_all(self, new_order: Tensor) -> None:
        """G = 1, or nothing shared (then the layout is G = 1's): every tensor is per hypothesis."""
        for name in self.kinds:
            self.tensors[name] = self.tensors[name].index_select(0, new_order)
        self.beam = 1
        self.slots = self.slots.new_empty(new_order.numel(), 1, 0)

    def _beam_pattern(self, new_order: Tensor) -> Tuple[bool, bool]:
        """(every new beam's G rows continue rows of one old beam, and some beam finished or
        moved): one read on the host, the only one of a decoding step."""
        group, beams = self.beam, self.slots.size(0)
        if new_order.numel() % group:
            return False, True
        origin = new_order.view(-1, group) // group  # [R', G]: the old beam of every new row
        within = (origin == origin[:, :1]).all()
        if origin.size(0) != beams:
            return bool(within), True
        stay = (origin[:, 0] == torch.arange(beams, device=origin.device)).all()
        within, stay = torch.stack([within, stay]).tolist()
        return within, not stay

    def _reorder_within_beams(self, new_order: Tensor, moved: bool) -> None:
        """Fast path: the rows and ``slots`` follow the order; shared tensors select the beams
        that continue, and are not touched at all while no beam finished or moved."""
        group, beams, steps = self.beam, self.slots.size(0), self._steps
        self.slots = self.slots.reshape(beams * group, steps).index_select(0, new_order).view(
            new_order.numel() // group, group, steps)
        origin = new_order.view(-1, group)[:, 0] // group  # the old beam each new beam continues
        for name, kind in self.kinds.items():
            if kind == "rows":
                self.tensors[name] = self.tensors[name].index_select(0, new_order)
            elif moved:
                self.tensors[name] = self.tensors[name].index_select(0, origin)

    def _flatten(self, new_order: Tensor) -> None:
        """General path: one row per hypothesis from now on (G = 1), each gathered from its old
        beam: ``sentences`` by beam, ``entries`` by beam and ancestor slot at every step."""
        group, steps = self.beam, self._steps
        beam_of = new_order // group
        path = self.slots.reshape(self.slots.size(0) * group, steps).index_select(0, new_order)  # [N', t]: ancestors' slots
        step = torch.arange(steps, device=new_order.device).unsqueeze(0)
        for name, kind in self.kinds.items():
            tensor = self.tensors[name]
            if kind == "rows":
                self.tensors[name] = tensor.index_select(0, new_order)
            elif kind == "sentences":
                self.tensors[name] = tensor.index_select(0, beam_of)
            else:  # [R, h, capacity, G, d_k] -> [N', h, capacity, 1, d_k]
                _, heads, capacity, _, d_k = tensor.shape
                flat = tensor.new_empty(new_order.numel(), heads, capacity, 1, d_k)
                ancestors = tensor[beam_of.unsqueeze(1), :, step, path]  # [N', t, h, d_k]
                flat[:, :, :steps, 0] = ancestors.transpose(1, 2)
                self.tensors[name] = flat
        self.beam = 1
        self.slots = self.slots.new_empty(new_order.numel(), 1, 0)


class BeamCacheDecoder(FairseqIncrementalDecoder):
    """A decoder whose incremental state is one :class:`BeamCache`: subclasses fill a new one in
    :meth:`start_cache`; fairseq's reorder moves it."""

    def start_cache(self, encoder_out: EncoderOut, cache: BeamCache) -> None:
        """Puts what decoding reads into the empty ``cache`` (rows of ``encoder_out``)."""
        raise NotImplementedError

    def decoding_cache(self, incremental_state, encoder_out: Optional[EncoderOut]) -> BeamCache:
        """The cache of this decoding, made from ``encoder_out`` at its first step."""
        cache = get_cache(self, incremental_state)
        if cache is None:
            cache = BeamCache.for_encoder_out(encoder_out)
            self.start_cache(encoder_out, cache)
            put_cache(self, incremental_state, cache)
        return cache

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """fairseq's contract: row n of the state now continues row ``new_order[n]`` (any order)."""
        cache = get_cache(self, incremental_state)
        if cache is not None:
            cache.reorder(new_order)

    def reorder_incremental_state_scripting(self, incremental_state, new_order: Tensor):
        self.reorder_incremental_state(incremental_state, new_order)  # the cache is the whole state
