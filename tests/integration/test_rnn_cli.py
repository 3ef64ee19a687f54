"""RNNsearch, RNNencdec and seq2seq_lstm through the real command-line tools: the recipe
scripts in examples/configs train the tiny archs, fairseq-generate decodes with beam 4,
fairseq-interactive survives a blank line, and a flag a model lacks is refused."""
import os
import subprocess

import pytest
from helpers import REPO, USER_DIR, cli_env, run

pytestmark = pytest.mark.slow

RECIPES = {
    "rnnsearch_tiny": "rnnsearch.sh",
    "rnnencdec_tiny": "rnnencdec.sh",
    "seq2seq_lstm_tiny": "seq2seq_lstm.sh",
}
TINY_TRAIN = ["--max-update", "4", "--batch-size", "32", "--cpu", "--seed", "1", "--num-workers", "0",
              "--no-progress-bar", "--log-interval", "1", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module", params=sorted(RECIPES))
def trained(request, data_bin, tmp_path_factory):
    """(arch, checkpoint) after a few updates with the paper's recipe script."""
    arch = request.param
    save_dir = tmp_path_factory.mktemp(arch)
    script = os.path.join(REPO, "examples", "configs", RECIPES[arch])
    extra = ["--updates-per-epoch", "2", "--halve-after-epochs", "1"] if arch.startswith("seq2seq") else []
    log = run(["bash", script, data_bin, "--arch", arch, "--save-dir", save_dir, *TINY_TRAIN, *extra])
    assert "done training" in log
    assert f"{arch}: initialisation paper (" in log  # the paper's recipe runs the paper's init
    if arch.startswith("seq2seq"):  # lr 0.7 halved at update 2, then every update (half of 2)
        assert "num_updates 4 | lr 0.0875" in log
    return arch, os.path.join(save_dir, "checkpoint_last.pt")


def test_generate_with_beam_4(trained, data_bin, corpus_dir):
    arch, checkpoint = trained
    cmd = ["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "4",
           "--batch-size", "16", "--max-len-b", "20", "--cpu", "--num-workers", "0"]
    if arch == "rnnsearch_tiny":
        cmd.append("--print-alignment")
    out = run(cmd)
    sources = [line for line in out.splitlines() if line.startswith("S-")]
    hypos = [line for line in out.splitlines() if line.startswith("H-")]
    n_test = sum(1 for _ in open(os.path.join(corpus_dir, "test.src")))
    assert len(sources) == len(hypos) == n_test
    if arch == "rnnsearch_tiny":
        alignments = [line for line in out.splitlines() if line.startswith("A-")]
        assert len(alignments) == len(sources)
        assert all("-" in pair for line in alignments for pair in line.split("\t")[1].split())


def test_interactive_blank_line_does_not_crash(trained, data_bin):
    arch, checkpoint = trained
    proc = subprocess.run(
        ["fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--source-lang", "src",
         "--target-lang", "tgt", "--beam", "4", "--max-len-b", "10", "--cpu"],
        input="\n", env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert any(line.startswith("H-0") for line in proc.stdout.splitlines()), proc.stdout[-3000:]


def test_reverse_source_is_refused_by_models_without_it(data_bin, tmp_path):
    proc = run(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "rnnsearch_tiny", "--reverse-source",
                "--optimizer", "adadelta", "--max-update", "1", "--save-dir", tmp_path, "--cpu"], check=False)
    assert proc.returncode != 0
    assert proc.stdout.strip().splitlines()[-1].endswith("error: unrecognized arguments: --reverse-source")
