"""Reading ``fairseq-generate`` output and plain one-sentence-per-line files.

``fairseq-generate`` output: ``S-``/``T-``/``H-``/``D-``/``P-``/``A-`` lines, any other line
ignored, so a log with stderr mixed in works too. Bad input raises
:class:`~fairseq_plugins.errors.ConfigError`, one line naming the flag and file at fault.
"""
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from fairseq_plugins.errors import ConfigError

GENERATE_LINE = re.compile(r"^([STHDA])-(\d+)\t(.*)$")
HARD_LINK = re.compile(r"^(\d+)-(\d+)$")


def check_file(path: str, flag: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: no such file")
    return path


def read_lines(path: str, flag: str) -> List[str]:
    """Lines of a text file without their newline; empty lines are kept (they are sentences)."""
    with open(check_file(path, flag), encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def split_name(spec: str) -> Tuple[str, str]:
    """``NAME=FILE`` -> (NAME, FILE); a bare ``FILE`` is named after its file name."""
    name, sep, path = spec.partition("=")
    if not sep:
        path = spec
        name = os.path.splitext(os.path.basename(spec))[0]
    return name, path


@dataclass
class Generation:
    """One sentence of fairseq-generate output (the best hypothesis of an n-best list)."""

    id: int
    src: Optional[str] = None  # S-: source as the model saw it
    ref: Optional[str] = None  # T-: reference (fairseq writes <unk> as <<unk>>)
    hyp: Optional[str] = None  # H-: hypothesis before BPE/tokenizer decoding
    detok: Optional[str] = None  # D-: hypothesis after BPE/tokenizer decoding
    alignment: Optional[str] = None  # A-: raw --print-alignment field

    @property
    def output(self) -> str:
        """The hypothesis to score: D- (what fairseq-generate scores against T-), else H-."""
        return self.detok if self.detok is not None else self.hyp


def read_generate(path: str, flag: str = "--gen") -> List[Generation]:
    """Parse fairseq-generate output into sentences sorted by id."""
    by_id: Dict[int, Generation] = {}
    with open(check_file(path, flag), encoding="utf-8") as f:
        for line in f:
            m = GENERATE_LINE.match(line.rstrip("\n"))
            if m is None:
                continue
            kind, sid, rest = m.group(1), int(m.group(2)), m.group(3)
            g = by_id.setdefault(sid, Generation(sid))
            if kind in "HD":  # H-<id>\t<score>\t<text>; text may be empty
                rest = rest.split("\t", 1)[1] if "\t" in rest else ""
            field = {"S": "src", "T": "ref", "H": "hyp", "D": "detok", "A": "alignment"}[kind]
            if getattr(g, field) is None:  # n-best: the first hypothesis is the best
                setattr(g, field, rest)
    gens = [by_id[i] for i in sorted(by_id)]
    missing = [g.id for g in gens if g.hyp is None and g.detok is None]
    if not gens or missing:
        where = f" (sentence {missing[0]})" if gens else ""
        raise ConfigError(f"{flag} {path}: no H-/D- hypothesis lines{where}; expected fairseq-generate output")
    return gens


def require(gens: List[Generation], field: str, path: str, flag: str, hint: str) -> List[str]:
    """The ``field`` of every sentence, or an error naming the first sentence without it."""
    for g in gens:
        if getattr(g, field) is None:
            raise ConfigError(f"{flag} {path}: sentence {g.id} has no {hint}")
    return [getattr(g, field) for g in gens]


Alignment = Union[List[Tuple[int, int]], List[List[float]]]


def parse_alignment(field: str) -> Tuple[str, Alignment]:
    """An A- field -> ("hard", [(src_idx, tgt_idx), ...]) or ("soft", rows of floats).

    ``--print-alignment`` (= ``hard``) writes ``s-t`` pairs of 0-based token positions, target
    EOS excluded; ``--print-alignment soft`` writes one comma-separated row of attention weights
    per target token (EOS included) over the source tokens (EOS included), rows space-separated.
    """
    items = field.split()
    if all(HARD_LINK.match(x) for x in items):
        return "hard", [(int(s), int(t)) for s, t in (x.split("-") for x in items)]
    try:
        return "soft", [[float(p) for p in row.split(",")] for row in items]
    except ValueError:
        raise ConfigError(f"unreadable A- field {field[:40]!r}: expected s-t pairs or comma-separated weights")


@dataclass
class System:
    """Hypotheses of one system with their references (and sources when known)."""

    name: str
    path: str
    hyps: List[str]
    refs: List[str]
    srcs: Optional[List[str]]


def load_systems(args, need_src: bool) -> List[System]:
    """The systems named by --gen or by --hyp/--ref/--src, checked for matching lengths."""
    if bool(args.gen) == bool(args.hyp):
        raise ConfigError("give either --gen (fairseq-generate output) or --hyp with --ref")
    systems = []
    for spec in args.gen:
        name, path = split_name(spec)
        gens = read_generate(path)
        refs = require(gens, "ref", path, "--gen", "T- reference line")
        srcs = require(gens, "src", path, "--gen", "S- source line") if need_src else None
        systems.append(System(name, path, [g.output for g in gens], refs, srcs))
    if args.hyp:
        if args.ref is None:
            raise ConfigError("--ref is required with --hyp")
        if need_src and args.src is None:
            raise ConfigError("--src is required with --hyp")
        refs = read_lines(args.ref, "--ref")
        srcs = read_lines(args.src, "--src") if need_src else None
        for spec in args.hyp:
            name, path = split_name(spec)
            hyps = read_lines(path, "--hyp")
            check_same_length(hyps, f"--hyp {path}", refs, f"--ref {args.ref}")
            if srcs is not None:
                check_same_length(hyps, f"--hyp {path}", srcs, f"--src {args.src}")
            systems.append(System(name, path, hyps, refs, srcs))
    return systems


def check_same_length(a: list, a_name: str, b: list, b_name: str):
    if len(a) != len(b):
        raise ConfigError(f"{a_name} has {len(a)} lines but {b_name} has {len(b)}")
