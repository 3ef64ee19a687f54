"""``fairseq-train --tensorboard-logdir`` writes the training curves (tensorboard is a dependency)."""
import glob
import re

import pytest
from helpers import train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.mark.slow
def test_event_file_has_the_train_loss(data_bin, tmp_path):
    log = train(data_bin, tmp_path / "ck", ["--arch", "vaswani_transformer_tiny", "--encoder-layers", "1",
                                            "--decoder-layers", "1", "--criterion", "label_smoothed_xent"], 3,
                ["--tensorboard-logdir", tmp_path / "tb", "--no-save"])
    events = glob.glob(str(tmp_path / "tb" / "train_inner" / "events.out.tfevents.*"))
    assert events, f"no event file under {tmp_path / 'tb'}"
    accumulator = EventAccumulator(events[0])
    accumulator.Reload()
    losses = accumulator.Scalars("loss")
    assert [e.step for e in losses] == [1, 2, 3]
    logged = [float(m) for m in re.findall(r"train_inner.*?\bloss=([0-9.]+)", log)]  # fairseq's own log
    assert [round(e.value, 3) for e in losses] == logged
