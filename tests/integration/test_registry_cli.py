"""fairseq-train with the suite's components and a wrong value of one of their flags: argparse's
one-line error naming the flag, no traceback. The names themselves: tests/unit/test_registry.py."""
import pytest
from helpers import USER_DIR, run


@pytest.mark.slow
@pytest.mark.parametrize("flags, named", [
    (["--arch", "vaswani_transformer_tiny", "--dropout", "lots"], "--dropout"),
    (["--arch", "rnnsearch_tiny", "--criterion", "label_smoothed_xent", "--label-smoothing", "x"],
     "--label-smoothing"),
    (["--arch", "rnnsearch_tiny", "--lr-scheduler", "inverse_sqrt_warmup", "--warmup-updates", "1.5"],
     "--warmup-updates"),
])
def test_wrong_flag_values_are_argparse_errors(data_bin, flags, named):
    proc = run(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--cpu", *flags], check=False)
    assert proc.returncode == 2
    last = proc.stdout.strip().splitlines()[-1]
    assert "error: argument" in last and named in last and "Traceback" not in proc.stdout
