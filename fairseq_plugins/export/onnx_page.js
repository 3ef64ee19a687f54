// The page of a folder written by fairseq-plugins-export-onnx: everything runs here, in the browser,
// with onnxruntime-web (WebAssembly) and the folder's files; nothing is requested from elsewhere.
// The beam search is fairseq's, as in fairseq_plugins_onnx.py (the Python runtime): read that
// module's documentation for the rules; this is the same algorithm for one sentence.
"use strict";

const NEG_INF = -Infinity;

async function readJson(name) {
  const response = await fetch(name);
  if (!response.ok) throw new Error(`${name}: ${response.status}`);
  return response.json();
}

async function readText(name) {
  const response = await fetch(name);
  if (!response.ok) throw new Error(`${name}: ${response.status}`);
  return response.text();
}

// subword-nmt's apply_bpe (BPE.segment_tokens without glossaries or dropout), merge for merge.
class Bpe {
  constructor(codesText, separator = "@@") {
    let lines = codesText.split("\n");
    this.version = [0, 1];
    if (lines.length && lines[0].startsWith("#version:")) {
      this.version = lines[0].split(":")[1].trim().split(".").map(Number);
      lines = lines.slice(1);
    }
    this.ranks = new Map();
    lines.forEach((line, rank) => {
      const pair = line.replace(/^[\r\n ]+|[\r\n ]+$/g, "").split(" ");
      if (pair.length !== 2) return;
      const key = pair[0] + " " + pair[1];
      if (!this.ranks.has(key)) this.ranks.set(key, rank);  // the first occurrence ranks
    });
    this.separator = separator;
    this.cache = new Map();
  }

  encodeWord(orig) {
    if (this.cache.has(orig)) return this.cache.get(orig);
    const chars = Array.from(orig);
    if (chars.length === 1) return [orig];
    let word = this.version[0] === 0 && this.version[1] === 1
      ? [...chars, "</w>"] : [...chars.slice(0, -1), chars[chars.length - 1] + "</w>"];
    while (word.length > 1) {
      let best = null;
      for (let i = 0; i + 1 < word.length; i++) {
        const rank = this.ranks.get(word[i] + " " + word[i + 1]);
        if (rank !== undefined && (best === null || rank < best.rank)) best = { rank, first: word[i], second: word[i + 1] };
      }
      if (best === null) break;
      const merged = [];
      let i = 0;
      while (i < word.length) {
        if (i + 1 < word.length && word[i] === best.first && word[i + 1] === best.second) {
          merged.push(best.first + best.second);
          i += 2;
        } else {
          merged.push(word[i]);
          i += 1;
        }
      }
      word = merged;
    }
    if (word[word.length - 1] === "</w>") word = word.slice(0, -1);
    else if (word[word.length - 1].endsWith("</w>")) word[word.length - 1] = word[word.length - 1].slice(0, -4);
    this.cache.set(orig, word);
    return word;
  }

  // a line as subword-nmt's process_line segments it (words split on single spaces)
  encode(line) {
    const out = [];
    for (const token of line.replace(/^[\r\n ]+|[\r\n ]+$/g, "").split(" ")) {
      if (!token) continue;
      const pieces = this.encodeWord(token);
      pieces.slice(0, -1).forEach((p) => out.push(p + this.separator));
      out.push(pieces[pieces.length - 1]);
    }
    return out;
  }

  decode(tokens) {
    return (tokens.join(" ") + " ").split(this.separator + " ").join("").trim();
  }
}

// The state is in beams (docs/ONNX.md): rows [R, G, ...] and slots [R, G, t] hold one row per
// hypothesis, beam-major; the encoder's tensors [R, ...] and the self-attention entries
// [R, h, t, G, d_k] stay where they are. The page translates one sentence: R = 1.

// A [R, G, ...] tensor's hypotheses in a new order (beam search's reorder), in beams of `beam`.
function takeHypotheses(tensor, rows, beam) {
  const [r, g, ...rest] = tensor.dims;
  const per = tensor.data.length / (r * g);
  const data = new tensor.data.constructor(rows.length * per);
  rows.forEach((row, k) => data.set(tensor.data.subarray(row * per, (row + 1) * per), k * per));
  return new ort.Tensor(tensor.type, data, [rows.length / beam, beam, ...rest]);
}

// Entries [R, h, t, 1, d_k] of one hypothesis per beam as `beam` copies: [R, h, t, beam, d_k].
function repeatEntries(tensor, beam) {
  const [r, h, t, , d] = tensor.dims;
  const data = new tensor.data.constructor(tensor.data.length * beam);
  for (let block = 0; block < r * h * t; block++) {
    for (let g = 0; g < beam; g++) data.set(tensor.data.subarray(block * d, (block + 1) * d), (block * beam + g) * d);
  }
  return new ort.Tensor(tensor.type, data, [r, h, t, beam, d]);
}

// The encoder's state (G = 1) as beams of `beam` copies, before the first step.
function expandBeams(tensor, kind, beam) {
  if (kind === "entries") return repeatEntries(tensor, beam);
  return kind === "sentences" ? tensor : takeHypotheses(tensor, new Array(beam).fill(0), beam);
}

class Translator {
  static async load() {
    ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation, which a static server lacks
    ort.env.wasm.wasmPaths = "./";
    const t = new Translator();
    t.config = await readJson("config.json");
    t.source = await readJson(t.config.vocabularies.source);
    t.target = await readJson(t.config.vocabularies.target);
    t.sourceIndex = new Map();
    t.source.forEach((symbol, i) => { if (!t.sourceIndex.has(symbol)) t.sourceIndex.set(symbol, i); });
    const pre = t.config.preprocessing;
    t.bpe = pre.bpe === "subword_nmt" ? new Bpe(await readText(pre.bpe_codes)) : null;
    t.pieces = pre.bpe === "sentencepiece" ? new Unigram(await readJson("sentencepiece.json")) : null;
    const options = { executionProviders: ["wasm"] };
    t.encoder = await ort.InferenceSession.create("encoder.onnx", options);
    t.step = await ort.InferenceSession.create("decoder_step.onnx", options);
    return t;
  }

  // raw text -> source subword tokens (see docs/ONNX.md: no Moses step in the page)
  sourceTokens(text) {
    if (this.pieces) return this.pieces.encode(text);
    const words = text.trim().split(/\s+/).filter((w) => w);
    return this.bpe ? this.bpe.encode(words.join(" ")) : words;
  }

  detokenize(tokens) {
    if (this.pieces) return tokens.join("").split("\u2581").join(" ").trim();
    return this.bpe ? this.bpe.decode(tokens) : tokens.join(" ");
  }

  async translate(text, beam) {
    const tokens = this.sourceTokens(text);
    const { eos, unk, pad } = this.config.special;
    const ids = [...tokens.map((t) => this.sourceIndex.has(t) ? this.sourceIndex.get(t) : unk), eos];
    const best = (await this.beamSearch(ids, beam || this.config.beam))[0];
    const words = best.ids.slice(0, -1).map((i) => this.target[i]);
    return { tokens, ids, hypothesis: best, words, text: this.detokenize(words), pad };
  }

  async beamSearch(ids, beam) {
    const { eos, pad } = this.config.special;
    const names = this.config.state;
    const kinds = this.config.state_kinds;
    const lenpen = this.config.lenpen;
    const maxLen = Math.min(this.config.max_len_b, this.config.max_target_positions - 1);
    const src = new ort.Tensor("int64", BigInt64Array.from(ids.map(BigInt)), [1, ids.length]);
    const encoded = await this.encoder.run({ src_tokens: src });
    let state = names.map((name) => expandBeams(encoded[name], kinds[name], beam));
    let hyps = Array.from({ length: beam }, () => ({ tokens: [], scores: [], attention: [] }));
    const finalized = [];
    let ignore = new Array(beam).fill(false);
    const candSize = 2 * beam;
    for (let step = 0; step <= maxLen; step++) {
      const prev = hyps.map((h) => BigInt(step === 0 ? eos : h.tokens[step - 1]));
      const feeds = { prev_token: new ort.Tensor("int64", BigInt64Array.from(prev), [1, beam]) };
      names.forEach((name, k) => { feeds[name] = state[k]; });
      const out = await this.step.run(feeds);
      // the step returns every state tensor but the encoder's, which it only reads
      state = names.map((name, k) => (kinds[name] === "sentences" ? state[k] : out[`next.${name}`]));
      const lprobs = out.log_probs.data;
      const vocab = out.log_probs.dims[1];
      const attention = this.config.attention ? out.attention.data : null;
      const srcLen = ids.length;
      // the candidates: (score, beam row, token), best first; ties in index order as a stable sort
      const candidates = [];
      const rows = step === 0 ? 1 : beam;
      for (let b = 0; b < rows; b++) {
        const base = step === 0 ? 0 : hyps[b].scores[step - 1];
        for (let v = 0; v < vocab; v++) {
          let lp = lprobs[b * vocab + v];
          if (Number.isNaN(lp) || v === pad) lp = NEG_INF;
          if (step >= maxLen && v !== eos) lp = NEG_INF;
          else if (step < 1 && v === eos) lp = NEG_INF;
          candidates.push({ score: Math.fround(base + lp), beam: b, token: v, order: b * vocab + v });
        }
      }
      candidates.sort((x, y) => (y.score - x.score) || (x.order - y.order) || 0);
      const top = candidates.slice(0, Math.min(candSize, candidates.length - 1));
      const rowAttention = (b) => attention ? Array.from(attention.subarray(b * srcLen, (b + 1) * srcLen)) : null;
      // finished: </s> among the first `beam` candidates, not of an ignored slot
      const eosMask = top.map((c, k) => c.token === eos && c.score !== NEG_INF && !(k < beam && ignore[k]));
      let finished = false;
      for (let k = 0; k < beam && k < top.length; k++) {
        if (!eosMask[k]) continue;
        const c = top[k];
        const h = hyps[c.beam];
        if (finalized.length < beam) {
          const cumulative = [...h.scores.slice(0, step), c.score];
          finalized.push({
            ids: [...h.tokens.slice(0, step), eos],
            score: Math.fround(c.score / Math.pow(step + 1, lenpen)),
            positional: cumulative.map((s, i) => (i === 0 ? s : s - cumulative[i - 1])),
            attention: attention ? [...h.attention.slice(0, step), rowAttention(c.beam)] : null,
          });
        }
      }
      if (finalized.length === beam || step === maxLen) finished = true;
      if (finished) break;
      // the next beam: the first `beam` candidates not finished
      const active = top.map((c, k) => ({ k, key: (k < beam ? (ignore[k] || eosMask[k]) : eosMask[k]) ? candSize + k : k }))
        .sort((x, y) => x.key - y.key).slice(0, beam);
      ignore = active.map((a) => a.key >= candSize);
      const order = active.map((a) => top[a.k].beam);
      hyps = active.map((a) => {
        const c = top[a.k];
        const h = hyps[c.beam];
        return {
          tokens: [...h.tokens.slice(0, step), c.token],
          scores: [...h.scores.slice(0, step), c.score],
          attention: attention ? [...h.attention.slice(0, step), rowAttention(c.beam)] : [],
        };
      });
      const moves = (kind) => kind === "rows" || kind === "slots";
      state = state.map((tensor, k) => (moves(kinds[names[k]]) ? takeHypotheses(tensor, order, beam) : tensor));
    }
    return finalized.sort((x, y) => y.score - x.score);
  }
}

// sentencepiece's unigram segmentation: its default normalization (NFKC, runs of spaces as one,
// "\u2581" before each word), Viterbi over the pieces' scores (ties to the earliest start), an
// unknown character where no one-character piece exists (scored as sentencepiece does), runs of
// unknown characters merged into one piece.
class Unigram {
  constructor(model) {
    this.pieces = new Map(model.pieces.map(([piece, score]) => [piece, score]));
    this.unkScore = model.unk_score;
    this.maxLength = Math.max(...model.pieces.map(([piece]) => Array.from(piece).length));
  }

  encode(text) {
    const normalized = "\u2581" + text.normalize("NFKC").trim().split(/ +/).join("\u2581");
    const chars = Array.from(normalized);
    const best = [{ score: 0, start: -1, piece: null, unk: false }];
    for (let end = 1; end <= chars.length; end++) {
      let choice = null;
      for (let start = Math.max(0, end - this.maxLength); start < end; start++) {
        const piece = chars.slice(start, end).join("");
        let score = this.pieces.get(piece);
        const unk = score === undefined && start === end - 1;
        if (unk) score = this.unkScore;
        if (score === undefined || !best[start]) continue;
        const total = best[start].score + score;
        if (choice === null || total > choice.score) choice = { score: total, start, piece, unk };
      }
      best.push(choice);
    }
    const out = [];
    let previousUnk = false;
    for (let end = chars.length; end > 0; end = best[end].start) {
      const node = best[end];
      if (node.unk && previousUnk) out[0] = node.piece + out[0];
      else out.unshift(node.piece);
      previousUnk = node.unk;
    }
    return out;
  }
}
