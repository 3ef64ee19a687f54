"""inverse_sqrt_warmup against eq. 3 of Vaswani et al. recomputed here."""
import math

import pytest
from fairseq.optim import FairseqOptimizer
from omegaconf import OmegaConf

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.lr_schedulers.inverse_sqrt_warmup import InverseSqrtWarmupSchedule


class Optimizer(FairseqOptimizer):
    def __init__(self):
        super().__init__(cfg=None)
        self.lr = None

    def set_lr(self, lr):
        self.lr = lr

    def get_lr(self):
        return self.lr


def schedule(lr, warmup, model_dim=None):
    lrs = lr if isinstance(lr, list) else [lr]
    cfg = OmegaConf.create({"lr": lrs, "warmup_updates": warmup, "model_dim": model_dim, "_name": "x"})
    opt = Optimizer()
    return InverseSqrtWarmupSchedule(cfg, opt), opt


def paper_eq3(step_num, d_model, warmup):
    return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup ** -1.5)


STEPS = [0, 1, 2, 10, 3998, 3999, 4000, 4001, 10000, 100000]


def test_paper_form_matches_eq3():
    sched, opt = schedule(1.0, 4000, model_dim=512)
    assert opt.lr == pytest.approx(paper_eq3(1, 512, 4000), rel=1e-12)  # before the first update
    for num_updates in STEPS:
        lr = sched.step_update(num_updates)
        assert lr == opt.lr == pytest.approx(paper_eq3(num_updates + 1, 512, 4000), rel=1e-12)


def test_scale_multiplies_paper_form():
    sched, _ = schedule(2.0, 100, model_dim=64)
    assert sched.step_update(50) == pytest.approx(2.0 * paper_eq3(51, 64, 100), rel=1e-12)


def test_peak_form():
    peak, warmup = 5e-4, 4000
    sched, _ = schedule(peak, warmup)
    for num_updates in STEPS:
        t = num_updates + 1
        expected = peak * t / warmup if t <= warmup else peak * math.sqrt(warmup / t)
        assert sched.step_update(num_updates) == pytest.approx(expected, rel=1e-12)
    assert sched.step_update(warmup - 1) == pytest.approx(peak)  # the peak is reached at t = warmup
    assert max(sched.step_update(n) for n in range(0, 9000, 7)) <= peak * (1 + 1e-12)


def test_state_is_a_function_of_update_count():
    """A fresh scheduler put at update k (what a resume does) gives the same rate as one that ran there."""
    ran, _ = schedule(1.0, 30, model_dim=16)
    for n in range(100):
        ran.step_update(n)
    resumed, _ = schedule(1.0, 30, model_dim=16)
    resumed.load_state_dict(ran.state_dict())
    assert resumed.step_update(99) == ran.step_update(99)


@pytest.mark.parametrize("kwargs, flag", [({"warmup": 0}, "--warmup-updates 0"), ({"model_dim": -3}, "--model-dim -3"),
                                          ({"model_dim": 0}, "--model-dim 0"),
                                          ({"lr": [1e-3, 5e-4]}, r"^--lr \[0.001, 0.0005\]: inverse_sqrt_warmup takes exactly one"),
                                          ({"lr": []}, r"^--lr \[\]: inverse_sqrt_warmup takes exactly one value")])
def test_bad_values(kwargs, flag):
    args = {"lr": 1.0, "warmup": 10, **kwargs}
    with pytest.raises(ConfigError, match=flag):
        schedule(**args)


def test_the_smallest_valid_values_are_schedules():
    """--warmup-updates 1 (no warm-up) and --model-dim 1 give eq. 3, not an error."""
    sched, _ = schedule(1.0, 1, model_dim=1)
    for num_updates in (0, 1, 5):
        assert sched.step_update(num_updates) == pytest.approx(paper_eq3(num_updates + 1, 1, 1), rel=1e-12)


def test_the_command_line_gives_the_papers_schedule():
    """What fairseq-train builds from ``--lr-scheduler inverse_sqrt_warmup --model-dim 512`` (fairseq's parser
    and builder): the flags exist, and the default warm-up is the paper's 4000, so the rate peaks at update 4000."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--arch", "transformer", "--optimizer", "adam", "--lr", "1.0", "--lr-scheduler", "inverse_sqrt_warmup",
        "--model-dim", "512"])
    sched = build_lr_scheduler(convert_namespace_to_omegaconf(args).lr_scheduler, Optimizer())
    for num_updates in STEPS:
        assert sched.step_update(num_updates) == pytest.approx(paper_eq3(num_updates + 1, 512, 4000), rel=1e-12)
