"""fairseq-plugins-tokenize (fairseq_plugins/cli/tokenize.py) in process: Moses-style tokenizing,
cleaning, SentencePiece, one-line errors. The WMT'14 pipelines that run it: tests/integration/test_wmt_pipelines.py."""
import random

import pytest
from helpers import WORDS

from fairseq_plugins.cli import tokenize as tok

TOK = "fairseq-plugins-tokenize"


def run_tok(*argv):
    tok.main([str(a) for a in argv])


def test_tokenize_keeps_lines_aligned_and_counts_crlf_and_invalid_utf8(tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_bytes(
        b'Hello, "world" - a well-known fact & more.\r\n'  # CRLF
        b"Bad \xff\xfe bytes here.\n"  # not UTF-8
        b"Lone\rcarriage\x0breturn and\xc2\x85next line\n"  # \r, \v, U+0085: no new lines
        b"\n"  # empty lines stay
        b"Last line without newline"
    )
    out = tmp_path / "out.en"
    run_tok("tokenize", "-l", "en", "-i", src, "-o", out)
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines == [
        "Hello , &quot; world &quot; - a well @-@ known fact &amp; more .",
        "Bad \ufffd \ufffd bytes here .",  # tokenizer.perl splits off symbols
        "Lone carriage return and next line",
        "",
        "Last line without newline",
        "",
    ]
    assert "5 lines; 1 CRLF endings removed; 1 with invalid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "out.en.part").exists()
    # several worker processes give the same lines in the same order
    out2 = tmp_path / "out2.en"
    run_tok("tokenize", "-l", "en", "--workers", 2, "-i", src, "-o", out2)
    assert out2.read_bytes() == out.read_bytes()


def test_tokenize_normalises_punctuation_and_detokenize_inverts_it(tmp_path):
    src = tmp_path / "in.de"
    src.write_text("Das ist „gut“ – sagt er… (wirklich)!\nEr sagt: «Ja» ; sie: ‚nein‘.\n", encoding="utf-8")
    tokd = tmp_path / "tok.de"
    run_tok("tokenize", "-l", "de", "-i", src, "-o", tokd)
    first = tokd.read_text(encoding="utf-8").splitlines()[0]
    assert first == "Das ist &quot; gut &quot; - sagt er ... ( wirklich ) !"  # normalize-punctuation.perl
    detok = tmp_path / "detok.de"
    run_tok("detokenize", "-l", "de", "-i", tokd, "-o", detok)
    assert detok.read_text(encoding="utf-8").splitlines()[0] == 'Das ist "gut" - sagt er... (wirklich)!'


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def test_clean_drops_by_length_and_ratio_and_keeps_pairs_aligned(tmp_path, capsys):
    pairs = [
        (b"a b c", b"x y z", True),
        (b"a b", b"x y z", True),  # ratio exactly 1.5: kept (Moses drops > ratio)
        (b"a", b"x y", False),  # ratio 2
        (b"a b c d", b"x y", False),  # ratio 2 the other way
        (b"", b"x", False),  # empty side: length
        (b"a b c d e f", b"u v w x y z", False),  # 6 tokens > --max-len 5
        (b"a \xff", b"x y", False),  # invalid UTF-8
        (b"a  b\r", b" x\ty ", True),  # CRLF and odd spacing: 2 tokens each, normalised
        (b"a b c d e", b"v w x y z", True),  # exactly --max-len
    ]
    src = write_lines(tmp_path / "c.en", [p[0] for p in pairs])
    tgt = write_lines(tmp_path / "c.de", [p[1] for p in pairs])
    so, to = tmp_path / "o.en", tmp_path / "o.de"
    run_tok("clean", "--src", src, "--tgt", tgt, "--src-out", so, "--tgt-out", to, "--max-len", 5, "--ratio", 1.5)
    kept = [(s, t) for s, t, keep in pairs if keep]
    assert so.read_bytes().splitlines() == [b" ".join(s.split()) for s, _ in kept]
    assert to.read_bytes().splitlines() == [b" ".join(t.split()) for _, t in kept]
    err = capsys.readouterr().err
    assert "kept 4 of 9 pairs; dropped 2 outside length [1, 5], 2 over ratio 1.5, 1 with invalid UTF-8" in err
    assert f"clean: {src}: 9 lines; 1 CRLF endings removed; 1 with invalid UTF-8" in err


def test_clean_stops_on_different_line_counts_with_both_counts(tmp_path, capsys):
    src = write_lines(tmp_path / "c.en", [b"a", b"b", b"c", b"d"])
    tgt = write_lines(tmp_path / "c.de", [b"x", b"y"])
    so, to = tmp_path / "o.en", tmp_path / "o.de"
    with pytest.raises(SystemExit) as e:
        run_tok("clean", "--src", src, "--tgt", tgt, "--src-out", so, "--tgt-out", to)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"{TOK}: error: clean: line counts differ: {src} has 4 lines, {tgt} has 2 lines\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.de", "c.en"]  # no output, no .part
    with pytest.raises(SystemExit) as e:
        run_tok("clean", "--src", tgt, "--tgt", src, "--src-out", so, "--tgt-out", to)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"{TOK}: error: clean: line counts differ: {tgt} has 2 lines, {src} has 4 lines\n"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["clean", "--src", "{d}/nope", "--tgt", "{d}/nope", "--src-out", "a", "--tgt-out", "b"],
         "clean: no such --src file: {d}/nope"),
        (["clean", "--src", "{d}/c.en", "--tgt", "{d}/c.en", "--src-out", "a", "--tgt-out", "b", "--min-len", "0"],
         "clean: need 1 <= --min-len <= --max-len, got --min-len 0 --max-len 250"),
        (["tokenize", "-l", "en", "-i", "{d}/c.en", "{d}/c.en", "-o", "x"],
         "tokenize: 2 --input files but 1 --output files"),
        (["tokenize", "-l", "en", "-i", "{d}/c.en", "-o", "x", "--workers", "0"],
         "tokenize: --workers must be >= 1, got 0"),
        (["spm-encode", "--model", "{d}/none.model", "-i", "{d}/c.en", "-o", "x"],
         "spm-encode: no such --model file: {d}/none.model"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, argv, message):
    write_lines(tmp_path / "c.en", [b"a"])
    with pytest.raises(SystemExit) as e:
        run_tok(*[a.format(d=tmp_path) for a in argv])
    assert e.value.code == 2 and capsys.readouterr().err == f"{TOK}: error: {message.format(d=tmp_path)}\n"


def test_sentencepiece_train_and_encode(tmp_path, capsys):
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)]
    text = write_lines(tmp_path / "t.en", [line.encode() for line in lines])
    run_tok("spm-train", "--input", text, "--model-prefix", tmp_path / "m", "--vocab-size", 40)
    out = tmp_path / "t.spm"
    run_tok("spm-encode", "--model", tmp_path / "m.model", "-i", text, "-o", out)
    encoded = out.read_text(encoding="utf-8").splitlines()
    assert len(encoded) == len(lines)
    assert ["".join(e.split()).replace("\u2581", " ").strip() for e in encoded] == lines
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # more pieces than the text allows: one line
        run_tok("spm-train", "--input", text, "--model-prefix", tmp_path / "m2", "--vocab-size", 5000)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"{TOK}: error: spm-train: ") and err.count("\n") == 1
