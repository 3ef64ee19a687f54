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
    cfg = OmegaConf.create({"lr": [lr], "warmup_updates": warmup, "model_dim": model_dim, "_name": "x"})
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


@pytest.mark.parametrize("kwargs, flag", [({"warmup": 0}, "--warmup-updates 0"), ({"model_dim": -3}, "--model-dim -3")])
def test_bad_values(kwargs, flag):
    args = {"lr": 1.0, "warmup": 10, **kwargs}
    with pytest.raises(ConfigError, match=flag):
        schedule(**args)
