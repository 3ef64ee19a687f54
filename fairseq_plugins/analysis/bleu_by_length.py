"""BLEU and chrF by source-sentence length, one line per system (Bahdanau et al. 2015, Fig. 2).

    fairseq-plugins-bleu-by-length --gen RNNsearch-50=gen50.txt --gen RNNencdec-50=genenc.txt \\
        --out length

By default the buckets come from the data: equal-count sixths of the sources' lengths, thirds
when a sixth would hold fewer than 100 sentences, labelled ``a-b`` with both ends included, the
last one ending at the longest source (as the quickstart labels its thirds). With ``--buckets``
a sentence goes to the bucket ``a-b`` when a <= source length < b (the last bucket is ``a+``).
The source length counts whitespace tokens of the source, where subword-nmt pieces ending in
``@@`` are not counted, so a BPE'd source is measured in words. Each bucket is scored as its
own corpus with sacrebleu (``corpus_bleu``/``corpus_chrf``). Writes PREFIX.md and PREFIX.png.
"""
import math
from typing import List, Optional, Sequence, Tuple

from sacrebleu.metrics import BLEU, CHRF

from fairseq_plugins.analysis import generate_output, report
from fairseq_plugins.errors import ConfigError

PAPER_EDGES = "0,10,20,30,40,50,60,70,80"  # Bahdanau et al.'s Fig. 2
SIXTH = 100  # the fewest sentences a bucket of the default sixths holds


def parse_edges(spec: str) -> List[int]:
    try:
        edges = [int(x) for x in spec.split(",")]
    except ValueError:
        raise ConfigError(f"--buckets {spec!r}: expected comma-separated integers like {PAPER_EDGES}")
    if not edges or edges != sorted(set(edges)) or edges[0] < 0:
        raise ConfigError(f"--buckets {spec!r}: edges must be non-negative and strictly increasing")
    return edges


def bucket_labels(edges: Sequence[int], longest: Optional[int] = None) -> List[str]:
    """``a-b`` of a <= length < b, the last ``a+``; given the ``longest`` length, ``a-b`` with b included."""
    if longest is None:
        return [f"{a}-{b}" for a, b in zip(edges, edges[1:])] + [f"{edges[-1]}+"]
    return [f"{a}-{b - 1}" for a, b in zip(edges, [*edges[1:], longest + 1])]


def quantile_edges(lengths: Sequence[int], parts: int) -> list:
    """Bucket edges that cut ``lengths`` into ``parts`` groups of about equal size.

    Bucket ``i`` holds the lengths ``edges[i] <= n < edges[i + 1]`` (the last one is open);
    tied lengths can merge buckets, so fewer than ``parts`` may come back.
    """
    ordered = sorted(lengths)
    edges = [ordered[0]] + [ordered[len(ordered) * k // parts] for k in range(1, parts)]
    return sorted(set(edges))


def data_edges(lengths: Sequence[int]) -> List[int]:
    """The default buckets: equal-count sixths of ``lengths``, thirds for fewer than 6 * SIXTH sentences."""
    return quantile_edges(lengths, 6 if len(lengths) >= 6 * SIXTH else 3)


def source_length(src: str) -> int:
    """Words of a source line: whitespace tokens, ``@@`` continuation pieces not counted."""
    return sum(1 for tok in src.split() if not tok.endswith("@@"))


def bucket_of(length: int, edges: Sequence[int]) -> Optional[int]:
    """Index of the bucket holding ``length`` (None below the first edge)."""
    index = None
    for i, edge in enumerate(edges):
        if length >= edge:
            index = i
    return index


def scores_by_bucket(system: generate_output.System, edges: Sequence[int], tokenize: str
                     ) -> List[Tuple[int, Optional[float], Optional[float]]]:
    """(sentences, BLEU, chrF) per bucket; BLEU and chrF are None for an empty bucket."""
    members = [[] for _ in edges]
    for i, src in enumerate(system.srcs):
        b = bucket_of(source_length(src), edges)
        if b is not None:
            members[b].append(i)
    bleu, chrf = BLEU(tokenize=tokenize), CHRF()
    rows = []
    for idx in members:
        if not idx:
            rows.append((0, None, None))
            continue
        hyps = [system.hyps[i] for i in idx]
        refs = [[system.refs[i] for i in idx]]
        rows.append((len(idx), bleu.corpus_score(hyps, refs).score, chrf.corpus_score(hyps, refs).score))
    return rows


def table(names: List[str], labels: List[str], results: List[list]) -> str:
    header = ["source length", "sentences"] + [f"BLEU {n}" for n in names] + [f"chrF {n}" for n in names]
    rows = []
    for b, label in enumerate(labels):
        counts = [str(r[b][0]) for r in results]
        # systems scored on different test sets have different counts: show each one
        count = counts[0] if len(set(counts)) == 1 else "/".join(counts)
        rows.append([label, count] + [report.fmt(r[b][1]) for r in results] + [report.fmt(r[b][2]) for r in results])
    return report.markdown_table(header, rows)


def plot(names: List[str], labels: List[str], results: List[list], path: str):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = list(range(len(labels)))
    for name, rows in zip(names, results):
        ax.plot(x, [math.nan if r[1] is None else r[1] for r in rows], marker="o", label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    ax.set_xlabel("Sentence length (source words)")
    ax.set_ylabel("BLEU score")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    report.save_figure(fig, path)


def run(args):
    systems = generate_output.load_systems(args, need_src=True)
    if args.buckets is None:
        lengths = [source_length(src) for s in systems for src in s.srcs]
        edges = data_edges(lengths)
        labels = bucket_labels(edges, max(lengths))
    else:
        edges = parse_edges(args.buckets)
        labels = bucket_labels(edges)
    names = [s.name for s in systems]
    results = [scores_by_bucket(s, edges, args.tokenize) for s in systems]
    text = table(names, labels, results)
    report.write_text(args.out + ".md", text)
    plot(names, labels, results, args.out + ".png")
    print(text, end="")
    print(f"wrote {args.out}.md and {args.out}.png")
