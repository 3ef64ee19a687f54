"""What a new user types first, and every line it prints: fairseq's own tools with the suite loaded."""
import math
import os

import httpx
import pytest
from fairseq_plugins_onnx import Translator
from helpers import ONE_THREAD, USER_DIR, run, train

TOOLS = ["fairseq-train", "fairseq-generate", "fairseq-interactive"]


def lines(proc):
    return proc.stdout.strip().splitlines()


def the_error(proc):
    """The one line of an error: the last, with no usage or traceback above it (the lines a plain run
    prints before it, if any, are held by test_a_plain_run_prints_no_debug_or_tensorboardx_line)."""
    assert "usage:" not in proc.stdout and "Traceback" not in proc.stdout, proc.stdout
    return lines(proc)[-1]


def test_a_misspelled_arch_is_one_line_with_the_close_match(data_bin, tmp_path):
    save_dir = tmp_path / "checkpoints"
    proc = run(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "rnnserch_tiny", "--cpu",
                "--save-dir", save_dir], check=False)
    assert proc.returncode == 2
    assert the_error(proc).startswith("fairseq-train: error: --arch/-a rnnserch_tiny: not one of its ")
    assert "did you mean rnnsearch_tiny" in proc.stdout
    assert not save_dir.exists()


@pytest.mark.parametrize("tool", TOOLS)
def test_a_missing_data_directory_is_one_line_before_any_folder_is_made(tool, tmp_path):
    data, save_dir = tmp_path / "data-bn", tmp_path / "checkpoints"
    flags = ["--arch", "rnnsearch_tiny", "--save-dir", save_dir] if tool == "fairseq-train" else \
        ["--path", tmp_path / "checkpoint_best.pt"]
    proc = run([tool, data, "--user-dir", USER_DIR, "--cpu", *flags], check=False, input_text="")
    assert proc.returncode == 2
    assert the_error(proc) == (f"{tool}: error: data directory {data}: no such folder "
                               "(fairseq-preprocess --destdir writes one)")
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("tool", TOOLS)
def test_a_plain_run_prints_no_debug_or_tensorboardx_line(tool, tmp_path):
    """Every line of a short run is the tool's own: fairseq asks for tensorboardX without it, and a
    patch this fairseq does not need must stay out silently."""
    proc = run([tool, tmp_path / "data-bn", "--user-dir", USER_DIR, "--arch", "rnnsearch_tiny"], check=False,
               input_text="")
    assert len(lines(proc)) == 1, proc.stdout


@pytest.fixture(scope="module")
def exported(data_bin, tmp_path_factory):
    """(checkpoint, ONNX folder, what fairseq-plugins-export-onnx printed) of a tiny RNNsearch."""
    root = tmp_path_factory.mktemp("first-run")
    save_dir, out = root / "checkpoints", root / "onnx"
    train(data_bin, save_dir, ["--arch", "rnnsearch_tiny"], 2)
    printed = run(["fairseq-plugins-export-onnx", save_dir / "checkpoint_last.pt", out], env=ONE_THREAD)
    return save_dir / "checkpoint_last.pt", out, printed


def test_the_onnx_export_prints_no_warning_and_others_can_read_its_folder(exported):
    _, out, printed = exported
    assert not [line for line in printed.splitlines() if "torchvision" in line or "Warning" in line], printed
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes a folder: 0755 under umask 022
    assert {name: os.stat(out / name).st_mode & 0o777 for name in ("config.json", "encoder.onnx")} == \
        dict.fromkeys(("config.json", "encoder.onnx"), 0o666 & ~umask)


BASE_2 = "(log2-probability per token, base 2 as fairseq-generate prints it)"


def shown_score(page, text):
    """The score line the page shows under the translation of ``text``."""
    page.fill("#source", text)
    page.click("#go")
    page.wait_for_function("document.getElementById('meta').textContent !== ''", timeout=120_000)
    assert page.inner_text("#error") == ""
    return page.inner_text("#meta")


def test_both_pages_show_the_score_in_base_2_as_fairseq_generate(exported, corpus_dir, tmp_path):
    """The runtime and the API give the natural log (as fairseq's generator and CTranslate2); the pages
    show the number fairseq-generate prints, and say so."""
    from test_export_onnx import static_server
    from test_serve_browser import chromium
    from fairseq_plugins_lab.benchmarks.serve import ServerProcess

    checkpoint, folder, _ = exported
    source = open(f"{corpus_dir}/test.src").read().splitlines()[4]
    best = Translator(str(folder)).translate([source.split()], beam=4)[0][0]
    with chromium() as browser:
        with static_server(str(folder)) as url:
            page = browser.new_page()
            page.goto(url + "/index.html")
            page.wait_for_selector("#go:enabled", timeout=120_000)
            score, label = shown_score(page, source).removeprefix("score ").split(" ", 1)
            assert label == BASE_2 and float(score) == pytest.approx(best.score / math.log(2), abs=2e-4)
        with ServerProcess(str(checkpoint), ["--max-delay-ms", "1"], log=str(tmp_path / "serve.log"),
                           env=ONE_THREAD) as server:
            answer = httpx.post(server.url + "/translate", json={"text": source, "alignment": True}, timeout=60)
            page = browser.new_page()
            page.goto(server.url + "/")
            assert shown_score(page, source) == f"score {answer.json()['translations'][0]['score'] / math.log(2):.4f} {BASE_2}"


def test_average_names_a_folder_that_does_not_exist(tmp_path):
    missing = tmp_path / "checkpoints" / "rnnsearch"
    proc = run(["fairseq-plugins-average", "--inputs", missing, "--num-update-checkpoints", "5", "--output",
                tmp_path / "average.pt"], check=False)
    assert proc.returncode == 2
    assert the_error(proc) == f"fairseq-plugins-average: error: --inputs {missing}: no such file or folder"
