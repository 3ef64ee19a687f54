"""BLEU on all sentences and on the No-UNK subset (Bahdanau et al. 2015, Table 1).

    fairseq-plugins-nounk-bleu --gen RNNsearch=gen.txt --src-vocab data-bin/dict.en.txt \\
        --tgt-vocab data-bin/dict.fr.txt --top 30000 --out nounk

A sentence is in the No-UNK subset when neither its source nor its reference has an
out-of-vocabulary token. A side with a vocabulary (``--src-vocab``/``--tgt-vocab``: a fairseq
``dict.*.txt`` or a one-word-per-line list, first column read, ``--top N`` keeps the N first
entries, i.e. the N most frequent of a fairseq dictionary) is checked token by token against it;
a side without one is checked for the unknown-word token (``<unk>`` in S- lines, fairseq's
escaped ``<<unk>>`` in T- lines). Tokens are the whitespace-separated tokens of the S-/T- lines
or of --src/--ref. Writes PREFIX.md and PREFIX.png.
"""
from typing import Callable, List, Optional, Set

from sacrebleu.metrics import BLEU

from fairseq_plugins.analysis import generate_output, report
from fairseq_plugins.errors import ConfigError


def read_vocab(path: str, flag: str, top: Optional[int]) -> Set[str]:
    words = [line.split()[0] for line in generate_output.read_lines(path, flag) if line.strip()]
    return set(words if top is None else words[:top])


def known_by_vocab(vocab: Set[str]) -> Callable[[str], bool]:
    return lambda sentence: all(tok in vocab for tok in sentence.split())


def known_by_unk(unk: str) -> Callable[[str], bool]:
    unks = {unk, f"<{unk}>"}  # fairseq-generate writes the reference's <unk> as <<unk>>
    return lambda sentence: not any(tok in unks for tok in sentence.split())


def no_unk_indices(system: generate_output.System, src_known, ref_known) -> List[int]:
    return [i for i, (s, r) in enumerate(zip(system.srcs, system.refs)) if src_known(s) and ref_known(r)]


def score(system: generate_output.System, idx: List[int], tokenize: str) -> Optional[float]:
    if not idx:
        return None
    return BLEU(tokenize=tokenize).corpus_score([system.hyps[i] for i in idx],
                                                [[system.refs[i] for i in idx]]).score


def plot(names, all_bleu, nounk_bleu, path):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(names) + 2), 4))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [b or 0.0 for b in all_bleu], width=0.4, label="All")
    ax.bar([i + 0.2 for i in x], [b or 0.0 for b in nounk_bleu], width=0.4, label="No UNK")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names)
    ax.set_ylabel("BLEU score")
    ax.legend()
    fig.tight_layout()
    report.save_figure(fig, path)


def run(args):
    if args.top is not None and args.top <= 0:
        raise ConfigError(f"--top {args.top}: must be positive")
    src_known = (known_by_vocab(read_vocab(args.src_vocab, "--src-vocab", args.top))
                 if args.src_vocab else known_by_unk(args.unk))
    ref_known = (known_by_vocab(read_vocab(args.tgt_vocab, "--tgt-vocab", args.top))
                 if args.tgt_vocab else known_by_unk(args.unk))
    systems = generate_output.load_systems(args, need_src=True)
    rows, all_bleu, nounk_bleu = [], [], []
    for s in systems:
        idx = no_unk_indices(s, src_known, ref_known)
        all_bleu.append(score(s, list(range(len(s.hyps))), args.tokenize))
        nounk_bleu.append(score(s, idx, args.tokenize))
        rows.append([s.name, str(len(s.hyps)), report.fmt(all_bleu[-1]), str(len(idx)), report.fmt(nounk_bleu[-1])])
    text = report.markdown_table(["system", "sentences (All)", "BLEU (All)", "sentences (No UNK)", "BLEU (No UNK)"],
                              rows)
    report.write_text(args.out + ".md", text)
    plot([s.name for s in systems], all_bleu, nounk_bleu, args.out + ".png")
    print(text, end="")
    print(f"wrote {args.out}.md and {args.out}.png")
