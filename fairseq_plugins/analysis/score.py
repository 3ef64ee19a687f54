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

from fairseq_plugins.analysis import generate_output, report

COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' (left to right, matches don't overlap)."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: List[str], refs: List[str]) -> BLEU:
    """multi-bleu.perl on compound-split text: BLEU with no tokenization and no smoothing."""
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    return bleu.corpus_score([compound_split(h) for h in hyps], [[compound_split(r) for r in refs]])


def plot(names, results, path):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 2.0 * len(names) + 2), 4))
    width = 0.27
    for k, label in enumerate(["SacreBLEU", "chrF", "tok. BLEU (compound split)"]):
        ax.bar([i + (k - 1) * width for i in range(len(names))], [r[k] for r in results], width=width, label=label)
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels(names)
    ax.set_ylabel("score")
    ax.legend(fontsize=8)
    fig.tight_layout()
    report.save_figure(fig, path)


def run(args):
    systems = generate_output.load_systems(args, need_src=False)
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
        rows.append([s.name, str(len(hyps)), report.fmt(b.score), report.fmt(c.score), report.fmt(t.score)])
        signatures += [f"{s.name}: {b.format(signature=str(bleu.get_signature()))}",
                       f"{s.name}: {c.format(signature=str(chrf.get_signature()))}",
                       f"{s.name}: tokenized compound-split BLEU (moses {args.lang}, multi-bleu): {t.format()}"]
    text = report.markdown_table(["system", "sentences", "SacreBLEU", "chrF", "tok. BLEU (compound split)"], rows)
    text += "\n" + "\n".join(f"- `{line}`" for line in signatures) + "\n"
    report.write_text(args.out + ".md", text)
    plot([s.name for s in systems], results, args.out + ".png")
    print("\n".join(signatures))
    print(f"wrote {args.out}.md and {args.out}.png")
