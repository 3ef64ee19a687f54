"""The benchmark command: its tiny CPU run end to end, and the FLOP formulas it adds.

Speeds are never asserted (a shared 2-core machine makes them noise); the run must produce
every row of the table with its ratio, write the report file, and find the converted
transformer's beam-search hypotheses identical to the built-in's.
"""
import ast
import importlib
import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, needs_native_bf16, run
from torch.utils.flop_counter import FlopCounterMode

from fairseq_plugins.cli.common import cli_main
from fairseq_plugins.errors import PluginError
from fairseq_plugins_lab.benchmarks import measure
from fairseq_plugins_lab.benchmarks.flops import EXTRA_FLOP_FORMULAS
from fairseq_plugins_lab.benchmarks.report import describe_run
from fairseq_plugins_lab.cli import benchmark, benchmark_engines, benchmark_models, benchmark_scale

MEASUREMENTS = [
    "train target tokens/s",
    "generate sentences/s (beam 3)",  # the run below: --beam 3
    "generate hypothesis tokens/s",
    "train peak RSS (MiB)",
    "generate peak RSS (MiB)",
    "train model GFLOP/s",
    "generate matmul GFLOP/s",
]


@pytest.mark.slow
def test_tiny_cpu_run_reports_every_row(data_bin, tmp_path):
    out = tmp_path / "bench.md"
    stdout = run(["fairseq-plugins-benchmark", "--data", data_bin, "--preset", "tiny", "--repeats", "1",
                  "--threads", "1", "--beam", "3", "--max-len", "7", "--onnx", "--ctranslate2", "--out", out])
    report = out.read_text()
    assert report.strip() in stdout  # the file holds the printed report
    assert re.search(r"^- date: \d{4}-\d\d-\d\d", report, re.M)
    assert re.search(r"^- machine: .+, \d+ cores", report, re.M)
    assert f"- command: `fairseq-plugins-benchmark --data {data_bin} --preset tiny --repeats 1" in report
    bf16 = r"bf16 [\d,]+ GFLOP/s" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else r"bf16 not native"
    assert re.search(rf"^- matmul ceiling: fp32 [\d,]+ GFLOP/s, {bf16}.*; the fastest of: fp32 matmul [\d,]+, "
                     r"fp32 oneDNN prepacked [\d,]+", report, re.M)
    rows = [line.split("|")[1:-1] for line in report.splitlines() if line.startswith("| ")]
    cells = {(r[0].strip(), r[1].strip()): [c.strip() for c in r[2:]] for r in rows[1:]}
    assert [c.strip() for c in rows[0]] == ["pair", "measurement", "ours", "fairseq built-in",
                                            "ours / built-in", "target (cpu preset, fp32)"]
    for pair in ("transformer", "rnnsearch"):
        for name in MEASUREMENTS:
            (key,) = [k for k in cells if k[0] == pair and k[1].startswith(name)]
            ours, theirs, ratio, _ = cells[key]
            assert re.fullmatch(r"[\d,.]+( \([\d.]+%\))?", ours) and re.fullmatch(r"[\d,.]+( \([\d.]+%\))?", theirs)
            assert re.fullmatch(r"\d+\.\d+×", ratio), (key, ratio)
        assert (pair, "hypotheses identical") in cells
    assert cells[("transformer", "hypotheses identical")][0] == "True (4/4)"
    assert "at beam 3 (" in report and "length 7 to 0·|x|+7" in report and ("transformer", "generate sentences/s (beam 3)") in cells
    lengths = re.findall(r"^- generate \w+ \w+ .*hypothesis length ([\d.]+) tokens", report, re.M)
    assert len(lengths) == 6 and set(lengths) == {"8.0"}, lengths  # --max-len 7: 7 tokens and EOS, every model
    # --compile-decoding: each pair's third generation measurement, the same hypotheses as eager
    for pair in ("transformer", "rnnsearch"):
        assert cells[(pair, "compiled decoding: hypotheses identical to ours eager")][0] == "True (4/4)"
        compiled, _, ratio, vs_eager = cells[(pair, "compiled decoding (--compile-decoding): generate sentences/s")]
        assert re.fullmatch(r"[\d,.]+", compiled) and re.fullmatch(r"\d+\.\d+×", ratio)
        assert re.fullmatch(r"\d+\.\d+× ours eager", vs_eager)
        first, eager_first = cells[(pair, "compiled decoding: first batch s, per repeat (compiling, or loading "
                                    "torch's cache)")][:2]
        assert re.fullmatch(r"[\d.]+", first) and re.fullmatch(r"ours eager: [\d.]+", eager_first)
        assert re.fullmatch(r"[\d,.]+ \([\d.]+%\)",
                            cells[(pair, "compiled decoding: generate matmul GFLOP/s (% of the ceiling)")][0])
    # each target verdict agrees with the ratio printed beside it (the bounds are the suite's targets)
    targets = {("transformer", "train target tokens/s"): ("≥", 1.0),
               ("transformer", "generate sentences/s"): ("≥", 1.5),
               ("rnnsearch", "train target tokens/s"): ("≥", 1.0), ("rnnsearch", "generate hypothesis tokens/s"): ("≥", 1.3),
               ("transformer", "train peak RSS"): ("≤", 1.0), ("transformer", "generate peak RSS"): ("≤", 1.0),
               ("rnnsearch", "train peak RSS"): ("≤", 1.0)}
    for (pair, name), (sense, bound) in targets.items():
        (key,) = [k for k in cells if k[0] == pair and k[1].startswith(name)]
        _, _, ratio, target = cells[key]
        value = float(ratio.rstrip("×"))
        met = value >= bound if sense == "≥" else value <= bound
        marks = "✓✗" if abs(value - bound) < 0.01 else ("✓" if met else "✗")  # the printed ratio is rounded
        assert target[:-1] == f"{sense} {bound:.2f}× " and target[-1] in marks, (key, ratio, target)
    # --onnx --ctranslate2: each pair's model in ONNX Runtime, the Transformer's in CTranslate2, and
    # fairseq-generate with --compile-decoding, each float32 route with fairseq-generate's very hypotheses
    assert "## Engines (`--onnx`, `--ctranslate2`)" in report and "beam 3, lengths 1 to 7" in report
    engines = {(r[0], r[2]): r for r in tables(report)[-1][1:]}
    routes = ("fairseq", "fairseq --compile-decoding", "fairseq --compile-decoding --quantize-decoding int8",
              "onnx float32", "onnx int8")
    assert sorted(engines) == sorted([(pair, e) for pair in ("transformer", "rnnsearch") for e in routes]
                                     + [("transformer", "ctranslate2 float32"), ("transformer", "ctranslate2 int8")])
    for pair in ("transformer", "rnnsearch"):
        for route in ("fairseq --compile-decoding", "onnx float32"):
            same, total = engines[(pair, route)][-1].split("/")
            assert same == total and int(total) > 0, engines[(pair, route)]
        assert engines[(pair, "fairseq")][5] == "1.00×" and re.fullmatch(r"\d+\.\d+×", engines[(pair, "onnx int8")][8])
    assert re.fullmatch(r"\d+/\d+", engines[("transformer", "ctranslate2 float32")][-1])


def tables(report):
    """The markdown tables of a report: lists of rows of stripped cells, header first."""
    found, table = [], []
    for line in report.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                table.append([c.strip() for c in line.split("|")[1:-1]])
        elif table:
            found, table = found + [table], []
    return found


@needs_native_bf16  # its bf16 cells train with --autocast-bf16
@pytest.mark.slow
def test_scale_tiny_run_reports_8_cells_and_the_ratios(data_bin, tmp_path):
    """fairseq-train target words/s of {ours, built-in} x {fp32, bf16} x {1 process x 2 threads,
    2 processes x 1 thread}, and the ratios between them, from one run."""
    out = tmp_path / "scale.md"
    stdout = run(["fairseq-plugins-benchmark-scale", "--data", data_bin, "--preset", "tiny", "--repeats", "1",
                  "--out", out])
    report = out.read_text()
    assert report.strip() in stdout
    assert re.search(r"^- settings: .*--max-tokens 256 per process, 2 processes against 1 process with "
                     r"--update-freq 2", report, re.M)
    speeds, ratios = tables(report)
    layouts = ["1 process × 2 threads (--update-freq 2)", "2 processes × 1 thread (gloo)"]
    assert speeds[0] == ["model", "precision", *layouts, "2 processes / 1 process"]
    assert [row[:2] for row in speeds[1:]] == [
        ["vaswani_transformer", "fp32"], ["vaswani_transformer", "bf16"],
        ["transformer (fairseq built-in)", "fp32"], ["transformer (fairseq built-in)", "bf16"]]
    for row in speeds[1:]:  # the 8 cells, each with its 2-process / 1-process ratio
        assert all(re.fullmatch(r"[\d,]+", cell) and float(cell.replace(",", "")) > 0 for cell in row[2:4]), row
        assert re.fullmatch(r"\d+\.\d\d×", row[4]), row
    assert ratios[0] == ["ratio", *layouts]
    assert [row[0] for row in ratios[1:]] == ["ours / built-in, fp32", "ours / built-in, bf16",
                                              "bf16 / fp32, vaswani_transformer", "bf16 / fp32, transformer"]
    for row in ratios[1:]:
        assert all(re.fullmatch(r"\d+\.\d\d×", cell) for cell in row[1:]), row


@pytest.mark.parametrize("argv, message", [
    (["--warmup", "0"], "--warmup must be at least 1"),  # fairseq logs no speed for the first update
    (["--processes", "0"], "--processes must be at least 1"),
    (["--data", "/nonexistent/data-bin"], "--data /nonexistent/data-bin: no such directory"),
])
def test_scale_bad_flags_give_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        benchmark_scale.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("fairseq-plugins-benchmark-scale: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize("argv, message", [
    (["--fp16"], "--fp16 needs --device cuda"),
    (["--pairs", "transformer,gru"], "--pairs: unknown pair 'gru'"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--data", "/nonexistent/data-bin"], "--data /nonexistent/data-bin: no such directory"),
    (["--beam", "0"], "--beam must be at least 1"),
    (["--max-len", "0"], "--max-len must be at least 1"),
    (["--max-len", "30", "--min-len", "5"], "--min-len 5 with --max-len 30: --max-len fixes the hypothesis length"),
    (["--onnx", "--bf16"], "--onnx: the ONNX rows run on CPU in float32"),
    (["--ctranslate2", "--device", "cuda"], "--ctranslate2: the CTranslate2 rows run on CPU"),
    (["--ctranslate2", "--pairs", "rnnsearch"], "--ctranslate2: CTranslate2 converts the transformer pair only"),
])
def test_bad_flags_give_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        benchmark.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("fairseq-plugins-benchmark: error: ") and err.count("\n") == 1
    assert message in err


def test_a_report_quotes_the_command_as_main_was_given_it():
    """``main(argv)`` called from Python (here under pytest's own sys.argv): the report's command
    is that argv, quoted as a shell would need it."""
    args = cli_main(benchmark_models.get_parser, lambda args: args, ["--data", "my data", "--preset", "tiny"])
    args.load_at_start = 0.0
    assert describe_run(args, 60.0)[-1] == "- command: `fairseq-plugins-benchmark --data 'my data' --preset tiny`"


@pytest.mark.parametrize("command", [["models"], []])
def test_models_runs_as_a_sub_command_and_with_no_sub_command(command, tmp_path, monkeypatch):
    """``fairseq-plugins-benchmark models FLAGS`` and today's ``fairseq-plugins-benchmark FLAGS``
    run the same benchmark, and the report quotes the command as typed."""
    data = tmp_path / "my data"
    data.mkdir()
    ran = []
    monkeypatch.setattr(benchmark_models, "run", lambda args: ran.append(args) or "the report")
    monkeypatch.setattr(benchmark_models, "write_report", lambda report, out: None)
    benchmark.main([*command, "--data", str(data), "--preset", "tiny"])
    (args,) = ran
    assert args.preset == "tiny" and args.data == str(data) and args.pairs == ["transformer", "rnnsearch"]
    args.load_at_start = 0.0
    typed = " ".join(["fairseq-plugins-benchmark", *command, "--data", f"'{data}'", "--preset", "tiny"])
    assert describe_run(args, 60.0)[-1] == f"- command: `{typed}`"


def test_help_lists_the_sub_commands_and_each_has_its_own(capsys):
    with pytest.raises(SystemExit) as e:
        benchmark.main(["--help"])
    listed = capsys.readouterr().out
    assert e.value.code == 0 and listed.startswith("usage: fairseq-plugins-benchmark [-h] COMMAND ...")
    for name in ("models", "engines", "scale", "serve"):
        assert re.search(rf"^ +{name} +\S", listed, re.M), (name, listed)
        with pytest.raises(SystemExit) as e:
            benchmark.main([name, "--help"])
        assert e.value.code == 0 and capsys.readouterr().out.startswith(f"usage: fairseq-plugins-benchmark {name} [-h]")


def test_an_unknown_sub_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        benchmark.main(["scael", "--preset", "tiny"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("fairseq-plugins-benchmark: error: argument COMMAND: invalid choice: 'scael' (choose from ")


@pytest.mark.parametrize("alias, name", [("fairseq-plugins-benchmark-scale", "scale"),
                                         ("fairseq-plugins-benchmark-ctranslate2", "engines"),
                                         ("fairseq-plugins-benchmark-serve", "serve")])
def test_the_old_commands_run_their_sub_command(alias, name, capsys):
    """setup.py installs each old name as the sub-command's own module, with the same flags."""
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    scripts = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and node.targets[0].id == "CONSOLE_SCRIPTS")
    assert scripts[alias] == f"fairseq_plugins_lab.cli.{benchmark.COMMANDS[name][0]}"
    module = importlib.import_module(scripts[alias])
    helps = []
    for main in (lambda: module.main(["--help"]), lambda: benchmark.main([name, "--help"])):
        with pytest.raises(SystemExit):
            main()
        helps.append(capsys.readouterr().out)
    assert helps[0].startswith(f"usage: {alias} [-h]")
    same = [" ".join(text.split()) for text in (helps[0].replace(alias, f"fairseq-plugins-benchmark {name}"), helps[1])]
    assert same[0] == same[1]  # but where the usage lines wrap


@pytest.mark.parametrize("argv, line", [
    (["--onnx"], "fairseq-plugins-benchmark: error: --onnx: onnxruntime is not installed; "
                 "pip install 'fairseq-plugins[onnx]'"),
    (["engines", "data-bin", "checkpoint.pt", "--engine", "ctranslate2", "onnx"],
     "fairseq-plugins-benchmark engines: error: --engine onnx: onnxruntime is not installed; "
     "pip install 'fairseq-plugins[onnx]'"),
])
def test_a_missing_engine_is_one_line_naming_its_extra(argv, line, capsys, monkeypatch):
    """Both commands that time the ONNX engine load it from the one table of exports, which names the extra."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as where it is not installed
    for cli in (benchmark_models, benchmark_engines):
        monkeypatch.setattr(cli, "run", lambda *a: pytest.fail("ran without the engine"))
    with pytest.raises(SystemExit) as e:
        benchmark.main(argv)
    assert e.value.code == 2 and capsys.readouterr().err == line + "\n"


def test_without_native_bf16_the_ceiling_is_fp32_only_and_bf16_is_refused(monkeypatch):
    """On a CPU without bf16 kernels (AVX2) an emulated 2048² bf16 matmul takes minutes and
    measures nothing: the ceiling leaves it out, and --bf16 is refused in one line."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    machine = measure.measure_matmul_ceiling({"device": "cpu", "precision": "fp32"})
    assert list(machine["ceilings"]) == ["fp32"]
    assert list(machine["kernels"]) == ["fp32 matmul", "fp32 oneDNN prepacked"]
    assert machine["ceilings"]["fp32"] == max(machine["kernels"].values())
    with pytest.raises(PluginError, match=r"^--bf16: this cpu device has no native bfloat16 support"):
        measure.measure_matmul_ceiling({"device": "cpu", "precision": "bf16"})


def _count(fn, *args):
    with FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS) as counter:
        fn(*args)
    return counter.get_total_flops()


def test_cpu_fused_attention_flops_equal_the_explicit_matmuls():
    """softmax(QKᵀ/√d)V through the fused CPU kernel counts as the matmuls it replaces, forward
    and backward (model FLOPs: no recomputation)."""
    q, k, v = (torch.randn(2, 3, n, 8, requires_grad=True) for n in (5, 7, 7))

    def explicit():
        (torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, -1) @ v).sum().backward()

    def fused():
        F.scaled_dot_product_attention(q, k, v).sum().backward()

    forward = 2 * (2 * 2 * 3 * 5 * 7 * 8)  # QKᵀ and (·)V: 2·B·h·T·S·d each
    assert _count(explicit) == 3 * forward  # backward: two matmuls per forward matmul
    assert _count(fused) == _count(explicit)


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU])
def test_fused_rnn_flops_equal_the_gate_matmuls(cell):
    """A bidirectional RNN counts 2·tokens·(W_ih + W_hh) per direction forward and twice that
    backward (gradients of input, state and weights), whichever kernel runs it: the fused
    LSTM through the formulas added here, the GRU through its per-step matmuls."""
    torch.manual_seed(0)
    rnn = cell(6, 10, bidirectional=True)
    x = torch.randn(4, 3, 6, requires_grad=True)  # [T, B, I]
    h0 = torch.randn(2, 3, 10, requires_grad=True)
    state = (h0, h0) if cell is torch.nn.LSTM else h0
    gates = 4 if cell is torch.nn.LSTM else 3
    forward = 2 * (2 * 4 * 3 * gates * 10 * (6 + 10))  # 2 directions · 2·T·B·(W_ih + W_hh)
    assert _count(lambda: rnn(x, state)[0].sum().backward()) == 3 * forward


def test_the_papers_gru_counts_as_its_matmuls_in_generation_too():
    """Without autograd the papers' GRU runs as one ``scan`` (generation), which torch's counter
    refuses by itself: counted step by step, it is 2·tokens·(W + U_zr + U) per direction, as the
    training loop counts it."""
    from fairseq_plugins_lab.benchmarks.flops import count_scan_steps
    from fairseq_plugins.modules.gru import GRU

    count_scan_steps()
    count_scan_steps()  # idempotent
    gru = GRU(6, 10, bidirectional=True)
    x, mask = torch.randn(3, 4, 6), torch.zeros(3, 4, dtype=torch.bool)
    expected = 2 * 3 * 4 * (2 * 3 * 10 * 6 + 2 * (2 * 10 * 10 + 10 * 10))  # input projection, then U_zr, U
    with torch.no_grad():
        assert _count(gru, x, mask) == expected
    assert _count(gru, x, mask) == expected  # the training loop
