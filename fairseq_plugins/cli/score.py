"""SacreBLEU (signature printed), chrF and the Transformer paper's compound-split tokenized BLEU.

The last is the score Vaswani et al. (2017) reported for En-De; all three come from one command.

    fairseq-plugins-score --gen gen.txt --input-tokenized --lang de --out score

SacreBLEU and chrF score detokenized text with sacrebleu's defaults (BLEU: 13a tokenization,
exp smoothing; chrF2). The tokenized BLEU is what tensor2tensor's ``get_ende_bleu.sh`` and
fairseq's ``compound_split_bleu.sh`` compute for Vaswani et al. (2017), Table 2: Moses-tokenize
(sacremoses, ``--lang``), split hyphenated compounds with ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``,
then multi-bleu (sacrebleu with no tokenization and no smoothing). Inputs are detokenized
(fairseq-generate D-/T- lines with ``--tokenizer moses``, or plain files) unless
``--input-tokenized`` says they are Moses-tokenized (fairseq-generate D-/T- lines without a
``--tokenizer``): then they are detokenized for SacreBLEU/chrF and used as they are for the
tokenized BLEU. Writes PREFIX.md and PREFIX.png.
"""
import re
from typing import List

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesDetokenizer, MosesTokenizer

from fairseq_plugins.cli import _io

COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' (left to right, matches don't overlap)."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: List[str], refs: List[str]) -> BLEU:
    """multi-bleu.perl on compound-split text: BLEU with no tokenization and no smoothing."""
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    return bleu.corpus_score([compound_split(h) for h in hyps], [[compound_split(r) for r in refs]])


def plot(names, results, path):
    fig, ax = _io.plt.subplots(figsize=(max(4.5, 2.0 * len(names) + 2), 4))
    width = 0.27
    for k, label in enumerate(["SacreBLEU", "chrF", "tok. BLEU (compound split)"]):
        ax.bar([i + (k - 1) * width for i in range(len(names))], [r[k] for r in results], width=width, label=label)
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels(names)
    ax.set_ylabel("score")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _io.save_figure(fig, path)


def get_parser():
    parser = _io.ArgumentParser(prog="fairseq-plugins-score", description=__doc__.split("\n")[0])
    _io.add_system_args(parser, src_help=None)
    parser.add_argument("--lang", default="de",
                        help="target language for Moses (de)tokenization (default de, the paper's En-De)")
    parser.add_argument("--input-tokenized", action="store_true",
                        help="hypotheses/references are Moses-tokenized: detokenize them for SacreBLEU "
                        "and chrF, use them as they are for the tokenized BLEU")
    _io.add_out_arg(parser, "score")
    return parser


def cli(args):
    systems = _io.load_systems(args, need_src=False)
    tokenizer, detokenizer = MosesTokenizer(lang=args.lang), MosesDetokenizer(lang=args.lang)
    bleu, chrf = BLEU(), CHRF()
    rows, signatures, results = [], [], []
    for s in systems:
        if args.input_tokenized:
            tok_hyps, tok_refs = s.hyps, s.refs
            hyps = [detokenizer.detokenize(h.split()) for h in s.hyps]
            refs = [detokenizer.detokenize(r.split()) for r in s.refs]
        else:
            hyps, refs = s.hyps, s.refs
            tok_hyps = [tokenizer.tokenize(h, return_str=True) for h in s.hyps]
            tok_refs = [tokenizer.tokenize(r, return_str=True) for r in s.refs]
        b, c, t = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs]), tokenized_bleu(tok_hyps, tok_refs)
        results.append((b.score, c.score, t.score))
        rows.append([s.name, str(len(hyps)), _io.fmt(b.score), _io.fmt(c.score), _io.fmt(t.score)])
        signatures += [f"{s.name}: {b.format(signature=str(bleu.get_signature()))}",
                       f"{s.name}: {c.format(signature=str(chrf.get_signature()))}",
                       f"{s.name}: tokenized compound-split BLEU (moses {args.lang}, multi-bleu): {t.format()}"]
    text = _io.markdown_table(["system", "sentences", "SacreBLEU", "chrF", "tok. BLEU (compound split)"], rows)
    text += "\n" + "\n".join(f"- `{line}`" for line in signatures) + "\n"
    _io.write_text(args.out + ".md", text)
    plot([s.name for s in systems], results, args.out + ".png")
    print("\n".join(signatures))
    print(f"wrote {args.out}.md and {args.out}.png")


def main(argv=None):
    _io.run(get_parser(), cli, argv)


if __name__ == "__main__":
    main()
