"""Translate with a folder written by ``fairseq-plugins-export-onnx``: numpy and onnxruntime only.

    from fairseq_plugins_onnx import Translator
    translator = Translator("model-onnx")
    [best, *_] = translator.translate([["a", "tokenized", "sentence"]])[0]
    best.tokens, best.score, best.attention

This module imports neither torch nor fairseq (it lives beside the ``fairseq_plugins`` package,
whose import installs the fairseq patches), and the exporter copies it into the folder, so the
folder runs wherever numpy and onnxruntime do.

The beam search is fairseq's ``SequenceGenerator`` with ``BeamSearch``, rule for rule: the first
step expands only the first beam; ``2 * beam`` candidates per sentence; a hypothesis ending in
``</s>`` among the first ``beam`` candidates is finished, scored by its summed log-probability
(natural log, as fairseq's generator; fairseq-generate prints it in base 2) / (length counting
``</s>``) ** lenpen; a sentence is done once ``beam`` hypotheses finished;
``<pad>`` is never chosen, ``</s>`` not at the first step, and after ``max_len = min(max_len_b,
max target positions - 1)`` tokens only ``</s>`` is. Finished sentences leave the batch. The
attention of a hypothesis is the one each step saw, as ``--print-alignment soft`` prints it: one
row per target token (``</s>`` included) over the source tokens (``</s>`` included).
"""
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnxruntime as ort

CONFIG = "config.json"
VERSION = 2  # of the folder's interface: 2, the step's state in beams (``state_kinds``)
# onnxruntime's graph rewrites left out: its fused SkipLayerNormalization (Add + LayerNormalization)
# took 7x as long as the two ops on a CPU (onnxruntime 1.32, 128 rows of 256; docs/ONNX.md)
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
TOP_K_GROUP = 32  # values per column group of top_k


@dataclass
class Hypothesis:
    tokens: List[str]  # without </s>
    ids: List[int]  # target dictionary ids, </s> included
    score: float  # log-probability / (len(ids) ** lenpen), natural log
    positional_scores: List[float]  # log-probability of each id
    attention: Optional[List[List[float]]] = None  # [len(ids)][source length with </s>]


def read_config(folder: str) -> dict:
    path = os.path.join(folder, CONFIG)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder}: no {CONFIG}; not a folder written by fairseq-plugins-export-onnx")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("version") != VERSION:
        raise ValueError(f"{path}: version {config.get('version')}, this runtime reads version {VERSION}; "
                         f"export the checkpoint again, or use the fairseq_plugins_onnx.py in the folder")
    return config


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's ``k`` largest values, largest first, ties in index order:
    ``np.argsort(-x, axis=1, kind="stable")[:, :k]`` in one pass over ``x``. The columns fall into
    groups (c, c + g, c + 2g, ...); the k-th largest group maximum has k values at or above it,
    so no row's k-th value is below it: only the groups whose maximum reaches it are read again,
    and only their values that reach it are sorted (a partition of every value took 10% of the
    int8 decoding of the cpu-preset Transformer)."""
    n, width = x.shape
    groups = -(-width // TOP_K_GROUP)  # g
    if groups <= k:  # too few groups to leave any out
        bound = -np.partition(-x, k - 1, axis=1)[:, k - 1:k]
        rows, cols = np.nonzero(x >= bound)
    else:
        padded = x
        if width % TOP_K_GROUP:
            padded = np.full((n, groups * TOP_K_GROUP), -np.inf, dtype=x.dtype)
            padded[:, :width] = x
        members = padded.reshape(n, TOP_K_GROUP, groups)  # [n, member, group]
        maxima = members.max(axis=1)  # [n, g]
        bound = -np.partition(-maxima, k - 1, axis=1)[:, k - 1:k]
        rows, group = np.nonzero(maxima >= bound)
        hit, member = np.nonzero(members[rows, :, group] >= bound[rows])
        rows, cols = rows[hit], member * groups + group[hit]
        real = cols < width  # a bound of -inf also takes the padding
        rows, cols = rows[real], cols[real]
    order = np.lexsort((cols, -x[rows, cols], rows))  # by row, then value descending, then index
    rows, cols = rows[order], cols[order]
    return cols[np.searchsorted(rows, np.arange(n))[:, None] + np.arange(k)]


class RowBuffers:
    """Memory reused by one translation's gathers of state rows (the expansion into beams, every
    step's reorder, the selection of the sentences that go on), two buffers per state tensor: a
    fresh array per gather (megabytes each for a Transformer's self-attention state) cost a fresh
    process 15-20% of its CPU time, mostly the kernel's page faults (docs/ONNX.md#speed)."""

    def __init__(self):
        self._memory: Dict[str, List[Optional[np.ndarray]]] = {}  # name -> its two buffers

    def take(self, name: str, tensor: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``tensor[rows]`` in one of ``name``'s two buffers, the one ``tensor`` does not use (so a
        selection from the last result reads memory it does not write); valid until the next call
        for ``name`` that does not read it."""
        shape = (len(rows),) + tensor.shape[1:]
        size = int(np.prod(shape))
        buffers = self._memory.setdefault(name, [None, None])
        i = int(buffers[0] is not None and np.may_share_memory(tensor, buffers[0]))
        if buffers[i] is None or buffers[i].size < size or buffers[i].dtype != tensor.dtype:
            buffers[i] = np.empty(2 * size, tensor.dtype)  # room for later steps
        out = buffers[i][:size].reshape(shape)
        return np.take(tensor, rows, axis=0, out=out, mode="clip")  # valid rows; "raise" would copy first


class Translator:
    """The folder's two ONNX Runtime sessions and its vocabularies; :meth:`translate` runs beam search."""

    def __init__(self, folder: str, threads: int = 1):
        self.folder, self.config = folder, read_config(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        self.encoder, self.step = (
            ort.InferenceSession(os.path.join(folder, name), options, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=DISABLED_OPTIMIZERS)
            for name in ("encoder.onnx", "decoder_step.onnx"))
        self.names, self.kinds = self.config["state"], self.config["state_kinds"]
        # the step returns every state tensor but the sentences' (the encoder's), which it only reads
        self.carried = [name for name in self.names if self.kinds[name] != "sentences"]
        self.source_vocabulary, self.target_vocabulary = (
            self._vocabulary(self.config["vocabularies"][side]) for side in ("source", "target"))
        self.source_index = {symbol: i for i, symbol in reversed(list(enumerate(self.source_vocabulary)))}
        special = self.config["special"]
        self.pad, self.eos, self.unk = special["pad"], special["eos"], special["unk"]
        self.has_attention = self.config["attention"]

    def _vocabulary(self, name: str) -> List[str]:
        with open(os.path.join(self.folder, name), encoding="utf-8") as f:
            return json.load(f)

    def encode(self, tokens: Sequence[str]) -> List[int]:
        """Source ids ending in </s>, unknown tokens as <unk> (fairseq's ``encode_line``)."""
        return [self.source_index.get(t, self.unk) for t in tokens] + [self.eos]

    def translate(self, sources: Sequence[Sequence[str]], beam: Optional[int] = None, n_best: int = 1,
                  lenpen: Optional[float] = None, max_len_b: Optional[int] = None,
                  batch_size: int = 32) -> List[List[Hypothesis]]:
        """The ``n_best`` best hypotheses of each source (subword tokens), best first."""
        beam = beam or self.config["beam"]
        lenpen = self.config["lenpen"] if lenpen is None else lenpen
        max_len = min(max_len_b or self.config["max_len_b"], self.config["max_target_positions"] - 1)
        if not 1 <= n_best <= beam:
            raise ValueError(f"n_best {n_best}: must be in [1, beam {beam}]")
        ids = [self.encode(tokens) for tokens in sources]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # batches of like lengths
        buffers = RowBuffers()  # per call: concurrent translations share no memory
        out: List[List[Hypothesis]] = [[] for _ in ids]
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            width = max(len(ids[i]) for i in chunk)
            src = np.full((len(chunk), width), self.pad, dtype=np.int64)
            for row, i in enumerate(chunk):  # left-padded, as fairseq's LanguagePairDataset
                src[row, width - len(ids[i]):] = ids[i]
            for row, (i, hypos) in enumerate(zip(chunk, self._beam_search(src, beam, lenpen, max_len, buffers))):
                length = len(ids[i])
                out[i] = [self._hypothesis(h, width - length) for h in hypos[:n_best]]
        return out

    def _hypothesis(self, h: dict, padding: int) -> Hypothesis:
        attention = None if h["attention"] is None else h["attention"][padding:].T.tolist()
        return Hypothesis([self.target_vocabulary[i] for i in h["ids"][:-1]], h["ids"], h["score"],
                          h["positional_scores"], attention)

    def _run_step(self, prev: np.ndarray, state: dict):
        """(log-probabilities, the new state, the attention row or None); ``prev`` [R, G],
        ``state``: name -> tensor."""
        outputs = self.step.run(None, {"prev_token": prev, **state})
        n = len(self.carried)
        state = {**state, **dict(zip(self.carried, outputs[1:1 + n]))}
        return outputs[0], state, outputs[1 + n] if self.has_attention else None

    def _beam_search(self, src: np.ndarray, beam: int, lenpen: float, max_len: int,
                     buffers: RowBuffers) -> List[List[dict]]:
        bsz, src_len = src.shape
        # the state is in beams (docs/ONNX.md): G = 1 until the first step has run, every
        # hypothesis of a beam starting the same; the first reorder makes beams of G = beam
        state = dict(zip(self.names, self.encoder.run(None, {"src_tokens": src})))
        tokens = np.full((bsz * beam, max_len + 2), self.pad, dtype=np.int64)
        tokens[:, 0] = self.eos
        scores = np.zeros((bsz * beam, max_len + 1), dtype=np.float32)
        attn = np.zeros((bsz * beam, src_len, max_len + 2), dtype=np.float32) if self.has_attention else None
        finalized: List[List[dict]] = [[] for _ in range(bsz)]
        finished = [False] * bsz
        sentences = np.arange(bsz)  # the sentence of each row group still in the batch
        cands_to_ignore = np.zeros((bsz, beam), dtype=bool)
        cand_size = 2 * beam
        reorder = kept = None
        for step in range(max_len + 1):
            if reorder is not None:
                state = self._reorder(state, reorder, kept, beam, step == 1, buffers)
            prev = tokens[::beam, :1].copy() if step == 0 else tokens[:, step].reshape(bsz, beam)
            lprobs, state, step_attn = self._run_step(prev, state)
            if step == 0 and step_attn is not None:  # a row per hypothesis
                step_attn = step_attn.repeat(beam, axis=0)
            np.copyto(lprobs, -np.inf, where=np.isnan(lprobs))  # in place: the step's own float32 output
            lprobs[:, self.pad] = -np.inf
            if step >= max_len:  # only </s> is left
                lprobs[:, :self.eos] = -np.inf
                lprobs[:, self.eos + 1:] = -np.inf
            elif step < 1:  # --min-len 1
                lprobs[:, self.eos] = -np.inf
            if attn is not None:
                attn[:, :, step + 1] = step_attn
            vocab = lprobs.shape[1]
            candidates = lprobs.reshape(bsz, -1, vocab)  # [bsz, 1, vocab] at the first step
            if step > 0:
                candidates += scores.reshape(bsz, beam, -1)[:, :, step - 1][:, :, None]
            flat = candidates.reshape(bsz, -1)
            k = min(cand_size, flat.shape[1] - 1)  # -1: never <pad>
            top = top_k(flat, k)
            cand_scores = np.take_along_axis(flat, top, axis=1)
            cand_beams, cand_indices = top // vocab, top % vocab
            offsets = (np.arange(bsz) * beam)[:, None]
            cand_bbsz_idx = cand_beams + offsets
            eos_mask = (cand_indices == self.eos) & (cand_scores != -np.inf)
            eos_mask[:, :beam][cands_to_ignore] = False
            done_rows: List[int] = []
            first = eos_mask[:, :beam]
            if first.any():
                done_rows = self._finalize(step, cand_bbsz_idx[:, :beam][first], cand_scores[:, :beam][first],
                                           tokens, scores, attn, finalized, finished, sentences, beam, lenpen,
                                           max_len)
            if all(finished):
                break
            kept = None
            if done_rows:  # finished sentences leave the batch
                kept = np.array([r for r in range(bsz) if r not in set(done_rows)])
                bsz = len(kept)
                eos_mask, cand_beams = eos_mask[kept], cand_beams[kept]
                cand_scores, cand_indices = cand_scores[kept], cand_indices[kept]
                cand_bbsz_idx = cand_beams + (np.arange(bsz) * beam)[:, None]
                cands_to_ignore, sentences = cands_to_ignore[kept], sentences[kept]
                kept_rows = (kept[:, None] * beam + np.arange(beam)).reshape(-1)
                tokens, scores = tokens[kept_rows], scores[kept_rows]
                attn = attn[kept_rows] if attn is not None else None
            eos_mask[:, :beam] = cands_to_ignore | eos_mask[:, :beam]
            active_mask = eos_mask * cand_size + np.arange(eos_mask.shape[1])
            active_hypos = np.argsort(active_mask, axis=1, kind="stable")[:, :beam]
            cands_to_ignore = np.take_along_axis(active_mask, active_hypos, axis=1) >= cand_size
            active_bbsz_idx = np.take_along_axis(cand_bbsz_idx, active_hypos, axis=1).reshape(-1)
            tokens[:, :step + 1] = tokens[active_bbsz_idx, :step + 1]
            tokens.reshape(bsz, beam, -1)[:, :, step + 1] = np.take_along_axis(cand_indices, active_hypos, axis=1)
            if step > 0:
                scores[:, :step] = scores[active_bbsz_idx, :step]
            scores.reshape(bsz, beam, -1)[:, :, step] = np.take_along_axis(cand_scores, active_hypos, axis=1)
            if attn is not None:
                attn[:, :, :step + 2] = attn[active_bbsz_idx, :, :step + 2]
            # the state's rows are still those before the finished sentences left, one per
            # sentence after the first step
            reorder = active_bbsz_idx if kept is None else (kept[active_bbsz_idx // beam] * beam
                                                            + active_bbsz_idx % beam)
            if step == 0:
                reorder = reorder // beam
        return [sorted(hypos, key=lambda h: -h["score"]) for hypos in finalized]

    def _reorder(self, state: dict, rows: np.ndarray, beams: Optional[np.ndarray], beam: int, first: bool,
                 buffers: RowBuffers) -> dict:
        """The state of the next step, in beams of ``beam``: hypothesis n (of the R·G, beam-major)
        continues old hypothesis ``rows[n]``, so the ``rows`` and ``slots`` take those; the
        ``sentences`` and ``entries`` stay where they are, but for the beams that go on (``beams``,
        None: all), and after the ``first`` step each beam's one hypothesis has ``beam`` entry
        slots, copies of its one. Nothing per step grows with the target length (the entries'
        reorder was 10% of the cpu-preset Transformer's int8 decoding, docs/ONNX.md)."""
        out = {}
        for name, tensor in state.items():
            kind = self.kinds[name]
            if kind in ("rows", "slots"):  # [R, G, ...]
                flat = tensor.reshape((tensor.shape[0] * tensor.shape[1],) + tensor.shape[2:])
                out[name] = buffers.take(name, flat, rows).reshape((len(rows) // beam, beam) + tensor.shape[2:])
                continue
            if beams is not None:
                tensor = buffers.take(name, tensor, beams)
            out[name] = np.repeat(tensor, beam, axis=3) if first and kind == "entries" else tensor
        return out

    def _finalize(self, step, bbsz_idx, eos_scores, tokens, scores, attn, finalized, finished, sentences,
                  beam, lenpen, max_len) -> List[int]:
        """Record the hypotheses ending at ``step``; the batch rows whose sentence is now done."""
        ids = tokens[bbsz_idx, 1:step + 2].copy()
        ids[:, step] = self.eos
        positional = scores[bbsz_idx, :step + 1].copy()
        positional[:, step] = eos_scores
        positional[:, 1:] = positional[:, 1:] - positional[:, :-1]
        normalized = eos_scores / (step + 1) ** lenpen
        seen = []
        for i, row_beam in enumerate(bbsz_idx):
            row = int(row_beam) // beam
            sentence = sentences[row]
            if row not in seen:
                seen.append(row)
            if len(finalized[sentence]) < beam:
                finalized[sentence].append({
                    "ids": ids[i].tolist(), "score": float(normalized[i]),
                    "positional_scores": positional[i].tolist(),
                    "attention": attn[row_beam, :, 1:step + 2].copy() if attn is not None else None})
        done = []
        for row in seen:
            sentence = sentences[row]
            if not finished[sentence] and (len(finalized[sentence]) == beam or step == max_len):
                finished[sentence] = True
                done.append(row)
        return done
