"""Analysis commands: expected numbers recomputed here with sacrebleu on subsets built by hand."""
import os
import random
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from fairseq_plugins.analysis import bleu_by_length, generate_output, plot_alignment, plot_curves, report, score
from fairseq_plugins.cli import bleu_by_length as bleu_by_length_cli
from fairseq_plugins.cli import nounk_bleu as nounk_bleu_cli
from fairseq_plugins.cli import plot_alignment as plot_alignment_cli
from fairseq_plugins.cli import plot_curves as plot_curves_cli
from fairseq_plugins.cli import score as score_cli

VENV_BIN = os.path.dirname(sys.executable)


def png_size(path):
    """(width, height) from the IHDR chunk; fails unless the file is a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    assert os.path.getsize(path) > 100
    return struct.unpack(">II", head[16:24])


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def table_rows(md_path):
    """Markdown table body as lists of cells."""
    lines = [ln for ln in open(md_path, encoding="utf-8") if ln.startswith("| ")][1:]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]


def bleu(hyps, refs):
    return BLEU().corpus_score(hyps, [refs]).score


def chrf(hyps, refs):
    return CHRF().corpus_score(hyps, [refs]).score


def expect_cli_error(main, argv, capsys, *needles):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


# A hand-written fairseq-generate output: ids out of order, stderr-like noise, a 2-best list,
# sources of 3 (id 0), 12 (id 2, BPE: 13 tokens, 12 words) and 15 (id 1) words.
SRC = {
    0: "le chat dort",
    1: "a b c d e f g h i j k l m n o",
    2: "un tr@@ ès long phrase avec douze mots ici pour le test x",
}
REF = {0: "the cat sleeps", 1: "A B C D E F G H I J K L M N O", 2: "a very long sentence with twelve words here for the test x"}
HYP = {0: "the cat is sleeping", 1: "A B C D E F G H X J K L M N", 2: "a long sentence with twelve words for the test"}


def generate_text(hyp=HYP):
    out = ["2026-01-01 00:00:00 | INFO | fairseq_cli.generate | loading model(s)"]
    for i in (2, 0, 1):
        out += [f"S-{i}\t{SRC[i]}", f"T-{i}\t{REF[i]}", f"H-{i}\t-0.5\t{hyp[i]}", f"D-{i}\t-0.5\t{hyp[i]}",
                f"P-{i}\t-0.1 -0.2"]
        if i == 0:
            out += ["H-0\t-0.9\tsecond best", "D-0\t-0.9\tsecond best"]
    out.append("Generate test with beam=5: BLEU4 = 10.00, 1/1/1/1 (BP=1.000, ratio=1.0, syslen=1, reflen=1)")
    return out


def test_read_generate_sorts_by_id_and_keeps_the_best_hypothesis(tmp_path):
    path = write(tmp_path / "gen.txt", generate_text({0: "", 1: HYP[1], 2: HYP[2]}))
    gens = generate_output.read_generate(path)
    assert [g.id for g in gens] == [0, 1, 2]
    assert [g.src for g in gens] == [SRC[0], SRC[1], SRC[2]]
    assert gens[0].output == ""  # empty best hypothesis kept, not the second best
    assert gens[1].output == HYP[1] and gens[2].ref == REF[2]


def test_bleu_by_length_scores_each_bucket_as_its_own_corpus(tmp_path, capsys):
    path = write(tmp_path / "gen.txt", generate_text())
    out = str(tmp_path / "len")
    bleu_by_length_cli.main(["--gen", f"sys={path}", "--buckets", "0,10,20", "--out", out])
    rows = table_rows(out + ".md")
    assert [r[:2] for r in rows] == [["0-10", "1"], ["10-20", "2"], ["20+", "0"]]
    # id 0 alone (3 words); ids 1 and 2 (15 and 12 words: BPE pieces are not words)
    assert rows[0][2] == f"{bleu([HYP[0]], [REF[0]]):.2f}"
    assert rows[1][2] == f"{bleu([HYP[1], HYP[2]], [REF[1], REF[2]]):.2f}"
    assert rows[1][3] == f"{chrf([HYP[1], HYP[2]], [REF[1], REF[2]]):.2f}"
    assert rows[2][2:] == ["-", "-"]
    assert png_size(out + ".png")[0] > 0


def test_bleu_by_length_default_buckets_are_equal_count_thirds_labelled_as_the_quickstart(tmp_path):
    """Sources of 3, 12 and 15 words: a third each, labelled with both ends included up to the longest."""
    path = write(tmp_path / "gen.txt", generate_text())
    out = str(tmp_path / "len")
    bleu_by_length_cli.main(["--gen", f"sys={path}", "--out", out])
    assert [r[:3] for r in table_rows(out + ".md")] == [["3-11", "1", f"{bleu([HYP[0]], [REF[0]]):.2f}"],
                                                        ["12-14", "1", f"{bleu([HYP[2]], [REF[2]]):.2f}"],
                                                        ["15-15", "1", f"{bleu([HYP[1]], [REF[1]]):.2f}"]]


def test_default_buckets_are_sixths_from_600_sentences():
    lengths = [n % 30 + 1 for n in range(600)]  # 1-30 words, 20 sentences each
    assert bleu_by_length.data_edges(lengths) == [1, 6, 11, 16, 21, 26]
    assert bleu_by_length.data_edges(lengths[:300]) == [1, 11, 21]  # 300 sentences: thirds
    assert bleu_by_length.bucket_labels([1, 11, 21], 30) == ["1-10", "11-20", "21-30"]


def test_bucket_edges_are_inclusive_below_exclusive_above():
    edges = bleu_by_length.parse_edges("0,10,20")
    assert bleu_by_length.bucket_labels(edges) == ["0-10", "10-20", "20+"]
    assert [bleu_by_length.bucket_of(n, edges) for n in (0, 9, 10, 19, 20, 95)] == [0, 0, 1, 1, 2, 2]
    assert bleu_by_length.source_length("un tr@@ ès long") == 3


def test_bleu_by_length_plain_files_two_systems_and_empty_hypothesis(tmp_path):
    src = write(tmp_path / "src", ["a b", "a b c d e", "a b c d e f"])
    ref = write(tmp_path / "ref", ["x y", "p q r s t", "k l m n o p"])
    hyps_a = ["x y", "p q r s t", ""]  # the empty line is a sentence, scored as such
    hyps_b = ["x z", "p q r s", "k l m n o p"]
    a, b = write(tmp_path / "a.txt", hyps_a), write(tmp_path / "b.txt", hyps_b)
    out = str(tmp_path / "len")
    bleu_by_length_cli.main(["--hyp", a, "--hyp", f"B={b}", "--ref", ref, "--src", src, "--buckets", "0,3", "--out", out])
    header = open(out + ".md").readline()
    assert "BLEU a" in header and "BLEU B" in header
    rows = table_rows(out + ".md")
    refs_long = ["p q r s t", "k l m n o p"]
    assert rows[1][:4] == ["3+", "2", f"{bleu(hyps_a[1:], refs_long):.2f}", f"{bleu(hyps_b[1:], refs_long):.2f}"]
    assert float(rows[1][2]) < 100.0  # the empty hypothesis counted against system a


def test_mismatched_line_counts_are_one_line_errors(tmp_path, capsys):
    hyp = write(tmp_path / "hyp.txt", ["a", "b", "c"])
    ref = write(tmp_path / "ref.txt", ["a", "b"])
    src = write(tmp_path / "src.txt", ["a", "b", "c"])
    expect_cli_error(score_cli.main, ["--hyp", hyp, "--ref", ref], capsys, hyp, ref, "3 lines", "has 2")
    expect_cli_error(bleu_by_length_cli.main, ["--hyp", hyp, "--ref", src, "--src", ref], capsys, ref, "has 2")
    expect_cli_error(nounk_bleu_cli.main, ["--hyp", hyp, "--ref", ref, "--src", src], capsys, ref, "has 2")


def test_missing_files_are_one_line_errors(tmp_path, capsys):
    missing = str(tmp_path / "nope.txt")
    ref = write(tmp_path / "ref.txt", ["a"])
    expect_cli_error(score_cli.main, ["--hyp", missing, "--ref", ref], capsys, "--hyp", missing)
    expect_cli_error(bleu_by_length_cli.main, ["--gen", missing], capsys, "--gen", missing)
    expect_cli_error(plot_alignment_cli.main, ["--gen", missing], capsys, "--gen", missing)
    expect_cli_error(plot_curves_cli.main, ["--log", missing], capsys, "--log", missing)
    expect_cli_error(nounk_bleu_cli.main, ["--gen", str(write(tmp_path / "g", generate_text())), "--src-vocab", missing],
                     capsys, "--src-vocab", missing)
    expect_cli_error(score_cli.main, ["--gen", ref], capsys, "--gen", ref, "fairseq-generate")


def test_nounk_subset_from_vocabularies_with_shortlist(tmp_path):
    src = ["a b", "a q", "b c", "c a"]
    ref = ["x y", "x y", "y zz", "z x"]
    hyp = ["x y", "x", "y z", "x z"]
    # fairseq dict format, most frequent first; --top 3 drops "d" (and keeps a, b, c)
    src_dict = write(tmp_path / "dict.src.txt", ["a 9", "b 7", "c 5", "d 1"])
    tgt_vocab = write(tmp_path / "tgt.vocab", ["x", "y", "z"])
    files = [write(tmp_path / n, v) for n, v in (("s", src), ("r", ref), ("h", hyp))]
    out = str(tmp_path / "nounk")
    nounk_bleu_cli.main(["--hyp", f"sys={files[2]}", "--ref", files[1], "--src", files[0], "--src-vocab", src_dict,
                     "--tgt-vocab", tgt_vocab, "--top", "3", "--out", out])
    # sentence 1 has source OOV "q", sentence 2 reference OOV "zz": the subset is {0, 3}
    [row] = table_rows(out + ".md")
    assert row == ["sys", "4", f"{bleu(hyp, ref):.2f}", "2", f"{bleu([hyp[0], hyp[3]], [ref[0], ref[3]]):.2f}"]
    png_size(out + ".png")


def test_nounk_subset_from_unk_tokens_of_generate_output(tmp_path):
    gen = ["S-0\ta b", "T-0\tx y", "H-0\t-1\tx y", "D-0\t-1\tx y",
           "S-1\ta <unk>", "T-1\tx y", "H-1\t-1\tx", "D-1\t-1\tx",
           "S-2\ta b c d", "T-2\tx <<unk>> y", "H-2\t-1\tx y", "D-2\t-1\tx y",
           "S-3\tb a c", "T-3\ty x z", "H-3\t-1\ty x", "D-3\t-1\ty x"]
    out = str(tmp_path / "nounk")
    nounk_bleu_cli.main(["--gen", str(write(tmp_path / "gen.txt", gen)), "--out", out])
    [row] = table_rows(out + ".md")
    assert row[1] == "4" and row[3] == "2"
    assert row[4] == f"{bleu(['x y', 'y x'], ['x y', 'y x z']):.2f}"


ALPHA = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])  # [target (w, </s>) x source (a, b, </s>)]


def test_plot_alignment_soft_matrix_labels_and_png(tmp_path):
    gen = ["S-4\ta b", "T-4\tw", "H-4\t-1\tw", "D-4\t-1\tw",
           "A-4\t" + " ".join(",".join(f"{p:.6f}" for p in row) for row in ALPHA)]
    g = generate_output.read_generate(write(tmp_path / "gen.txt", gen))[0]
    alpha, src, tgt, kind = plot_alignment.matrix_from_generation(g, "gen.txt")
    assert kind == "soft" and src == ["a", "b", "</s>"] and tgt == ["w", "</s>"]
    np.testing.assert_allclose(alpha, ALPHA)

    fig = plot_alignment.draw(alpha, src, tgt)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == src
    assert [t.get_text() for t in ax.get_yticklabels()] == tgt
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("source", "target")
    np.testing.assert_allclose(ax.get_images()[0].get_array(), ALPHA)
    width, height = fig.get_size_inches() * 100
    report.save_figure(fig, str(tmp_path / "one.png"))
    assert png_size(str(tmp_path / "one.png")) == (round(width), round(height))

    plot_alignment_cli.main(["--gen", str(tmp_path / "gen.txt"), "--out", str(tmp_path / "al")])
    assert png_size(str(tmp_path / "al" / "alignment-4.png"))[0] > 0
    assert "alignment-4.png" in open(tmp_path / "al" / "alignments.md").read()


def test_plot_alignment_hard_links(tmp_path):
    gen = ["S-0\ta b c", "H-0\t-1\tx y", "A-0\t2-0 0-1"]
    g = generate_output.read_generate(write(tmp_path / "gen.txt", gen))[0]
    alpha, src, tgt, kind = plot_alignment.matrix_from_generation(g, "gen.txt")
    assert kind == "hard" and src == ["a", "b", "c"] and tgt == ["x", "y"]
    np.testing.assert_array_equal(alpha, [[0, 0, 1], [1, 0, 0]])


def test_join_bpe_sums_source_columns_and_averages_target_rows():
    alpha = np.array([[0.1, 0.2, 0.7],
                      [0.3, 0.3, 0.4],
                      [0.5, 0.5, 0.0]])
    joined, src, tgt = plot_alignment.join_bpe(alpha, ["ab@@", "c", "d"], ["x@@", "y@@", "z"])
    assert src == ["abc", "d"] and tgt == ["xyz"]
    # row xyz = mean of the three rows; column abc = first two columns summed
    np.testing.assert_allclose(joined, [[(0.3 + 0.6 + 1.0) / 3, (0.7 + 0.4 + 0.0) / 3]])


def test_plot_alignment_without_alignments_says_to_add_print_alignment(tmp_path, capsys):
    path = write(tmp_path / "gen.txt", generate_text())
    expect_cli_error(plot_alignment_cli.main, ["--gen", path], capsys, "--print-alignment", path)


def test_plot_alignment_rejects_alignment_of_other_tokenization(tmp_path, capsys):
    path = write(tmp_path / "gen.txt", ["S-0\ta b", "H-0\t-1\tx", "A-0\t0.5,0.5"])
    expect_cli_error(plot_alignment_cli.main, ["--gen", path, "--out", str(tmp_path)], capsys, "A-0", "--remove-bpe")


SIMPLE_LOG = """\
2026-11-29 17:36:44 | INFO | train_inner | epoch 001:      5 / 6 loss=5.949, ppl=61.77, wps=473.9, ups=1.25, wpb=378.2, bsz=40, num_updates=5, lr=0.01, gnorm=0.168, train_wall=4, wall=5
2026-11-29 17:36:45 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 5.689 | ppl 51.59 | wps 0 | wpb 115 | bsz 16 | num_updates 6
2026-11-29 17:36:45 | INFO | train | epoch 001 | loss 5.926 | ppl 60.78 | wps 467.9 | ups 1.24 | wpb 376.5 | bsz 49.3 | num_updates 6 | lr 0.01 | gnorm 0.197 | train_wall 4 | wall 6
2026-11-29 17:36:50 | INFO | train_inner | epoch 002:      4 / 6 loss=5.494, ppl=45.07, wps=273.7, ups=0.74, wpb=368.4, bsz=49.6, num_updates=10, lr=0.005, gnorm=0.372, train_wall=6, wall=12
2026-11-29 17:36:55 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 4.982 | ppl 31.6 | wps 0 | wpb 115 | bsz 16 | num_updates 12 | best_loss 4.982
"""
JSON_LOG = """\
2026-11-29 17:37:13 | INFO | train_inner | {"epoch": 1, "update": 0.833, "loss": "5.8", "ppl": "55.7", "num_updates": "5", "lr": "0.002"}
2026-11-29 17:37:13 | INFO | valid | {"epoch": 1, "valid_loss": "5.1", "valid_ppl": "34.3", "valid_num_updates": "6"}
2026-11-29 17:37:13 | INFO | train | {"epoch": 1, "train_loss": "5.5", "train_ppl": "45.2", "train_num_updates": "6", "train_lr": "0.002"}
2026-11-29 17:37:14 | INFO | valid | {"epoch": 2, "valid_loss": "5.3", "valid_ppl": "39.4", "valid_num_updates": "12", "valid_best_loss": "5.1"}
"""


def test_plot_curves_reads_simple_and_json_logs(tmp_path):
    simple = tmp_path / "simple.log"
    simple.write_text("{'_name': None, 'common': {}}\n" + SIMPLE_LOG)
    (tmp_path / "json.log").write_text(JSON_LOG)
    out = str(tmp_path / "curves")
    plot_curves_cli.main(["--log", f"a={simple}", "--log", str(tmp_path / "json.log"), "--out", out])
    rows = table_rows(out + ".md")
    assert rows == [["a", "12", "5.494", "45.07", "4.982", "31.60", "4.982", "0.005"],
                    ["json", "12", "5.800", "55.70", "5.300", "39.40", "5.100", "0.002"]]
    run = plot_curves.read_log("a", str(simple))
    assert [p["num_updates"] for p in run.train] == [5, 10]  # interval lines, not epoch averages
    assert [p["loss"] for p in run.valid] == [5.689, 4.982]
    width, height = png_size(out + ".png")
    assert width > height > 0


def test_plot_curves_does_not_mix_label_smoothed_and_plain_losses_and_labels_its_axes(tmp_path):
    """A label-smoothed run's loss panel line is its nll_loss, the plain run's its loss: one quantity."""
    (tmp_path / "ls.log").write_text(
        "x | INFO | train_inner | epoch 001:      5 / 6 loss=6.2, nll_loss=5.5, ppl=45.25, num_updates=5, lr=0.01\n"
        "x | INFO | valid | epoch 001 | valid on 'valid' subset | loss 6.0 | nll_loss 5.1 | ppl 34.3 | num_updates 6\n")
    (tmp_path / "plain.log").write_text(SIMPLE_LOG)
    runs = [plot_curves.read_log(name, str(tmp_path / f"{name}.log")) for name in ("ls", "plain")]
    fig = plot_curves.figure(runs)
    loss_panel = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert loss_panel == {"ls (nll_loss: its loss is label-smoothed) train": [5.5],
                          "ls (nll_loss: its loss is label-smoothed) valid": [5.1],
                          "plain train": [5.949, 5.494], "plain valid": [5.689, 4.982]}
    assert [ax.get_ylabel() for ax in fig.axes] == ["cross entropy (bits per token, base 2)",
                                                   "perplexity (2 ** cross entropy, log scale)", "learning rate"]


def test_plot_curves_log_without_progress_lines(tmp_path, capsys):
    path = write(tmp_path / "empty.log", ["nothing here"])
    expect_cli_error(plot_curves_cli.main, ["--log", path], capsys, "--log", path, "--log-format")


def test_compound_split_matches_the_perl_substitution():
    assert score.compound_split("rich-text format") == "rich ##AT##-##AT## text format"
    # perl's /g resumes after the previous match: the second hyphen of a-b-c is left alone
    assert score.compound_split("a-b-c - d") == "a ##AT##-##AT## b-c - d"


def test_score_detokenized_inputs(tmp_path, capsys):
    hyps = ["Das ist ein rich-text Format, gut.", "Hallo Welt!"]
    refs = ["Das ist das rich-text Format, gut.", "Hallo, Welt!"]
    # Moses-tokenized (de) and compound-split by hand
    tok_hyps = ["Das ist ein rich ##AT##-##AT## text Format , gut .", "Hallo Welt !"]
    tok_refs = ["Das ist das rich ##AT##-##AT## text Format , gut .", "Hallo , Welt !"]
    h, r = write(tmp_path / "h", hyps), write(tmp_path / "r", refs)
    out = str(tmp_path / "score")
    score_cli.main(["--hyp", f"sys={h}", "--ref", r, "--out", out])
    printed = capsys.readouterr().out
    tokenized = BLEU(tokenize="none", smooth_method="none").corpus_score(tok_hyps, [tok_refs]).score
    [row] = table_rows(out + ".md")
    assert row == ["sys", "2", f"{bleu(hyps, refs):.2f}", f"{chrf(hyps, refs):.2f}", f"{tokenized:.2f}"]
    assert re.search(r"BLEU\|nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:\S+ = ", printed)
    assert "chrF2|nrefs:1" in printed
    png_size(out + ".png")


def test_score_tokenized_inputs_are_detokenized_for_sacrebleu(tmp_path):
    tok_hyps = ["Hallo Welt !", "Das ist &quot; gut &quot; ."]
    tok_refs = ["Hallo , Welt !", "Das ist &quot; gut &quot; ."]
    detok_hyps = ["Hallo Welt!", 'Das ist "gut".']
    detok_refs = ["Hallo, Welt!", 'Das ist "gut".']
    h, r = write(tmp_path / "h", tok_hyps), write(tmp_path / "r", tok_refs)
    out = str(tmp_path / "score")
    score_cli.main(["--hyp", h, "--ref", r, "--input-tokenized", "--out", out])
    [row] = table_rows(out + ".md")
    tokenized = BLEU(tokenize="none", smooth_method="none").corpus_score(tok_hyps, [tok_refs]).score
    assert row[2:] == [f"{bleu(detok_hyps, detok_refs):.2f}", f"{chrf(detok_hyps, detok_refs):.2f}",
                       f"{tokenized:.2f}"]


# ---------------------------------------------------------------- fairseq end to end


def fairseq(*cmd, cwd):
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny built-in transformer trained 40 updates on a reversal task, and its generate output."""
    import fairseq_plugins

    user_dir = os.path.dirname(fairseq_plugins.__file__)
    root = tmp_path_factory.mktemp("analysis")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(20)]
    for split, n, top in (("train", 300, 12), ("valid", 20, 12), ("test", 24, 25)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, top))) for _ in range(n)]
        write(root / f"{split}.src", src)
        write(root / f"{split}.tgt", [" ".join(s.split()[::-1]).upper() for s in src])
    fairseq("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
            "--validpref", "valid", "--testpref", "test", "--destdir", "bin", "--joined-dictionary",
            "--workers", "1", cwd=root)
    fairseq("fairseq-train", "bin", "--user-dir", user_dir, "--arch", "transformer", "--encoder-layers", "1",
            "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
            "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2", "--share-all-embeddings", "--dropout", "0", "--optimizer", "adam",
            "--lr", "0.01", "--max-tokens", "1000", "--max-update", "40", "--cpu", "--seed", "1",
            "--save-dir", "ckpt", "--no-epoch-checkpoints", "--disable-validation", cwd=root)
    gen = fairseq("fairseq-generate", "bin", "--user-dir", user_dir, "--path", "ckpt/checkpoint_last.pt", "--cpu",
                  "--beam", "2", "--max-len-b", "30", "--print-alignment", "soft", cwd=root)
    write(root / "gen.txt", gen.splitlines())
    return root


@pytest.mark.slow
def test_fairseq_generate_output_through_bleu_by_length_and_plot_alignment(trained):
    gen = str(trained / "gen.txt")
    src_lines = (trained / "test.src").read_text().splitlines()
    gens = generate_output.read_generate(gen)
    assert [g.id for g in gens] == list(range(len(src_lines)))

    out = str(trained / "len")
    bleu_by_length_cli.main(["--gen", f"tiny={gen}", "--buckets", "0,10,20", "--out", out])
    rows = table_rows(out + ".md")
    for (lo, hi), row in zip(((0, 10), (10, 20)), rows):
        idx = [i for i, s in enumerate(src_lines) if lo <= len(s.split()) < hi]  # raw text, by line number
        assert row[1] == str(len(idx))
        hyps, refs = [gens[i].output for i in idx], [gens[i].ref for i in idx]
        assert row[2:] == [f"{bleu(hyps, refs):.2f}", f"{chrf(hyps, refs):.2f}"]
    png_size(out + ".png")

    plot_alignment_cli.main(["--gen", gen, "--out", str(trained / "al")])
    pngs = sorted(f for f in os.listdir(trained / "al") if f.endswith(".png"))
    assert len(pngs) == len(src_lines)
    png_size(str(trained / "al" / pngs[0]))

    # in-process extraction of extra["attn"] along the beam-search hypothesis == fairseq's soft A- lines
    ids = [0, 1, 2, 3]
    compared = 0
    for i, alpha, src, tgt, kind in plot_alignment.model_alignments(
            str(trained / "ckpt/checkpoint_last.pt"), str(trained / "bin"), "test", ids, False, beam=2):
        expected, e_src, e_tgt, _ = plot_alignment.matrix_from_generation(gens[i], gen)
        assert src == e_src
        if tgt == e_tgt:
            np.testing.assert_allclose(alpha, expected, atol=2e-6)
            compared += 1
    assert compared >= 3

    [(_, alpha, src, tgt, kind)] = plot_alignment.model_alignments(
        str(trained / "ckpt/checkpoint_last.pt"), str(trained / "bin"), "test", [5], True)
    assert kind == "teacher-forced" and tgt[:-1] == gens[5].ref.split() and src[:-1] == gens[5].src.split()
    np.testing.assert_allclose(alpha.sum(axis=1), 1.0, atol=1e-5)
    plot_alignment_cli.main(["--path", str(trained / "ckpt/checkpoint_last.pt"), "--data", str(trained / "bin"),
                         "--ids", "5", "--teacher-forcing", "--out", str(trained / "tf")])
    png_size(str(trained / "tf" / "alignment-5.png"))
