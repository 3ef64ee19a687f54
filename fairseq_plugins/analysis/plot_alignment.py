"""Attention heat-maps: the weights alpha_ij of target word i on source word j (Bahdanau Fig. 3).

From ``fairseq-generate --print-alignment [hard|soft]`` output::

    fairseq-plugins-plot-alignment --gen gen.txt --ids 3,7 --join-bpe --out align/

or by running a checkpoint in-process on sentences of a binarized data set::

    fairseq-plugins-plot-alignment --path ckpt.pt --data data-bin --ids 3,7 [--teacher-forcing]

One PNG per sentence (``align/alignment-<id>.png``: source words along the top, target words
down the side, white = weight 1, black = 0) and ``align/alignments.md`` listing them.

With a checkpoint the weights are the decoder's ``extra["attn"]`` (fairseq's convention: the
built-in transformer gives its last layer averaged over heads, the LSTM its attention) from a
full forward pass over the target: the reference with ``--teacher-forcing``, otherwise the
beam-search hypothesis. Rows and columns include the end-of-sentence token ``</s>``, as do
``soft`` alignments; ``hard`` alignments (0/1, one source token per target token) do not.

``--join-bpe`` merges subword-nmt pieces (``ab@@ c`` -> ``abc``): source columns of one word
are summed (the attention mass the word receives) and target rows of one word are averaged
(each row stays a distribution over the source), so rows still sum to one.
"""
import os
from argparse import Namespace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from fairseq_plugins.analysis import generate_output, report
from fairseq_plugins.errors import ConfigError

EOS = "</s>"


def parse_ids(spec: Optional[str]) -> Optional[List[int]]:
    if spec is None:
        return None
    try:
        return [int(x) for x in spec.split(",")]
    except ValueError:
        raise ConfigError(f"--ids {spec!r}: expected comma-separated sentence ids like 0,5,12")


def matrix_from_generation(g: generate_output.Generation, path: str) -> Tuple[np.ndarray, List[str], List[str], str]:
    """(alpha [tgt_len x src_len], source tokens, target tokens, kind) of one A- line."""
    src, tgt = g.src.split(), g.hyp.split()
    kind, links = generate_output.parse_alignment(g.alignment)
    hint = "; were S-/H- printed with --post-process/--remove-bpe? Plot those without it and use --join-bpe"
    if kind == "soft":
        src, tgt = src + [EOS], tgt + [EOS]
        if len(links) != len(tgt) or any(len(row) != len(src) for row in links):
            raise ConfigError(f"--gen {path}: A-{g.id} has {len(links)} rows of {sorted({len(r) for r in links})} "
                           f"weights but S-/H- give {len(tgt)} target x {len(src)} source tokens (with </s>){hint}")
        alpha = np.array(links, dtype=float)  # [tgt_len x src_len]
    else:
        alpha = np.zeros((len(tgt), len(src)))
        for s, t in links:
            if s >= len(src) or t >= len(tgt):
                raise ConfigError(f"--gen {path}: A-{g.id} links {s}-{t} beyond the {len(src)} source / "
                               f"{len(tgt)} target tokens{hint}")
            alpha[t, s] = 1.0
    return alpha, src, tgt, kind


def word_groups(tokens: Sequence[str]) -> Tuple[List[str], np.ndarray]:
    """Words of subword-nmt tokens and the [tokens x words] 0/1 membership matrix."""
    words, member = [], np.zeros((len(tokens), len(tokens)))
    piece = ""
    for i, tok in enumerate(tokens):
        member[i, len(words)] = 1.0
        if tok.endswith("@@"):
            piece += tok[:-2]
        else:
            words.append(piece + tok)
            piece = ""
    if piece:  # a dangling "@@" piece at the end is a word of its own
        words.append(piece)
    return words, member[:, : len(words)]


def join_bpe(alpha: np.ndarray, src: Sequence[str], tgt: Sequence[str]
             ) -> Tuple[np.ndarray, List[str], List[str]]:
    """Merge BPE pieces: source columns summed, target rows averaged (see module doc)."""
    src_words, src_member = word_groups(src)  # [src_tok x src_word]
    tgt_words, tgt_member = word_groups(tgt)  # [tgt_tok x tgt_word]
    summed = alpha @ src_member  # [tgt_tok x src_word]
    averaged = (tgt_member.T @ summed) / tgt_member.sum(axis=0)[:, None]  # [tgt_word x src_word]
    return averaged, src_words, tgt_words


def draw(alpha: np.ndarray, src: Sequence[str], tgt: Sequence[str]):
    """The heat-map figure: source along the top (x), target down the side (y)."""
    plt = report.pyplot()
    width = max(3.0, 0.32 * len(src) + 1.8)
    height = max(3.0, 0.32 * len(tgt) + 1.8)
    fig, ax = plt.subplots(figsize=(width, height))
    ax.imshow(alpha, cmap="gray", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticks(range(len(src)))
    ax.set_xticklabels(src, rotation=90)
    ax.set_yticks(range(len(tgt)))
    ax.set_yticklabels(tgt)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    fig.tight_layout()
    return fig


def from_generate(args) -> List[Tuple[int, np.ndarray, List[str], List[str], str]]:
    gens = generate_output.read_generate(args.gen)
    if all(g.alignment is None for g in gens):
        raise ConfigError(f"--gen {args.gen}: no A- alignment lines; run fairseq-generate with --print-alignment "
                       "(or --print-alignment soft for the attention weights)")
    by_id = {g.id: g for g in gens}
    ids = parse_ids(args.ids) or sorted(by_id)
    out = []
    for i in ids:
        if i not in by_id:
            raise ConfigError(f"--ids: sentence {i} is not in --gen {args.gen}")
        g = by_id[i]
        generate_output.require([g], "src", args.gen, "--gen", "S- source line")
        generate_output.require([g], "alignment", args.gen, "--gen", "A- alignment line")
        out.append((i,) + matrix_from_generation(g, args.gen))
    return out


def attention_of(decoder_out) -> Optional["torch.Tensor"]:  # noqa: F821
    """extra["attn"] of a decoder output, as fairseq's SequenceGenerator reads it: [B x T x S]."""
    extra = decoder_out[1]
    attn = extra.get("attn") if isinstance(extra, dict) else extra
    if isinstance(attn, (list, tuple)):
        attn = attn[0] if attn else None
    return attn


def model_alignments(path: str, data: str, subset: str, ids: Sequence[int], teacher_forcing: bool,
                     beam: int = 5) -> List[Tuple[int, np.ndarray, List[str], List[str], str]]:
    """Run the checkpoint on sentences ``ids`` of ``subset`` and return their attention matrices."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.dataclass.configs import GenerationConfig

    generate_output.check_file(path, "--path")
    if not os.path.isdir(data):
        raise ConfigError(f"--data {data}: no such directory")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    model = models[0]
    model.make_generation_fast_(need_attn=True)  # LSTM-style decoders return attention only when asked
    model.eval()
    try:
        task.load_dataset(subset)
    except FileNotFoundError as e:
        raise ConfigError(f"--data {data} --gen-subset {subset}: {e}")
    dataset = task.dataset(subset)
    generator = None if teacher_forcing else task.build_generator([model], GenerationConfig(beam=beam))
    out = []
    for i in ids:
        if not 0 <= i < len(dataset):
            raise ConfigError(f"--ids: sentence {i} is not in {subset} ({len(dataset)} sentences)")
        sample = dataset.collater([dataset[i]])  # a batch of one: no padding
        net_input = sample["net_input"]
        with torch.no_grad():
            if teacher_forcing:
                target = sample["target"][0]  # [T] reference, ends with </s>
                prev = net_input["prev_output_tokens"]  # [1 x T] </s> + reference[:-1]
            else:
                target = task.inference_step(generator, [model], sample)[0][0]["tokens"]  # [T]
                prev = torch.cat([target.new_tensor([task.target_dictionary.eos()]), target[:-1]])[None]
            attn = attention_of(model(net_input["src_tokens"], net_input["src_lengths"], prev))
        if attn is None:
            raise ConfigError(f"--path {path}: the decoder returns no attention (extra['attn'] is None)")
        src = [task.source_dictionary[t] for t in net_input["src_tokens"][0].tolist()]
        tgt = [task.target_dictionary[t] for t in target.tolist()]
        out.append((i, attn[0].float().numpy(), src, tgt, "teacher-forced" if teacher_forcing else "generated"))
    return out


def run(args):
    if bool(args.gen) == bool(args.path):
        raise ConfigError("give either --gen (fairseq-generate output) or --path with --data and --ids")
    if args.gen:
        plots = from_generate(args)
    else:
        if args.data is None or args.ids is None:
            raise ConfigError("--path needs --data and --ids")
        if args.user_dir:
            from fairseq import utils

            utils.import_user_module(Namespace(user_dir=args.user_dir))
        plots = model_alignments(args.path, args.data, args.gen_subset, parse_ids(args.ids),
                                 args.teacher_forcing, args.beam)
    rows = []
    for i, alpha, src, tgt, kind in plots:
        if args.join_bpe:
            alpha, src, tgt = join_bpe(alpha, src, tgt)
        name = f"alignment-{i}.png"
        report.save_figure(draw(alpha, src, tgt), os.path.join(args.out, name))
        rows.append([str(i), " ".join(src), " ".join(tgt), kind, f"![sentence {i}]({name})"])
    text = report.markdown_table(["id", "source", "target", "alignment", "picture"], rows)
    report.write_text(os.path.join(args.out, "alignments.md"), text)
    print(f"wrote {len(rows)} alignment pictures and alignments.md to {args.out}")
