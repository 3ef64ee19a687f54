"""One decoding cache for every family: :class:`BeamCache` (design: docs/DECODING.md).

fairseq decodes N rows (hypotheses) step by step and, between steps, calls
``reorder_incremental_state(state, new_order)``: row n then continues old row ``new_order[n]``,
for any ``new_order`` (rows of other sentences, repeated, dropped). Beam search's orders have a
shape worth exploiting: its first ``reorder_encoder_out`` repeats every sentence G times
consecutively, and later orders move hypotheses within their beam and drop finished beams.

Names: G is the beam size (``beam_size``), R = N / G the number of beams (``beams``); a beam is
the G hypotheses of one sentence (G = 1: every hypothesis is a beam of its own).

A BeamCache holds three kinds of tensors, each by name:

- ``rows``: one row per hypothesis, [N, ...] (a recurrent state);
- ``sentences``: one row per beam, [R, ...] (encoder keys/values, annotations, ``U_a h_j``,
  masks): computed and read once per sentence, never copied by a reorder within beams;
- ``entries``: self-attention keys or values written step by step, [h, d_k] per hypothesis and
  step, heads first. Two layouts:

  - the buffer (decoding in fairseq): [R, h, capacity, G, d_k], step j's entry stays in the slot
    (0..G-1) of the hypothesis that wrote it; ``slots`` [R, G, t] says which slot holds each
    hypothesis's ancestor at each step, and :meth:`begin_step` turns it into the additive
    attention mask that makes every hypothesis read its own history;
  - concatenation (``concatenate=True``; the exported programs): [R, h, t, G, d_k], the same
    without spare capacity, one concatenation per step, which ``torch.export`` traces for any t
    and G (its code takes no branch on G). :meth:`state` and :meth:`from_state` turn a cache
    into a program's tensors and back; a search outside reorders the rows and ``slots`` within
    beams, and selects whole beams of everything when sentences finish, as :meth:`reorder` does.

G is set once, when the cache is made, from the encoder output (:func:`reorder_encoder_out`
records it when it expands every sentence into a beam). :meth:`reorder` takes the fast path for
orders within beams (the rows and ``slots`` follow the order; ``sentences`` and ``entries`` move
only when beams finish) and a general ``index_select`` path for any other order, after which the
cache has one row per hypothesis (G = 1) for good. Neither path raises or asserts on the device;
choosing between them reads one flag on the host, in the reorder, never in a decoder step.

fairseq keeps the cache as one entry of its ``incremental_state`` (:data:`IncrementalState`);
:class:`BeamCacheDecoder` makes it at a decoding's first step and reorders it.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor

EncoderOut = Dict[str, List[Tensor]]  # every family's encoder output: name -> batch-first tensors
BEAM_SIZE = "beam_size"  # an expansion's record of G in the encoder output (see reorder_encoder_out)
CACHE = "beam_cache"  # the decoder's one incremental-state entry
INITIAL_CAPACITY = 16  # decoding steps an entries buffer holds before it first doubles
KINDS = ("rows", "sentences", "entries")


def reorder_encoder_out(encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
    """fairseq's contract for batch-first encoder outputs: row n of every returned tensor is row
    ``new_order[n]``. When ``new_order`` is beam search's expansion (each row G > 1 times,
    consecutively) the output also records G, for the cache the decoder makes at its first step:
    a [N, G] entry ``beam_size``, a view of one zero (no memory). Its G rows of a beam are then
    copies of one sentence's, so a later order that keeps every row in its beam (beam search's)
    changes no value: the output is returned as it is, or, once beams finished, only the beams
    that continue are selected, and the record kept; any other order drops the record. Checking
    the expansion reads the host once, and only for an order with more rows than the output (beam
    search's first); checking a later order reads it once (:func:`beam_pattern`)."""
    rows, new_rows = _num_rows(encoder_out), new_order.numel()
    beam_size = encoder_out[BEAM_SIZE][0].size(1) if encoder_out.get(BEAM_SIZE) else 1
    within, moved = beam_pattern(new_order, beam_size, rows // beam_size) if beam_size > 1 else (False, True)
    if within and not moved:
        return encoder_out
    reordered = {key: [t.index_select(0, new_order) for t in tensors]
                 for key, tensors in encoder_out.items() if key != BEAM_SIZE}
    if not within and 0 < rows < new_rows and new_rows % rows == 0:
        beam_size = new_rows // rows
        expansion = torch.arange(rows, device=new_order.device).repeat_interleave(beam_size)
        within = torch.equal(new_order, expansion)
    if within:
        reordered[BEAM_SIZE] = [new_order.new_zeros((), dtype=torch.uint8).expand(new_rows, beam_size)]
    return reordered


def beam_pattern(new_order: Tensor, beam_size: int, beams: int) -> Tuple[bool, bool]:
    """For rows in ``beams`` beams of ``beam_size``: (every new beam's rows continue rows of one
    old beam, and some beam finished or moved). The shapes decide what they can (rows that make
    no whole beams are not within beams; another number of beams has moved); the rest is one read
    on the host, a single ``torch.equal`` for beam search's usual order, every beam continuing
    itself (docs/DECODING.md has its cost)."""
    if new_order.numel() % beam_size:
        return False, True
    origin = new_order.view(-1, beam_size) // beam_size  # [R', G]: the old beam of every new row
    if origin.size(0) == beams:
        stay = torch.arange(beams, device=origin.device).unsqueeze(1).expand(beams, beam_size)
        if torch.equal(origin, stay):
            return True, False
    return bool((origin == origin[:, :1]).all()), True


def _num_rows(encoder_out: EncoderOut) -> int:
    return next((t.size(0) for key, tensors in encoder_out.items() if key != BEAM_SIZE for t in tensors), 0)


def get_cache(decoder, incremental_state: "IncrementalState") -> Optional["BeamCache"]:
    return decoder.get_incremental_state(incremental_state, CACHE)


def put_cache(decoder, incremental_state: "IncrementalState", cache: "BeamCache") -> None:
    decoder.set_incremental_state(incremental_state, CACHE, cache)


class BeamCache:
    """The decoding state of one decoder for N hypotheses in R beams of G (see the module doc).
    ``kinds`` (name -> kind, in the state's order) and ``tensors`` (name -> tensor, as laid out)
    are for reading; only the methods write them."""

    def __init__(self, rows: int, beam_size: int, device: Optional[torch.device] = None,
                 concatenate: bool = False):
        self.beam_size = beam_size  # G
        self.concatenate = concatenate  # entries grow by concatenation, [R, h, t, G, d_k]
        self.tensors: Dict[str, Tensor] = {}
        self.kinds: Dict[str, str] = {}  # name -> one of KINDS; insertion order is the state's order
        self.slots = torch.empty(rows // beam_size, beam_size, 0, dtype=torch.long, device=device)  # [R, G, t]
        self.self_attn_mask: Optional[Tensor] = None  # this step's, from begin_step
        self._steps = 0

    @classmethod
    def for_encoder_out(cls, encoder_out: EncoderOut) -> "BeamCache":
        """An empty cache for the rows of ``encoder_out``, in beams of the G its reorder recorded."""
        beam_size = encoder_out[BEAM_SIZE][0].size(1) if encoder_out.get(BEAM_SIZE) else 1
        device = next(t.device for tensors in encoder_out.values() for t in tensors)
        return cls(_num_rows(encoder_out), beam_size, device)

    @classmethod
    def from_state(cls, kinds: Dict[str, str], state: Sequence[Tensor]) -> "BeamCache":
        """A concatenating cache holding ``state`` (tensors named and kinded by ``kinds``, in its
        order, then ``slots``, as :meth:`state` returns them): a program's inputs."""
        *tensors, slots = state
        beams, beam_size, steps = slots.shape
        cache = cls(beams * beam_size, beam_size, slots.device, concatenate=True)
        cache.slots, cache._steps = slots, steps  # symbolic when exported
        for (name, kind), tensor in zip(kinds.items(), tensors):
            # every tensor's R (and G) are the slots': said to torch.export's tracer, which
            # otherwise gives each input its own symbols and cannot simplify (R·G) / G
            torch._check(tensor.size(0) == beams)
            if kind != "sentences":
                torch._check(tensor.size(1 if kind == "rows" else 3) == beam_size)
            if kind == "rows":  # [R, G, ...] -> [N, ...]; a copy, whose strides the tracer can simplify
                tensor = tensor.flatten(0, 1).clone()
            cache.tensors[name], cache.kinds[name] = tensor, kind
        return cache

    def state(self) -> Tuple[Tensor, ...]:
        """A concatenating cache's tensors, beam-major, in the state's order: ``rows`` [R, G, ...],
        ``sentences`` [R, ...], ``entries`` [R, h, t, G, d_k], then ``slots`` [R, G, t]; what
        :meth:`from_state` takes back, a program's outputs."""
        beams = self.slots.size(0)
        return tuple(self.tensors[name].unflatten(0, (beams, self.beam_size)) if kind == "rows"
                     else self.tensors[name] for name, kind in self.kinds.items()) + (self.slots,)

    @property
    def _in_beams(self) -> bool:
        """Whether a step reads the entries through the slots' mask, with a beam's rows as one
        query block: for G > 1, and for any G in the concatenating layout, whose programs take
        any G and so never branch on it (the buffer at G = 1 skips both)."""
        return self.concatenate or self.beam_size > 1

    @property
    def steps(self) -> int:
        """Self-attention entries written so far per hypothesis."""
        return self._steps

    # ------------------------------------------------------------------ filling and reading

    def per_sentence(self, encoder_out: EncoderOut) -> EncoderOut:
        """``encoder_out``'s rows standing for their beams (every G-th; all of them for G = 1):
        what ``sentences`` tensors are computed from."""
        if self.beam_size == 1:
            return encoder_out
        return {key: [t[::self.beam_size] for t in tensors] for key, tensors in encoder_out.items()}

    def put(self, kind: str, name: str, tensor: Tensor) -> None:
        """Stores ``tensor`` as ``rows`` [N, ...] or ``sentences`` [R, ...]."""
        self.tensors[name], self.kinds[name] = tensor, kind

    def get(self, name: str) -> Tensor:
        """A stored tensor; for ``entries`` those written so far, as attention reads them:
        [R, h, t·G, d_k], step-major and slot-minor along t·G."""
        tensor = self.tensors[name]
        if self.kinds[name] == "entries":
            beams, heads, _, beam_size, d_k = tensor.shape
            written = tensor if self.concatenate else tensor[:, :, :self._steps]
            return written.reshape(beams, heads, self._steps * beam_size, d_k)  # merges t and G: a view
        return tensor

    def names(self, kind: Optional[str] = None) -> List[str]:
        return [name for name, k in self.kinds.items() if kind is None or k == kind]

    def reserve(self, name: str, heads: int, d_k: int, like: Tensor) -> None:
        """Room for self-attention keys or values of ``heads`` × ``d_k`` per hypothesis and step."""
        self.kinds[name] = "entries"
        capacity = 0 if self.concatenate else INITIAL_CAPACITY
        self.tensors[name] = like.new_empty(self.slots.size(0), heads, capacity, self.beam_size, d_k)

    def begin_step(self) -> Optional[Tensor]:
        """Advances the bookkeeping by one step, in which every hypothesis writes its own slot.
        Sets and returns ``self_attn_mask``: additive [R, 1, G, (t+1)·G], 0 where a hypothesis
        reads an entry (its ancestors' and its own), -inf elsewhere; None for G = 1 in the buffer."""
        self._steps += 1
        if not self._in_beams:
            self.self_attn_mask = None
            return None
        beams, beam_size = self.slots.size(0), self.beam_size
        own = torch.arange(beam_size, device=self.slots.device)
        self.slots = torch.cat([self.slots, own.view(1, beam_size, 1).expand(beams, beam_size, 1)], dim=2)
        reads = (self.slots.unsqueeze(3) == own).view(beams, 1, beam_size, self._steps * beam_size)
        self.self_attn_mask = torch.zeros(reads.shape, device=reads.device).masked_fill_(~reads, float("-inf"))
        return self.self_attn_mask

    def append(self, name: str, new: Tensor) -> Tensor:
        """Writes this step's entries ``new`` [N, h, d_k] (after :meth:`begin_step`) and returns
        all entries so far as :meth:`get` does. The buffer doubles when full (amortised O(1))."""
        buf, t = self.tensors[name], self._steps - 1
        beams, heads, capacity, beam_size, d_k = buf.shape
        new = new.view(beams, beam_size, heads, d_k).transpose(1, 2)  # [R, h, G, d_k]
        if self.concatenate:
            self.tensors[name] = torch.cat([buf, new.unsqueeze(2)], dim=2)
            return self.get(name)
        if t == capacity:
            bigger = buf.new_empty(beams, heads, 2 * capacity, beam_size, d_k)
            bigger[:, :, :t] = buf
            self.tensors[name] = buf = bigger
        buf[:, :, t] = new
        return self.get(name)

    def group_queries(self, q: Tensor) -> Tensor:
        """[N, h, T, d_k] -> [R, h, G·T, d_k]: a beam's rows become one query block (left as they
        are for G = 1 in the buffer)."""
        if not self._in_beams:
            return q
        _, heads, length, d_k = q.shape
        return q.transpose(1, 2).reshape(-1, self.beam_size * length, heads, d_k).transpose(1, 2)

    # ------------------------------------------------------------------ fairseq's reorder

    def reorder(self, new_order: Tensor) -> None:
        """Row n continues old row ``new_order[n]``, for any ``new_order``."""
        shared = [name for name, kind in self.kinds.items() if kind != "rows"]
        if self.beam_size == 1 or not shared:
            self._select_all(new_order)
            return
        within, moved = beam_pattern(new_order, self.beam_size, self.slots.size(0))
        if within:
            self._reorder_within_beams(new_order, moved)
        else:
            self._flatten(new_order)

    def _select_all(self, new_order: Tensor) -> None:
        """G = 1, or nothing shared (then the layout is G = 1's): every tensor is per hypothesis."""
        for name in self.kinds:
            self.tensors[name] = self.tensors[name].index_select(0, new_order)
        self.beam_size = 1
        self.slots = self.slots.new_empty(new_order.numel(), 1, 0)

    def _reorder_within_beams(self, new_order: Tensor, moved: bool) -> None:
        """Fast path: the rows and ``slots`` follow the order; shared tensors select the beams
        that continue, and are not touched at all while no beam finished or moved."""
        beam_size, beams, steps = self.beam_size, self.slots.size(0), self._steps
        self.slots = self.slots.reshape(beams * beam_size, steps).index_select(0, new_order).view(
            new_order.numel() // beam_size, beam_size, steps)
        origin = new_order.view(-1, beam_size)[:, 0] // beam_size  # the old beam each new beam continues
        for name, kind in self.kinds.items():
            if kind == "rows":
                self.tensors[name] = self.tensors[name].index_select(0, new_order)
            elif moved:
                self.tensors[name] = self.tensors[name].index_select(0, origin)

    def _flatten(self, new_order: Tensor) -> None:
        """General path: one row per hypothesis from now on (G = 1), each gathered from its old
        beam: ``sentences`` by beam, ``entries`` by beam and ancestor slot at every step."""
        beam_size, steps = self.beam_size, self._steps
        beam_of = new_order // beam_size
        path = self.slots.reshape(self.slots.size(0) * beam_size, steps).index_select(0, new_order)  # [N', t]: ancestors' slots
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
        self.beam_size = 1
        self.slots = self.slots.new_empty(new_order.numel(), 1, 0)


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
