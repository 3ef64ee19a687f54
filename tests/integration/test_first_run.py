"""What a new user types first, and every line it prints: fairseq's own tools with the suite loaded."""
import os

import pytest
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


def test_the_onnx_export_prints_no_warning_and_others_can_read_its_folder(data_bin, tmp_path):
    save_dir, out = tmp_path / "checkpoints", tmp_path / "onnx"
    train(data_bin, save_dir, ["--arch", "rnnsearch_tiny"], 2)
    printed = run(["fairseq-plugins-export-onnx", save_dir / "checkpoint_last.pt", out], env=ONE_THREAD)
    assert not [line for line in printed.splitlines() if "torchvision" in line or "Warning" in line], printed
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes a folder: 0755 under umask 022
    assert {name: os.stat(out / name).st_mode & 0o777 for name in ("config.json", "encoder.onnx")} == \
        dict.fromkeys(("config.json", "encoder.onnx"), 0o666 & ~umask)


def test_average_names_a_folder_that_does_not_exist(tmp_path):
    missing = tmp_path / "checkpoints" / "rnnsearch"
    proc = run(["fairseq-plugins-average", "--inputs", missing, "--num-update-checkpoints", "5", "--output",
                tmp_path / "average.pt"], check=False)
    assert proc.returncode == 2
    assert the_error(proc) == f"fairseq-plugins-average: error: --inputs {missing}: no such file or folder"
