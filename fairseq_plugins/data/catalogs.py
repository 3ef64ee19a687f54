"""A real English→X parallel corpus from the gettext catalogs installed on this machine.

Every ``<prefix>/share/locale/<lang>/LC_MESSAGES/*.mo`` holds human translations of a
program's messages (msgid → msgstr). :func:`collect` reads them with Python's own
``gettext.GNUTranslations``; :func:`clean` normalises and filters the pairs (each rule
counted), keeps one translation per source sentence, and :func:`split` assigns whole
groups of sources (same text up to case and punctuation) to train/valid/test by a seeded
hash, so no source is ever in two splits. :func:`build` adds sacremoses tokenization and
joint BPE (subword-nmt) or a sentencepiece model, and writes the files
``fairseq-preprocess --joined-dictionary`` takes plus ``report.json``/``report.md``.
"""
import gettext
import glob
import hashlib
import json
import os
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from fairseq_plugins.errors import ConfigError

SPLITS = ("train", "valid", "test")
LENGTH_BUCKETS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 20), (21, 30), (31, 50), (51, None))

# printf (%s, %-10.3ld, %1$s, %'d), Python (%(name)s), brace ({0}, {name}) and shell/JS ($1, ${x}) placeholders
PLACEHOLDER = re.compile(
    r"%(?:\d+\$|\([A-Za-z_]\w*\))?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64)?[diouxXeEfFgGaAcspn]"
    r"|\{\w*\}|\$\{\w+\}|\$\d+"
)
POSITIONAL = re.compile(r"^%\d+\$")  # %2$s and %s are the same placeholder type
MARKUP = re.compile(r"</?[A-Za-z][\w:-]*(?:\s[^<>]*)?/?>|&(?:[a-z]+|#\d+|#x[0-9a-fA-F]+);")
ACCELERATOR = re.compile(r"(?<![_&])[_&](?=[^\W_])")  # before a letter or digit: _Open, Ö_ffnen, &Save
LETTER = re.compile(r"[^\W\d_]")


def default_locale_dirs() -> List[str]:
    """Where distributions and virtualenvs install catalogs, first the system's."""
    dirs = ["/usr/share/locale", "/usr/local/share/locale", os.path.join(sys.prefix, "share", "locale")]
    return list(dict.fromkeys(dirs))


def find_catalogs(lang: str, locale_dirs: Sequence[str]) -> List[str]:
    """All ``.mo`` files of ``lang`` under the folders, sorted; one line naming them if none."""
    found = sorted(p for d in locale_dirs for p in glob.glob(os.path.join(d, lang, "LC_MESSAGES", "*.mo")))
    if not found:
        raise ConfigError(f"--lang {lang}: no gettext catalogs (*.mo) in "
                          + ", ".join(os.path.join(d, lang, "LC_MESSAGES") for d in locale_dirs))
    return found


def read_catalog(path: str) -> List[Tuple[str, str]]:
    """(msgid, msgstr) pairs of one catalog; a plural entry gives its singular form, the
    msgstr index the catalog's own plural formula chooses for n = 1."""
    with open(path, "rb") as f:
        translations = gettext.GNUTranslations(f)
    singular = translations.plural(1)
    pairs = []
    for key, msgstr in translations._catalog.items():  # the parsed table; gettext has no public iterator
        if isinstance(key, tuple):
            msgid, index = key
            if index != singular:
                continue
        else:
            msgid = key
        if msgid:  # msgid "" is the catalog's header (charset, plural formula), not a message
            pairs.append((msgid, msgstr))
    return pairs


@dataclass
class Collected:
    pairs: List[Tuple[str, str]]
    catalogs: List[str]
    unreadable: Dict[str, str] = field(default_factory=dict)  # catalog -> why (e.g. a wrong charset header)


def collect(lang: str, locale_dirs: Sequence[str]) -> Collected:
    catalogs = find_catalogs(lang, locale_dirs)
    out = Collected([], catalogs)
    for path in catalogs:
        try:
            out.pairs.extend(read_catalog(path))
        except (OSError, UnicodeDecodeError, ValueError, LookupError) as e:
            out.unreadable[path] = f"{type(e).__name__}: {e}"
    return out


def placeholders(text: str) -> Counter:
    return Counter(POSITIONAL.sub("%", p) for p in PLACEHOLDER.findall(text.replace("%%", "")))


def strip_accelerator(src: str, tgt: str) -> Tuple[str, str, bool]:
    """Remove one keyboard-accelerator marker (``_Open`` → ``Ö_ffnen``) from each side when
    both have exactly one; a marked word copied verbatim into the target is an identifier
    (``LC_ALL``, ``file_name``), not a marker."""
    src_marks, tgt_marks = ACCELERATOR.findall(src), ACCELERATOR.findall(tgt)
    if len(src_marks) != 1 or len(tgt_marks) != 1:
        return src, tgt, False
    marked_words = [w for w in src.split() if ACCELERATOR.search(w)]
    if any(w in tgt.split() for w in marked_words):
        return src, tgt, False
    return ACCELERATOR.sub("", src, count=1), ACCELERATOR.sub("", tgt, count=1), True


@dataclass
class Filters:
    min_len: int = 1  # words per side
    max_len: int = 50
    max_ratio: float = 3.0  # longer side / shorter side, in words
    placeholders: str = "match"  # "match": same placeholders on both sides; "drop": none at all


def clean(pairs: Sequence[Tuple[str, str]], filters: Filters) -> Tuple[List[Tuple[str, str]], Counter]:
    """Normalised pairs that pass every filter, one per source (its most frequent translation,
    ties broken alphabetically), and the count of pairs each rule dropped (first rule wins)."""
    counts = Counter(read=len(pairs))
    translations: Dict[str, Counter] = defaultdict(Counter)
    for src, tgt in pairs:
        if "\x04" in src:  # msgctxt EOT msgid: the context is a note for translators
            counts["context stripped"] += 1
            src = src.split("\x04", 1)[1]
        src, tgt = " ".join(src.split()), " ".join(tgt.split())
        if MARKUP.search(src) or MARKUP.search(tgt):  # before the markers: &amp; is not an accelerator
            reason = "markup"
        else:
            src, tgt, stripped = strip_accelerator(src, tgt)
            counts["accelerator stripped"] += stripped
            reason = rejection(src, tgt, filters)
        if reason:
            counts[f"dropped: {reason}"] += 1
        else:
            translations[src][tgt] += 1
    kept = [(src, min(t, key=lambda x: (-t[x], x))) for src, t in sorted(translations.items())]
    counts["dropped: duplicate pair"] = sum(sum(t.values()) - len(t) for t in translations.values())
    counts["dropped: other translation of a kept source"] = sum(len(t) - 1 for t in translations.values())
    counts["kept"] = len(kept)
    drops = sorted((k for k in counts if k.startswith("dropped")), key=lambda k: -counts[k])
    order = ["read", "context stripped", "accelerator stripped", *drops, "kept"]
    return kept, Counter({k: counts[k] for k in order})


def rejection(src: str, tgt: str, f: Filters) -> str:
    """Why a normalised pair is dropped, or '' to keep it."""
    if not src or not tgt:
        return "empty"
    if src == tgt:
        return "identical (untranslated)"
    if not LETTER.search(src) or not LETTER.search(tgt):
        return "no letters"
    src_ph, tgt_ph = placeholders(src), placeholders(tgt)
    if f.placeholders == "drop" and (src_ph or tgt_ph):
        return "placeholders"
    if src_ph != tgt_ph:
        return "placeholders differ"
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if not (f.min_len <= n_src <= f.max_len and f.min_len <= n_tgt <= f.max_len):
        return f"length outside {f.min_len}-{f.max_len} words"
    if max(n_src, n_tgt) > f.max_ratio * min(n_src, n_tgt):
        return f"length ratio above {f.max_ratio:g}"
    return ""


def split_key(src: str) -> str:
    """Sources equal up to case, punctuation and spacing ("Open", "open…") share a split."""
    return " ".join(re.sub(r"[\W_]+", " ", src.lower()).split())


def split(pairs: Sequence[Tuple[str, str]], seed: int, valid: int, test: int) -> Dict[str, List[Tuple[str, str]]]:
    """Groups of sources in the order of a seeded hash of their key: valid first, then test,
    each filled up to its size (a group never straddles two splits), the rest train."""
    groups: Dict[str, List[Tuple[str, str]]] = defaultdict(list)
    for pair in pairs:
        groups[split_key(pair[0])].append(pair)
    if valid + test >= len(groups):
        raise ConfigError(f"--valid {valid} --test {test}: only {len(groups)} distinct sources were kept")
    order = sorted(groups, key=lambda k: hashlib.sha256(f"{seed}\0{k}".encode()).hexdigest())
    out: Dict[str, List[Tuple[str, str]]] = {name: [] for name in SPLITS}
    for key in order:
        name = "valid" if len(out["valid"]) < valid else "test" if len(out["test"]) < test else "train"
        out[name].extend(groups[key])
    return out


def length_histogram(lengths: Sequence[int]) -> Dict[str, int]:
    hist = {}
    for lo, hi in LENGTH_BUCKETS:
        label = f"{lo}" if lo == hi else f"{lo}-{hi}" if hi else f">{lo - 1}"
        hist[label] = sum(1 for n in lengths if n >= lo and (hi is None or n <= hi))
    return hist


@dataclass
class BuildOptions:
    lang: str
    out: str
    locale_dirs: List[str]
    seed: int = 1
    valid: int = 1000
    test: int = 1000
    filters: Filters = field(default_factory=Filters)
    bpe_ops: int = 8000
    sentencepiece_vocab: int = 0  # > 0: a sentencepiece model instead of BPE


def build(opts: BuildOptions) -> dict:
    """Collect, clean, split, tokenize and segment; write OUT/{raw,tok,bpe}/SPLIT.{en,LANG}
    and OUT/report.{json,md}. Returns the report."""
    from fairseq_plugins.data import subwords

    collected = collect(opts.lang, opts.locale_dirs)
    pairs, counts = clean(collected.pairs, opts.filters)
    splits = split(pairs, opts.seed, opts.valid, opts.test)
    langs = ("en", opts.lang)
    raw = {f"{name}.{lang}": [pair[side] for pair in splits[name]] for name in SPLITS for side, lang in enumerate(langs)}
    tok = {key: subwords.moses_tokenize(lines, key.rsplit(".", 1)[1]) for key, lines in raw.items()}
    os.makedirs(opts.out, exist_ok=True)
    if opts.sentencepiece_vocab:
        subword = f"sentencepiece unigram, vocabulary {opts.sentencepiece_vocab} (joint, on raw text)"
        seg = subwords.learn_apply_sentencepiece(
            raw["train.en"] + raw[f"train.{opts.lang}"], raw, opts.sentencepiece_vocab,
            os.path.join(opts.out, "spm"))
    else:
        subword = f"joint BPE (subword-nmt), {opts.bpe_ops} merges, on tokenized text"
        seg = subwords.learn_apply_bpe(tok["train.en"] + tok[f"train.{opts.lang}"], tok, opts.bpe_ops,
                                       os.path.join(opts.out, "bpe.codes"))
    for folder, texts in (("raw", raw), ("tok", tok), ("bpe", seg)):
        os.makedirs(os.path.join(opts.out, folder), exist_ok=True)
        for key, lines in texts.items():
            subwords.write_lines(os.path.join(opts.out, folder, key), lines)
    report = {
        "lang": f"en-{opts.lang}", "seed": opts.seed, "catalogs": len(collected.catalogs),
        "locale_dirs": list(opts.locale_dirs), "unreadable_catalogs": collected.unreadable,
        "filters": vars(opts.filters), "counts": dict(counts), "subwords": subword,
        "pairs": {name: len(splits[name]) for name in SPLITS},
        "source_length_histogram": {name: length_histogram([len(s.split()) for s in tok[f"{name}.en"]])
                                    for name in SPLITS},
        "bpe_tokens": {key: sum(len(line.split()) for line in lines) for key, lines in seg.items()},
    }
    with open(os.path.join(opts.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    with open(os.path.join(opts.out, "report.md"), "w") as f:
        f.write(report_markdown(report))
    return report


def report_markdown(report: dict) -> str:
    lines = [f"# gettext catalog corpus {report['lang']}", "",
             f"{report['catalogs']} catalogs from {', '.join(report['locale_dirs'])}; "
             f"{len(report['unreadable_catalogs'])} unreadable"
             + "".join(f"\n- {os.path.basename(p)}: {why}" for p, why in report["unreadable_catalogs"].items()),
             "", f"Filters: {report['filters']}; split seed {report['seed']}; {report['subwords']}.", "",
             "| step | pairs |", "|---|---:|"]
    lines += [f"| {step} | {n:,} |" for step, n in report["counts"].items()]
    lines += ["", "| split | pairs |", "|---|---:|"] + [f"| {s} | {n:,} |" for s, n in report["pairs"].items()]
    hist = report["source_length_histogram"]
    lines += ["", "| source length (tokens) | " + " | ".join(SPLITS), "|---|" + "---:|" * len(SPLITS)]
    lines += [f"| {bucket} | " + " | ".join(f"{hist[s][bucket]:,}" for s in SPLITS) + " |" for bucket in hist["train"]]
    return "\n".join(lines) + "\n"
