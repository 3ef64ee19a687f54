"""One decoding cache for every family: :class:`BeamCache` (its design below; what it guarantees: docs/DECODING.md).

fairseq decodes N rows (hypotheses) step by step and, between steps, calls
``reorder_incremental_state(state, new_order)``: row n then continues old row ``new_order[n]``,
for any ``new_order`` (rows of other sentences, repeated, dropped). Beam search's orders have a
shape worth exploiting: its first ``reorder_encoder_out`` repeats every sentence G times
consecutively, and later orders move hypotheses within their beam and drop finished beams.

Names: G is the beam size (``beam_size``), R = N / G the number of beams; a beam is the G
hypotheses of one sentence (G = 1: every hypothesis is a beam of its own).

A BeamCache holds three kinds of tensors, each by name:

- ``cache.per_hypothesis[name]``: one row per hypothesis, [N, ...] (a recurrent state);
- ``cache.per_beam[name]``: one row per beam, [R, ...] (encoder keys/values, annotations,
  ``U_a h_j``, masks): computed once per sentence from :meth:`BeamCache.beam_rows` of the
  encoder output, never copied by a reorder within beams;
- ``cache.self_attention(layer)``: one decoder layer's self-attention keys and values, written
  step by step (:meth:`SelfAttention.update`), [h, d_k] per hypothesis and step, heads first.
  Two layouts:

  - the buffer (decoding in fairseq): [R, h, capacity, G, d_k], step j's entry stays in the slot
    (0..G-1) of the hypothesis that wrote it; the cache's slot table [R, G, t] says which slot
    holds each hypothesis's ancestor at each step, and :meth:`BeamCache.begin_step` turns it into
    the additive attention mask that makes every hypothesis read its own history;
  - concatenation (``concatenate=True``; the exported programs): [R, h, t, G, d_k], the same
    without spare capacity, one concatenation per step, which ``torch.export`` traces for any t
    and G (its code takes no branch on G). :meth:`BeamCache.state` and :meth:`BeamCache.from_state`
    turn a cache into a program's tensors and back (the slot table last, as ``slots``); a search
    outside reorders the per-hypothesis tensors and the slots within beams, and selects whole
    beams of everything when sentences finish, as :meth:`BeamCache.reorder` does.

G is set once, when the cache is made, from the encoder output (:func:`reorder_encoder_out`
records it when it expands every sentence into a beam). :meth:`BeamCache.reorder` takes the fast
path for orders within beams (the per-hypothesis tensors and the slots follow the order; per-beam
tensors and self-attention entries move only when beams finish) and a general ``index_select``
path for any other order, after which the cache has one row per hypothesis (G = 1) for good.
Neither path raises or asserts on the device; choosing between them reads one flag on the host,
in the reorder, never in a decoder step.

fairseq keeps the cache as one entry of its ``incremental_state`` (:data:`IncrementalState`);
:class:`BeamCacheDecoder` makes it at a decoding's first step and reorders it.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor

EncoderOut = Dict[str, List[Tensor]]  # every family's encoder output: name -> batch-first tensors
_BEAM_SIZE = "beam_size"  # an expansion's record of G in the encoder output (see reorder_encoder_out)
_CACHE = "beam_cache"  # the decoder's one incremental-state entry
_INITIAL_CAPACITY = 16  # decoding steps a self-attention buffer holds before it first doubles
# the three kinds of tensors, as BeamCache.kinds names them
PER_HYPOTHESIS, PER_BEAM, SELF_ATTENTION = "per_hypothesis", "per_beam", "self_attention"


def reorder_encoder_out(encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
    """fairseq's contract for batch-first encoder outputs: row n of every returned tensor is row
    ``new_order[n]``. When ``new_order`` is beam search's expansion (each row G > 1 times,
    consecutively) the output also records G, for the cache the decoder makes at its first step:
    a [N, G] entry ``beam_size``, a view of one zero (no memory). Its G rows of a beam are then
    copies of one sentence's, so a later order that keeps every row in its beam (beam search's)
    changes no value: the output is returned as it is, or, once beams finished, only the beams
    that continue are selected, and the record kept; any other order drops the record. Checking
    the expansion reads the host once, and only for an order with more rows than the output (beam
    search's first); checking a later order reads it once (:func:`_beam_pattern`)."""
    rows, new_rows = _num_rows(encoder_out), new_order.numel()
    beam_size = encoder_out[_BEAM_SIZE][0].size(1) if encoder_out.get(_BEAM_SIZE) else 1
    within, moved = _beam_pattern(new_order, beam_size, rows // beam_size) if beam_size > 1 else (False, True)
    if within and not moved:
        return encoder_out
    reordered = {key: [t.index_select(0, new_order) for t in tensors]
                 for key, tensors in encoder_out.items() if key != _BEAM_SIZE}
    if not within and 0 < rows < new_rows and new_rows % rows == 0:
        beam_size = new_rows // rows
        expansion = torch.arange(rows, device=new_order.device).repeat_interleave(beam_size)
        within = torch.equal(new_order, expansion)
    if within:
        reordered[_BEAM_SIZE] = [new_order.new_zeros((), dtype=torch.uint8).expand(new_rows, beam_size)]
    return reordered


def _beam_pattern(new_order: Tensor, beam_size: int, beams: int) -> Tuple[bool, bool]:
    """For rows in ``beams`` beams of ``beam_size``: (every new beam's rows continue rows of one
    old beam, and some beam finished or moved). The shapes decide what they can (rows that make
    no whole beams are not within beams; another number of beams has moved); the rest is one read
    on the host, a single ``torch.equal`` for beam search's usual order, every beam continuing
    itself (its cost: docs/DECODING.md, "What the decoders guarantee")."""
    if new_order.numel() % beam_size:
        return False, True
    origin = new_order.view(-1, beam_size) // beam_size  # [R', G]: the old beam of every new row
    if origin.size(0) == beams:
        stay = torch.arange(beams, device=origin.device).unsqueeze(1).expand(beams, beam_size)
        if torch.equal(origin, stay):
            return True, False
    return bool((origin == origin[:, :1]).all()), True


def _num_rows(encoder_out: EncoderOut) -> int:
    return next((t.size(0) for key, tensors in encoder_out.items() if key != _BEAM_SIZE for t in tensors), 0)


def get_cache(decoder, incremental_state: "IncrementalState") -> Optional["BeamCache"]:
    return decoder.get_incremental_state(incremental_state, _CACHE)


def put_cache(decoder, incremental_state: "IncrementalState", cache: "BeamCache") -> None:
    decoder.set_incremental_state(incremental_state, _CACHE, cache)


class _Named(dict):
    """name -> tensor, the cache's tensors of one kind; a new name also takes its place in the
    state's order (``order``: name -> kind, shared by the cache's three kinds)."""

    def __init__(self, kind: str, order: Dict[str, str]):
        super().__init__()
        self.kind, self.order = kind, order

    def __setitem__(self, name: str, tensor: Tensor) -> None:
        self.order.setdefault(name, self.kind)
        super().__setitem__(name, tensor)


class SelfAttention:
    """One decoder layer's self-attention keys and values in a :class:`BeamCache`, under the
    state names ``layers.<layer>.self_attn.k`` and ``.v`` (the layer's own module path); a view,
    made by :meth:`BeamCache.self_attention` at each call (the cache holds no reference to it)."""

    __slots__ = ("cache", "names")

    def __init__(self, cache: "BeamCache", layer: int):
        self.cache = cache
        self.names = (f"layers.{layer}.self_attn.k", f"layers.{layer}.self_attn.v")

    @property
    def keys(self) -> Tensor:
        """As stored: [R, h, capacity, G, d_k] (the buffer) or [R, h, t, G, d_k] (concatenation)."""
        return self.cache._entries[self.names[0]]

    @property
    def values(self) -> Tensor:
        return self.cache._entries[self.names[1]]

    def reserve(self, heads: int, d_k: int, like: Tensor) -> None:
        """Room for ``heads`` × ``d_k`` per hypothesis and step (dtype and device of ``like``)."""
        cache = self.cache
        capacity = 0 if cache._concatenate else _INITIAL_CAPACITY
        for name in self.names:
            cache._entries[name] = like.new_empty(cache._slots.size(0), heads, capacity, cache.beam_size, d_k)

    def update(self, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Writes this step's keys and values [N, h, d_k] (after :meth:`BeamCache.begin_step`) and
        returns all so far as attention reads them, [R, h, (t+1)·G, d_k] each, step-major and
        slot-minor along (t+1)·G, with the step's additive mask [R, 1, G, (t+1)·G] (None for G = 1
        in the buffer). The buffer doubles when full (amortised O(1))."""
        return self.cache._append(self.names[0], k), self.cache._append(self.names[1], v), self.cache._mask


class BeamCache:
    """The decoding state of one decoder for N hypotheses in R beams of G (see the module doc):
    ``per_hypothesis`` and ``per_beam`` (name -> tensor, set and read like dicts) and
    :meth:`self_attention`; only its methods move them."""

    def __init__(self, hypotheses: int, beam_size: int, device: Optional[torch.device] = None,
                 concatenate: bool = False):
        self.beam_size = beam_size  # G
        self._concatenate = concatenate  # entries grow by concatenation, [R, h, t, G, d_k]
        self._kinds: Dict[str, str] = {}  # name -> kind, in the state's order
        self.per_hypothesis = _Named(PER_HYPOTHESIS, self._kinds)  # [N, ...]
        self.per_beam = _Named(PER_BEAM, self._kinds)  # [R, ...]
        self._entries = _Named(SELF_ATTENTION, self._kinds)  # self-attention keys and values, by name
        self._slots = torch.empty(hypotheses // beam_size, beam_size, 0, dtype=torch.long, device=device)  # [R, G, t]
        self._mask: Optional[Tensor] = None  # this step's, from begin_step
        self._steps = 0

    @classmethod
    def for_encoder_out(cls, encoder_out: EncoderOut) -> "BeamCache":
        """An empty cache for the rows of ``encoder_out``, in beams of the G its reorder recorded."""
        beam_size = encoder_out[_BEAM_SIZE][0].size(1) if encoder_out.get(_BEAM_SIZE) else 1
        device = next(t.device for tensors in encoder_out.values() for t in tensors)
        return cls(_num_rows(encoder_out), beam_size, device)

    @classmethod
    def from_state(cls, kinds: Dict[str, str], state: Sequence[Tensor]) -> "BeamCache":
        """A concatenating cache holding ``state`` (tensors named and kinded by ``kinds``, as
        :attr:`kinds` gives them, in its order, then the slots, as :meth:`state` returns them): a
        program's inputs."""
        *tensors, slots = state
        beams, beam_size, steps = slots.shape
        cache = cls(beams * beam_size, beam_size, slots.device, concatenate=True)
        cache._slots, cache._steps = slots, steps  # symbolic when exported
        for (name, kind), tensor in zip(kinds.items(), tensors):
            # every tensor's R (and G) are the slots': said to torch.export's tracer, which
            # otherwise gives each input its own symbols and cannot simplify (R·G) / G
            torch._check(tensor.size(0) == beams)
            if kind != PER_BEAM:
                torch._check(tensor.size(1 if kind == PER_HYPOTHESIS else 3) == beam_size)
            if kind == PER_HYPOTHESIS:  # [R, G, ...] -> [N, ...]; a copy, whose strides the tracer can simplify
                tensor = tensor.flatten(0, 1).clone()
            cache._of_kind(kind)[name] = tensor
        return cache

    @property
    def kinds(self) -> Dict[str, str]:
        """State name -> ``per_hypothesis``, ``per_beam`` or ``self_attention``, in the state's
        order (the order the tensors were first stored)."""
        return dict(self._kinds)

    def state(self) -> Tuple[Tensor, ...]:
        """A concatenating cache's tensors, beam-major, in the state's order: per hypothesis
        [R, G, ...], per beam [R, ...], self-attention [R, h, t, G, d_k], then the slots [R, G, t];
        what :meth:`from_state` takes back, a program's outputs."""
        beams = self._slots.size(0)
        return tuple(self.per_hypothesis[name].unflatten(0, (beams, self.beam_size)) if kind == PER_HYPOTHESIS
                     else self._of_kind(kind)[name] for name, kind in self._kinds.items()) + (self._slots,)

    def _of_kind(self, kind: str) -> _Named:
        return {PER_HYPOTHESIS: self.per_hypothesis, PER_BEAM: self.per_beam, SELF_ATTENTION: self._entries}[kind]

    @property
    def _in_beams(self) -> bool:
        """Whether a step reads the self-attention entries through the slots' mask, with a beam's
        rows as one query block: for G > 1, and for any G in the concatenating layout, whose
        programs take any G and so never branch on it (the buffer at G = 1 skips both)."""
        return self._concatenate or self.beam_size > 1

    @property
    def steps(self) -> int:
        """Self-attention entries written so far per hypothesis."""
        return self._steps

    # ------------------------------------------------------------------ filling and reading

    def beam_rows(self, encoder_out: EncoderOut) -> EncoderOut:
        """``encoder_out``'s rows standing for their beams (every G-th; all of them for G = 1):
        what ``per_beam`` tensors are computed from."""
        if self.beam_size == 1:
            return encoder_out
        return {key: [t[::self.beam_size] for t in tensors] for key, tensors in encoder_out.items()}

    def self_attention(self, layer: int) -> SelfAttention:
        """Decoder layer ``layer``'s self-attention keys and values."""
        return SelfAttention(self, layer)

    def begin_step(self) -> None:
        """Advances the bookkeeping by one step, in which every hypothesis writes its own slot,
        and makes the step's self-attention mask (:meth:`SelfAttention.update`): additive
        [R, 1, G, (t+1)·G], 0 where a hypothesis reads an entry (its ancestors' and its own),
        -inf elsewhere; None for G = 1 in the buffer."""
        self._steps += 1
        if not self._in_beams:
            self._mask = None
            return
        beams, beam_size = self._slots.size(0), self.beam_size
        own = torch.arange(beam_size, device=self._slots.device)
        self._slots = torch.cat([self._slots, own.view(1, beam_size, 1).expand(beams, beam_size, 1)], dim=2)
        reads = (self._slots.unsqueeze(3) == own).view(beams, 1, beam_size, self._steps * beam_size)
        self._mask = torch.zeros(reads.shape, device=reads.device).masked_fill_(~reads, float("-inf"))

    def _written(self, name: str) -> Tensor:
        """The entries written so far as attention reads them: [R, h, t·G, d_k]."""
        tensor = self._entries[name]
        beams, heads, _, beam_size, d_k = tensor.shape
        written = tensor if self._concatenate else tensor[:, :, :self._steps]
        return written.reshape(beams, heads, self._steps * beam_size, d_k)  # merges t and G: a view

    def _append(self, name: str, new: Tensor) -> Tensor:
        """Writes this step's entries ``new`` [N, h, d_k] and returns all so far (:meth:`_written`)."""
        buf, t = self._entries[name], self._steps - 1
        beams, heads, capacity, beam_size, d_k = buf.shape
        new = new.view(beams, beam_size, heads, d_k).transpose(1, 2)  # [R, h, G, d_k]
        if self._concatenate:
            self._entries[name] = torch.cat([buf, new.unsqueeze(2)], dim=2)
            return self._written(name)
        if t == capacity:
            bigger = buf.new_empty(beams, heads, 2 * capacity, beam_size, d_k)
            bigger[:, :, :t] = buf
            self._entries[name] = buf = bigger
        buf[:, :, t] = new
        return self._written(name)

    def group_queries(self, q: Tensor) -> Tensor:
        """[N, h, T, d_k] -> [R, h, G·T, d_k]: a beam's rows become one query block, which reads
        per-beam keys and self-attention entries (left as they are for G = 1 in the buffer)."""
        if not self._in_beams:
            return q
        _, heads, length, d_k = q.shape
        return q.transpose(1, 2).reshape(-1, self.beam_size * length, heads, d_k).transpose(1, 2)

    # ------------------------------------------------------------------ fairseq's reorder

    def reorder(self, new_order: Tensor) -> None:
        """Row n continues old row ``new_order[n]``, for any ``new_order``."""
        if self.beam_size == 1 or not (self.per_beam or self._entries):
            self._select_all(new_order)
            return
        within, moved = _beam_pattern(new_order, self.beam_size, self._slots.size(0))
        if within:
            self._reorder_within_beams(new_order, moved)
        else:
            self._flatten(new_order)

    def _select_all(self, new_order: Tensor) -> None:
        """G = 1, or nothing shared (then the layout is G = 1's): every tensor is per hypothesis."""
        for named in (self.per_hypothesis, self.per_beam, self._entries):
            for name, tensor in named.items():
                named[name] = tensor.index_select(0, new_order)
        self.beam_size = 1
        self._slots = self._slots.new_empty(new_order.numel(), 1, 0)

    def _reorder_within_beams(self, new_order: Tensor, moved: bool) -> None:
        """Fast path: the per-hypothesis tensors and the slots follow the order; shared tensors
        select the beams that continue, and are not touched at all while no beam finished or moved."""
        beam_size, beams, steps = self.beam_size, self._slots.size(0), self._steps
        self._slots = self._slots.reshape(beams * beam_size, steps).index_select(0, new_order).view(
            new_order.numel() // beam_size, beam_size, steps)
        for name, tensor in self.per_hypothesis.items():
            self.per_hypothesis[name] = tensor.index_select(0, new_order)
        if moved:
            origin = new_order.view(-1, beam_size)[:, 0] // beam_size  # the old beam each new beam continues
            for named in (self.per_beam, self._entries):
                for name, tensor in named.items():
                    named[name] = tensor.index_select(0, origin)

    def _flatten(self, new_order: Tensor) -> None:
        """General path: one row per hypothesis from now on (G = 1), each gathered from its old
        beam: per-beam tensors by beam, self-attention entries by beam and ancestor slot at every step."""
        beam_size, steps = self.beam_size, self._steps
        beam_of = new_order // beam_size
        path = self._slots.reshape(self._slots.size(0) * beam_size, steps).index_select(0, new_order)  # [N', t]: ancestors' slots
        step = torch.arange(steps, device=new_order.device).unsqueeze(0)
        for name, tensor in self.per_hypothesis.items():
            self.per_hypothesis[name] = tensor.index_select(0, new_order)
        for name, tensor in self.per_beam.items():
            self.per_beam[name] = tensor.index_select(0, beam_of)
        for name, tensor in self._entries.items():  # [R, h, capacity, G, d_k] -> [N', h, capacity, 1, d_k]
            _, heads, capacity, _, d_k = tensor.shape
            flat = tensor.new_empty(new_order.numel(), heads, capacity, 1, d_k)
            ancestors = tensor[beam_of.unsqueeze(1), :, step, path]  # [N', t, h, d_k]
            flat[:, :, :steps, 0] = ancestors.transpose(1, 2)
            self._entries[name] = flat
        self.beam_size = 1
        self._slots = self._slots.new_empty(new_order.numel(), 1, 0)


# fairseq's incremental_state as a BeamCacheDecoder fills it: its one BeamCache under
# "<decoder's id>.beam_cache" (fairseq's own decoders keep Dict[str, Optional[Tensor]] there)
IncrementalState = Dict[str, BeamCache]


class BeamCacheDecoder(FairseqIncrementalDecoder):
    """A decoder whose incremental state is one :class:`BeamCache`: subclasses fill a new one in
    :meth:`start_cache`; fairseq's reorder moves it."""

    def start_cache(self, encoder_out: EncoderOut, cache: BeamCache) -> None:
        """Puts what decoding reads into the empty ``cache`` (rows of ``encoder_out``)."""
        raise NotImplementedError

    def decoding_cache(self, incremental_state: IncrementalState, encoder_out: Optional[EncoderOut]) -> BeamCache:
        """The cache of this decoding, made from ``encoder_out`` at its first step."""
        cache = get_cache(self, incremental_state)
        if cache is None:
            cache = BeamCache.for_encoder_out(encoder_out)
            self.start_cache(encoder_out, cache)
            put_cache(self, incremental_state, cache)
        return cache

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """fairseq's contract: row n of the state now continues row ``new_order[n]`` (any order)."""
        cache = get_cache(self, incremental_state)
        if cache is not None:
            cache.reorder(new_order)

    def reorder_incremental_state_scripting(self, incremental_state: IncrementalState, new_order: Tensor):
        self.reorder_incremental_state(incremental_state, new_order)  # the cache is the whole state
