"""The decoding cache (modules/beam_cache.py) of every family against caches of nothing.

Oracles: (1) under random reorders (beam search's pattern, finished beams dropped, beams
moved, rows taken across sentences, duplicated, dropped) every step's log-probabilities and
alignments equal a full forward pass of the reordered prefixes; (2) fairseq's own generator
gives the same hypotheses, scores and alignments with the models as with wrappers that keep no
incremental state (fairseq then recomputes the full forward each step) and reorder the encoder
output by fairseq's contract written out here, for every search option fairseq-generate offers,
and with sentences that end at different steps and leave the batch; (3) no reorder raises, and
the beam layout's fast path moves no cache entry. fairseq's generator only ever reorders within
each sentence's beam (finished sentences drop out, the others move up), so the path for orders
across sentences is (1)'s.
"""
import argparse

import pytest
import torch
from fairseq import search
from fairseq.data import Dictionary
from fairseq.models import (ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, FairseqDecoder, FairseqEncoder,
                            FairseqEncoderDecoderModel)
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from fairseq.token_generation_constraints import pack_constraints

import fairseq_plugins  # noqa: F401  (registers the models, installs the patches)
from fairseq_plugins.modules.beam_cache import get_cache

DICT = Dictionary()
for _w in range(30):
    DICT.add_symbol(f"w{_w}")
ARCHS = ["vaswani_transformer_tiny", "rnnsearch_tiny", "rnnencdec_tiny", "seq2seq_lstm_tiny"]
TOL = 1e-5


class Task:
    source_dictionary = DICT
    target_dictionary = DICT


def build(arch, seed=0):
    args = argparse.Namespace(arch=arch, dropout=0.0)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, Task)
    with torch.no_grad():  # no near-zero initialisation hiding a term; log-probs of order 1
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def batch(lengths, seed=1):
    """Left-padded sentences ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), DICT.pad())
    for b, n in enumerate(lengths):
        words = torch.randint(DICT.nspecial, len(DICT), (n - 1,), generator=g)
        src[b, max(lengths) - n:] = torch.cat([words, torch.tensor([DICT.eos()])])
    return src


# ---------------------------------------------------------------- random reorders

def within_beams(rows, beam, g, drop=False, move=False):
    """Beam search's order: each hypothesis continues one of its beam's; optionally the first
    beam finished (dropped) or the beams change places."""
    beams = rows // beam
    order = (torch.randint(0, beam, (beams, beam), generator=g) + torch.arange(beams).unsqueeze(1) * beam)
    if move:
        order = order.flip(0)
    if drop and beams > 1:
        order = order[1:]
    return order.reshape(-1)


def anywhere(rows, g):
    """Any order: rows of other sentences, repeated and dropped, a different count."""
    return torch.randint(0, rows, (int(torch.randint(1, rows + 3, (1,), generator=g)),), generator=g)


SCENARIOS = {
    # beam search, then the fast path's exits: a finished beam, moved beams, rows crossing beams
    "beams-then-anything": (3, ["beam"] * 3 + ["drop", "beam", "move", "beam", "cross"] + ["any"] * 3),
    # past the entries' initial capacity (16) in the beam layout, then flattened
    "long-beams": (2, ["beam"] * 17 + ["any", "beam"]),
    # one row taken from the last beam, the rest staying: only the first beam's first row crosses
    "one-row-across": (3, ["beam"] * 2 + ["lopsided", "beam"]),
    # the last row dropped: no longer whole beams (fairseq's contract allows any order)
    "a-row-short-of-whole-beams": (3, ["beam"] * 2 + ["short", "any"]),
    "first-reorder-not-beams": (0, ["any"] * 6),
    "never-reordered": (1, ["any"] * 5),
}


def make_order(kind, rows, beam, g):
    if kind in ("beam", "drop", "move"):
        return within_beams(rows, beam, g, drop=kind == "drop", move=kind == "move")
    if kind == "cross":
        return torch.roll(torch.arange(rows), 1)  # every row continues its neighbour's, across beams
    if kind == "short":
        return torch.arange(rows - 1)
    if kind == "lopsided":
        order = torch.arange(rows)
        order[0] = rows - 1
        return order
    return anywhere(rows, g)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_step_equals_a_full_forward_of_the_reordered_prefixes(arch, scenario):
    model = build(arch)
    beam, kinds = SCENARIOS[scenario]
    g = torch.Generator().manual_seed(len(scenario))
    src = batch((7, 3, 5, 6))
    rows = torch.arange(src.size(0))
    with torch.no_grad():
        encoder_out = model.encoder(src)
        if beam:  # SequenceGenerator's expansion: each sentence `beam` times, consecutively
            first = rows.repeat_interleave(beam)
        else:  # a first reorder that is not beams: repeated, crossing rows
            first = torch.tensor([2, 0, 0, 3, 1, 2, 3, 1])  # twice the rows, not beams
        if beam != 1:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, first)
            rows = rows[first]
        prev = torch.full((rows.numel(), 1), DICT.eos())
        state = {}
        for t, kind in enumerate([None] + kinds):
            if kind is not None:
                order = make_order(kind, rows.numel(), max(beam, 1), g)
                model.decoder.reorder_incremental_state(state, order)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
                rows, prev = rows[order], prev[order]
                new = torch.randint(DICT.nspecial, len(DICT), (rows.numel(), 1), generator=g)
                prev = torch.cat([prev, new], dim=1)
            out = model.decoder(prev, encoder_out, incremental_state=state)
            step = model.get_normalized_probs(out, log_probs=True)[:, -1]
            full_out = model(src[rows], None, prev)
            full = model.get_normalized_probs(full_out, log_probs=True)[:, -1]
            assert (step - full).abs().max() < TOL, (t, kind)
            if out[1]["attn"][0] is not None:
                assert (out[1]["attn"][0][:, -1] - full_out[1]["attn"][0][:, -1]).abs().max() < TOL, (t, kind)


def self_attention_entries(model, cache):
    """name -> stored buffer of every decoder layer's self-attention keys and values (none for the RNNs)."""
    entries = {}
    for layer in getattr(model.decoder, "layers", []):
        attention = cache.self_attention(layer.self_attn.layer)
        entries.update(zip(attention.names, (attention.keys, attention.values)))
    return entries


def kept_per_beam(model, cache):
    """name -> every tensor the cache keeps once per beam."""
    return {**cache.per_beam, **self_attention_entries(model, cache)}


@pytest.mark.parametrize("arch", ["vaswani_transformer_tiny", "rnnsearch_tiny", "rnnencdec_tiny"])
def test_reorders_within_beams_copy_no_shared_tensor(arch):
    """The fast path: while no beam finishes or moves, the per-sentence tensors and the
    self-attention entries stay where they are; a finished beam selects the rest once."""
    model = build(arch)
    src, beam = batch((7, 3, 5)), 4
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src), torch.arange(3).repeat_interleave(beam))
        prev, state = torch.full((3 * beam, 1), DICT.eos()), {}
        model.decoder(prev, encoder_out, incremental_state=state)
        cache = get_cache(model.decoder, state)
        assert cache.beam_size == beam
        shared = {name: t.data_ptr() for name, t in kept_per_beam(model, cache).items()}
        assert shared and all(t.size(0) == 3 for t in kept_per_beam(model, cache).values())  # once per sentence
        for drop in (False, False, True):
            order = within_beams(prev.size(0), beam, g, drop=drop)
            model.decoder.reorder_incremental_state(state, order)
            moved = [name for name, t in kept_per_beam(model, cache).items() if t.data_ptr() != shared[name]]
            assert moved == (list(shared) if drop else []), drop
            prev = torch.cat([prev[order], torch.full((order.numel(), 1), 5)], dim=1)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            model.decoder(prev, encoder_out, incremental_state=state)
        assert cache.beam_size == beam and all(t.size(0) == 2 for t in kept_per_beam(model, cache).values())


@pytest.mark.parametrize("arch", ["vaswani_transformer_tiny", "rnnsearch_tiny"])
def test_one_sentence_decodes_in_the_beam_layout(arch):
    """A batch of one sentence (fairseq-interactive, the server) keeps its encoder tensors once,
    not once per hypothesis: beam search's expansion of one row is an expansion too."""
    model = build(arch)
    beam = 4
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(batch((6,))), torch.zeros(beam, dtype=torch.long))
        state = {}
        model.decoder(torch.full((beam, 1), DICT.eos()), encoder_out, incremental_state=state)
    cache = get_cache(model.decoder, state)
    assert cache.beam_size == beam
    assert all(t.size(0) == 1 for t in cache.per_beam.values())


def test_self_attention_entries_take_at_most_twice_the_steps_written():
    """A long decoding's memory: the entries buffer doubles when full (16, 32, 64 steps), so it
    never holds more than twice the steps written, nor fewer (every step stays readable), and it
    is reallocated only on doubling (a buffer grown by a constant is copied at every few steps)."""
    model = build("vaswani_transformer_tiny")
    src, beam = batch((7, 3)), 2
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src), torch.arange(2).repeat_interleave(beam))
        prev, state, capacities = torch.full((2 * beam, 1), DICT.eos()), {}, set()
        for t in range(1, 41):
            model.decoder(prev, encoder_out, incremental_state=state)
            cache = get_cache(model.decoder, state)
            for name, entries in self_attention_entries(model, cache).items():
                assert t <= entries.size(2) <= max(16, 2 * t), (t, name, entries.shape)
                capacities.add(entries.size(2))
            prev = torch.cat([prev, torch.full((2 * beam, 1), 5)], dim=1)
    assert sorted(capacities) == [16, 32, 64]


def test_reorder_encoder_out_keeps_fairseqs_contract_for_every_family():
    """After ``reorder_encoder_out(out, order)`` row n of every tensor is the fresh output's
    row order[n], for any order (fairseq's contract; ensembles and full forwards read it)."""
    src = batch((7, 3, 5))
    g = torch.Generator().manual_seed(2)
    for arch in ARCHS:
        model = build(arch)
        with torch.no_grad():
            fresh = model.encoder(src)
            out, rows = fresh, torch.arange(3)
            # beam search's expansion, an order within beams, one that drops a finished beam, then any
            within, finished = torch.tensor([1, 0, 2, 2, 5, 4]), torch.tensor([0, 1, 5, 4])
            for order in (torch.arange(3).repeat_interleave(2), within, finished, anywhere(4, g), anywhere(6, g)):
                order = order[order < rows.numel()]
                out, rows = model.encoder.reorder_encoder_out(out, order), rows[order]
                for key in fresh:
                    for got, expected in zip(out[key], fresh[key]):
                        assert torch.equal(got, expected.index_select(0, rows)), (arch, key)


# ---------------------------------------------------------------- fairseq's generator, no cache

class NoStateDecoder(FairseqDecoder):
    """The model's decoder as a plain FairseqDecoder: fairseq's generator then keeps no
    incremental state and runs the full forward over the whole prefix at every step."""

    def __init__(self, decoder):
        super().__init__(decoder.dictionary)
        self.inner = decoder

    def forward(self, prev_output_tokens, encoder_out=None, **unused):
        return self.inner(prev_output_tokens, encoder_out)

    def max_positions(self):
        return self.inner.max_positions()


class PlainReorderEncoder(FairseqEncoder):
    """The model's encoder whose output is reordered by fairseq's contract written out here (every
    tensor's row n is row ``new_order[n]``), not by the suite's ``reorder_encoder_out``, which
    also records the beam layout the cache is made from."""

    def __init__(self, encoder):
        super().__init__(encoder.dictionary)
        self.inner = encoder

    def forward(self, src_tokens, src_lengths=None, **unused):
        return self.inner(src_tokens, src_lengths)

    def reorder_encoder_out(self, encoder_out, new_order):
        return {key: [t.index_select(0, new_order) for t in tensors] for key, tensors in encoder_out.items()}

    def max_positions(self):
        return self.inner.max_positions()


def no_state(model):
    wrapped = FairseqEncoderDecoderModel(PlainReorderEncoder(model.encoder), NoStateDecoder(model.decoder))
    return wrapped.eval()


# Raises of the </s> logit tried in turn (with "ends") until sentences end at different steps
EOS_BIASES = (0.5, 1.0, 1.5, 2.0, 3.0)


def raise_eos(model, bias):
    """Adds ``bias`` to the </s> logit of the model's output layer (shared by its no-state wrapper)."""
    [layer] = [m for m in model.decoder.modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(DICT)]
    eos = torch.zeros(len(DICT))
    eos[DICT.eos()] = bias
    layer.register_forward_hook(lambda module, inputs, output: output + eos)


def ending_model(arch, options, src):
    """build(arch) with its </s> logit raised by the first of EOS_BIASES under which fairseq's
    generator drops finished sentences from the batch while the others decode on."""
    for bias in EOS_BIASES:
        model = build(arch)
        raise_eos(model, bias)
        sizes = reorder_sizes(model)
        generate([model], options, src)
        if len(set(sizes)) > 1:
            return model
    raise AssertionError(f"{arch}: no sentence left the batch before the others ended")


def reorder_sizes(model):
    """The row counts of the reorders fairseq's generator asks of ``model``'s decoder, as they happen."""
    sizes, reorder = [], model.decoder.reorder_incremental_state

    def spy(state, new_order):
        sizes.append(new_order.numel())
        return reorder(state, new_order)

    model.decoder.reorder_incremental_state = spy
    return sizes


OPTIONS = {
    "beam1": dict(beam=1),
    "beam4": dict(beam=4),
    "beam8": dict(beam=8),
    "nbest4": dict(beam=4, nbest=4),
    "nbest4-sentences-end": dict(beam=4, nbest=4, ends=True),
    "diverse-beam-groups2": dict(beam=4, diverse_beam_groups=2),
    "constraints": dict(beam=4, constraints=True),
    "prefix-size1": dict(beam=4, prefix_size=1),
    "sampling-beam2": dict(beam=2, sampling=True),
    "match-source-len": dict(beam=4, match_source_len=True),
    "print-alignment": dict(beam=4, print_alignment=True),
    "ensemble": dict(beam=4, ensemble=True),
}


def generate(models, options, src):
    """fairseq-generate's search in-process, built as fairseq's translation task builds it."""
    opts = dict(options)
    beam, nbest = opts.pop("beam"), opts.pop("nbest", 1)
    kwargs = dict(beam_size=beam, max_len_b=9, min_len=1, match_source_len=opts.pop("match_source_len", False))
    if opts.pop("sampling", False):
        kwargs["search_strategy"] = search.Sampling(DICT)
    if opts.get("diverse_beam_groups"):
        kwargs["search_strategy"] = search.DiverseBeamSearch(DICT, opts.pop("diverse_beam_groups"), 0.5)
    constraints = prefix = None
    if opts.pop("constraints", False):
        kwargs["search_strategy"] = search.LexicallyConstrainedBeamSearch(DICT, "ordered")
        constraints = pack_constraints([[torch.tensor([7 + b, 9])] for b in range(src.size(0))])
    if opts.pop("prefix_size", 0):
        prefix = torch.full((src.size(0), 1), 6)
    cls = SequenceGeneratorWithAlignment if opts.pop("print_alignment", False) else SequenceGenerator
    if cls is SequenceGeneratorWithAlignment:
        kwargs["print_alignment"] = "hard"
    opts.pop("ensemble", None)
    opts.pop("ends", None)
    assert not opts, opts
    generator = cls(models, DICT, **kwargs)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(DICT.pad()).sum(1)}}
    torch.manual_seed(0)  # sampling draws the same numbers on both sides
    with torch.no_grad():
        hypos = generator.generate(models, sample, prefix_tokens=prefix, constraints=constraints)
    return [h[:nbest] for h in hypos]


def _pairs(alignment):
    """An alignment as a list, whether fairseq gave a tensor or a list of pairs."""
    return alignment.tolist() if torch.is_tensor(alignment) else list(alignment or [])


@pytest.mark.parametrize("arch, option", [
    (arch, option) for arch in ARCHS for option in OPTIONS
    # no attention: fairseq-generate refuses --print-alignment for these families
    if not (option == "print-alignment" and arch in ("rnnencdec_tiny", "seq2seq_lstm_tiny"))])
def test_generation_equals_fairseqs_generator_without_any_cache(arch, option):
    options = OPTIONS[option]
    src = batch((7, 3, 5, 9, 4))
    models = [ending_model(arch, options, src) if options.get("ends") else build(arch)] + (
        [build(arch, seed=1)] if options.get("ensemble") else [])
    cached = generate(models, options, src)
    full = generate([no_state(m) for m in models], options, src)
    produced = 0
    for sentence, (ours, oracle) in enumerate(zip(cached, full)):
        assert len(ours) == len(oracle), sentence
        for a, b in zip(ours, oracle):
            assert torch.equal(a["tokens"], b["tokens"]), sentence
            assert abs(a["score"].item() - b["score"].item()) < TOL, sentence
            assert (a["positional_scores"] - b["positional_scores"]).abs().max() < TOL, sentence
            if a["attention"] is not None and b["attention"] is not None and a["attention"].numel():
                assert (a["attention"] - b["attention"]).abs().max() < TOL, sentence
            # fairseq leaves an empty tensor without --print-alignment, (source, target) pairs with it
            assert _pairs(a.get("alignment")) == _pairs(b.get("alignment")), sentence
            if option == "print-alignment":
                assert _pairs(a["alignment"]), sentence
            produced += a["tokens"].numel()
    assert produced > 2 * src.size(0)  # real hypotheses, not immediate EOS
