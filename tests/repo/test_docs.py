"""The README is a short front door (one screen, no run logs in it), and every relative link in it, in
docs/*.md and in the raw reports under reports/ leads somewhere: an existing file, and for
``file.md#anchor`` a heading of that file (GitHub's anchor rules)."""
import ast
import re
import sys
import unicodedata
from pathlib import Path

import pytest

from helpers import REPO

ROOT = Path(REPO)
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "reports").rglob("*.md"))
README_MAX_LINES = 150
MAX_CELL = 200  # characters in one table cell of the README
MAX_LINE = 200  # characters in one line of the README
# What dates a README and goes stale with every run: a date or clock time, a commit hash (7 to 40 hex
# digits with a letter and a digit), the name of a CPU's instruction set.
STALE = {
    "a date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}(?::\d{2})? ?UTC\b"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "a CPU flag": re.compile(r"\b(?:AVX-?512(?:[-_]?\w+)?|AVX-VNNI|AVX2?|VNNI|AMX(?:-\w+)?|FMA|SSE\d*)\b",
                             re.IGNORECASE),
}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def prose_lines(text):
    """(line number, line) of the lines outside fenced and indented code blocks, HTML comments blanked."""
    text = COMMENT.sub(lambda comment: "\n" * comment.group().count("\n"), text)  # not rendered: no links
    fence, previous_blank, in_indented = None, True, False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence:
            if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                fence = None
            continue
        if marker:
            fence = marker.group(1)
            continue
        indented = line.startswith("    ") or line.startswith("\t")
        if indented and (previous_blank or in_indented):
            in_indented = True
            continue  # an indented code block starts after a blank line and runs while lines stay indented
        in_indented = False
        previous_blank = not stripped
        yield number, line


def slug(heading):
    """GitHub's anchor of a heading: the rendered text, lower case, without punctuation, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("**", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(page):
    """Every anchor GitHub gives the headings of ``page`` (a repeated heading gets -1, -2, ...)."""
    seen, result = {}, set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(page):
    """(line number, target) of every link and image of ``page`` that points inside the repository."""
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        line = INLINE_CODE.sub("", line)
        for match in list(LINK.finditer(line)) + list(HTML_LINK.finditer(line)):
            target = match.group(1)
            if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                yield number, target


def broken_links(page):
    """One line per link of ``page`` that points to no file, or to no heading of a markdown file."""
    problems = []
    for number, target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not destination.exists():
            problems.append(f"{where}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{where}: no heading with that anchor in {destination.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("heading, anchor", [
    # anchors GitHub gives these headings (read off rendered pages)
    ("Checkpoints under torch ≥ 2.6", "checkpoints-under-torch--26"),
    ("bf16 / fp32 in real `fairseq-train` runs", "bf16--fp32-in-real-fairseq-train-runs"),
    ("Reproducing the papers on WMT'14", "reproducing-the-papers-on-wmt14"),
    ("A finished run stays finished (`finished_run`, `fairseq_plugins/patches/resume.py`)",
     "a-finished-run-stays-finished-finished_run-fairseq_pluginspatchesresumepy"),
    ("Kill -9 and resume", "kill--9-and-resume"),
])
def test_slug_follows_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Title\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section) [gone](missing.md) [bad](other.md#nowhere)\n"
                    "`[in code](missing.md)`\n\n    [indented code](missing.md)\n\n"
                    "```\n[fenced](missing.md)\n```\n[self](#local) <img src=\"none.png\">\n\n## Local\n"
                    "<!-- [a comment](missing.md)\n[still a comment](missing.md) -->\n[after](gone.md)\n",
                    encoding="utf-8")
    assert broken_links(page) == [
        "page.md:1: missing.md: no such file",
        "page.md:1: other.md#nowhere: no heading with that anchor in other.md",
        "page.md:9: none.png: no such file",
        "page.md:14: gone.md: no such file",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def readme_problems(text):
    """One line per way ``text`` (a README) is more than a front door: too long, a long line or table
    cell, a date, a commit hash or a CPU flag."""
    lines = text.splitlines()
    problems = [f"{len(lines)} lines; move detail into docs/ (at most {README_MAX_LINES})"] * (len(lines) > README_MAX_LINES)
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE:
            problems.append(f"line {number}: {len(line)} characters (at most {MAX_LINE})")
        if line.lstrip().startswith("|"):
            for cell in line.strip().strip("|").split("|"):
                if len(cell.strip()) > MAX_CELL:
                    problems.append(f"line {number}: a table cell of {len(cell.strip())} characters (at most {MAX_CELL})")
        for what, pattern in STALE.items():
            for match in pattern.finditer(line):
                problems.append(f"line {number}: {what}, {match.group()!r}")
    return problems


def test_readme_is_a_front_door():
    assert readme_problems((ROOT / "README.md").read_text(encoding="utf-8")) == []


def test_the_front_door_check_finds_each_problem():
    table = "| a | " + "x" * 201 + " |"
    text = "\n".join(["# Title", table, "run of 2026-12-07 06:33 UTC", "at commit dd8e41a", "with AVX512-BF16 and AMX",
                      "y" * 201, "BLEU 78.6 on 2 cores, torch 2.13.0, `--autocast-bf16`, deadline 30 min"])
    assert readme_problems(text) == [
        "line 2: 209 characters (at most 200)",
        "line 2: a table cell of 201 characters (at most 200)",
        "line 3: a date, '2026-12-07'",
        "line 3: a date, '06:33 UTC'",
        "line 4: a commit hash, 'dd8e41a'",
        "line 5: a CPU flag, 'AVX512-BF16'",
        "line 5: a CPU flag, 'AMX'",
        "line 6: 201 characters (at most 200)",
    ]
    assert readme_problems("\n" * README_MAX_LINES) == []
    assert readme_problems("\n" * (README_MAX_LINES + 1)) == [f"{README_MAX_LINES + 1} lines; move detail into docs/ "
                                                              f"(at most {README_MAX_LINES})"]


def test_no_script_writes_the_readme():
    """A fresh-clone run leaves the README as committed: no script, example or package module opens it to
    write (the run's figures belong in reports/)."""
    writes = re.compile(r"README\.md[\"']?\)?\s*,\s*[\"'][wa]|README\.md[^\n]*\.write_text|>>?\s*\"?(?:\$\w+/)?README\.md")
    found = [f"{path.relative_to(ROOT)}" for folder in ("scripts", "examples", "fairseq_plugins", ".ci")
             for path in sorted((ROOT / folder).rglob("*")) if path.suffix in (".py", ".sh", "") and path.is_file()
             and writes.search(path.read_text(encoding="utf-8", errors="replace"))]
    assert found == []


REGISTRATION = re.compile(r"register_(model_architecture|criterion|lr_scheduler|task)\(\s*\"\w+\"(?:\s*,\s*\"(\w+)\")?")


def registered_names():
    """Every name the package registers with fairseq, read from its source (architectures by their arch name)."""
    names = set()
    for source in (ROOT / "fairseq_plugins").rglob("*.py"):
        for match in REGISTRATION.finditer(source.read_text(encoding="utf-8")):
            names.add(match.group(2) or re.search(r"\"(\w+)\"", match.group(0)).group(1))
    return names


def console_scripts():
    """The console scripts setup.py installs: its CONSOLE_SCRIPTS and fairseq_plugins_tools.TOOLS."""
    names = set()
    for path, variable in (("setup.py", "CONSOLE_SCRIPTS"), ("fairseq_plugins_tools.py", "TOOLS")):
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        assignment = next(node for node in tree.body if isinstance(node, ast.Assign)
                          and any(getattr(target, "id", None) == variable for target in node.targets))
        names |= set(ast.literal_eval(assignment.value))
    return names


def test_the_readme_names_every_registered_name_and_console_script():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w-]+)`", readme))
    scripts = console_scripts()
    assert "rnnsearch" in registered_names() and "fairseq-plugins-serve" in scripts  # the readers found the lists
    assert sorted((registered_names() | scripts) - named) == []
    assert sorted(name for name in named if name.startswith("fairseq-plugins-") and name not in scripts) == []


def test_the_readme_links_no_raw_report():
    """The dated reports under reports/ are for the docs' readers who ask for them, not the front door's."""
    assert [target for _, target in links(ROOT / "README.md") if target.startswith("reports/")] == []


def test_the_benchmarks_page_is_one_table_per_cpu_class():
    lines = len((ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 150, f"docs/BENCHMARKS.md has {lines} lines; dated runs go to reports/benchmarks/ (at most 150)"
