"""The one patch mechanism (fairseq_plugins/patches/): every patch can be taken out and put back,
leaving fairseq's own attributes; for each one, fairseq's behaviour with it out and the suite's
with it in; a target that changed keeps fairseq's behaviour with one warning line; the
environment variable that keeps fairseq's behaviour by name."""
import contextlib
import datetime
import importlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch
import fairseq
import hydra
from fairseq import checkpoint_utils, options, tasks
from fairseq import utils as fairseq_utils
from fairseq.data import data_utils, iterators
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from helpers import REPO, TINY_BUILTIN_TRANSFORMER, cli_env
from omegaconf import OmegaConf, open_dict

from fairseq_plugins import patches
from fairseq_plugins.errors import CheckpointError, ConfigError, NumericalError
from fairseq_plugins.network import free_port
from fairseq_plugins.patches._mechanism import Patch, Target, Wrap


OFFICIAL_0_12_2 = fairseq.__version__ == "0.12.2"  # the PyPI release, below Python 3.11 (docs/COMPATIBILITY.md)


@contextlib.contextmanager
def out(name):
    """Patch ``name`` (and the patches that require it) uninstalled for the block, then installed again."""
    before = [n for n, p in patches.PATCHES.items() if p.installed]
    assert name in before
    patches.uninstall(name)
    try:
        yield
    finally:
        for n in before:
            patches.install(n)
        assert all(patches.PATCHES[n].installed for n in before)


def targets():
    """Every attribute the patches replace, once (a Wrap's target is shared by its behaviours)."""
    return list({id(t): t for p in patches.PATCHES.values() for t in p.targets()}.values())


def where(target):
    """(module, class qualname or "", attribute) naming a target's owner in another process."""
    owner = target.owner
    if isinstance(owner, types.ModuleType):
        return owner.__name__, "", target.name
    return owner.__module__, owner.__qualname__, target.name


# In a process without the suite: what each attribute is ("module.qualname" or repr) and whether it is the owner's own.
# pytest imports the exceptiongroup backport on Python < 3.11, which replaces sys.excepthook; so does this process.
FRESH = """
import importlib, json, sys
if sys.version_info < (3, 11):
    import exceptiongroup
out = []
for module, cls, name in json.load(sys.stdin):
    owner = importlib.import_module(module)
    for part in filter(None, cls.split(".")):
        owner = getattr(owner, part)
    value = vars(owner).get(name, getattr(owner, name, None))
    out.append([getattr(value, "__module__", None), getattr(value, "__qualname__", repr(type(value))),
                name in vars(owner)])
print(json.dumps(out))
"""


def describe(target):
    owner = target.owner
    value = vars(owner).get(target.name, getattr(owner, target.name, None))
    return [getattr(value, "__module__", None), getattr(value, "__qualname__", repr(type(value))),
            target.name in vars(owner)]


def test_uninstall_leaves_fairseqs_own_attributes():
    """Uninstalled, every patched attribute is what a process that never imported the suite has."""
    listed = [t for t in targets() if not t.absent]
    fresh = subprocess.run([sys.executable, "-c", FRESH], input=json.dumps([where(t) for t in listed]),
                           capture_output=True, text=True, check=True, env=cli_env()).stdout
    fresh = json.loads(fresh.strip().splitlines()[-1])
    installed = [describe(t) for t in listed]
    assert installed != fresh  # the oracle: installed, they are the suite's
    patches.uninstall_all()
    try:
        assert not any(p.installed for p in patches.PATCHES.values())
        assert [describe(t) for t in listed] == fresh
        assert not any(hasattr(t.owner, t.name) for t in targets() if t.absent)
    finally:
        patches.install_all()
    out = {"batch_by_size", "resume_batches"} if OFFICIAL_0_12_2 else {"encoder_fast_path"}  # what each fairseq needs
    assert {n for n, p in patches.PATCHES.items() if not p.installed} == out


IDENTITY = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from fairseq_plugins import patches  # every patch disabled by the environment: nothing installed
assert not any(p.installed for p in patches.PATCHES.values())
targets = {id(t): t for p in patches.PATCHES.values() for t in p.targets()}.values()
fairseq_own = [(t, vars(t.owner).get(t.name), t.name in vars(t.owner)) for t in targets]
for name in patches.PATCHES:
    patches.install(name)
changed = sum(vars(t.owner).get(t.name) is not v or (t.name in vars(t.owner)) != own for t, v, own in fairseq_own)
patches.uninstall_all()
same = all(vars(t.owner).get(t.name) is v and (t.name in vars(t.owner)) == own for t, v, own in fairseq_own)
print(changed, len(fairseq_own), same)
"""


def test_install_then_uninstall_is_identity():
    """A process with every patch disabled by name has fairseq's attributes; installing all, then
    uninstalling all, leaves each attribute ``is`` fairseq's own object."""
    env = cli_env({patches.DISABLE: ",".join(patches.PATCHES)})
    out_ = subprocess.run([sys.executable, "-c", IDENTITY], capture_output=True, text=True, env=env, check=True)
    changed, total, same = out_.stdout.split()
    assert int(changed) == total_installed_targets() and same == "True", out_.stderr[-2000:]
    logged = out_.stderr.splitlines()
    assert all(f"fairseq-plugins: patch {name} disabled by FAIRSEQ_PLUGINS_DISABLE_PATCHES" in logged
               for name in patches.PATCHES)


def total_installed_targets():
    return len({id(t) for p in patches.PATCHES.values() if p.installed for t in p.targets()})


def test_order_follows_requires():
    order = list(patches.PATCHES)
    for name, patch in patches.PATCHES.items():
        assert all(order.index(r) < order.index(name) for r in patch.requires)
    assert order.index("cpu_launch") < order.index("cpu_fp16")
    assert "lost_worker" in patches.PATCHES["cpu_launch"].requires  # its spawned workers report a lost peer
    assert order.index("lost_worker") < order.index("cpu_launch")


# -- scoped replacements: Target.replaced (one thread) and Target.set_to -------------------------------------------

def test_a_scoped_replacement_is_for_the_calling_thread_only_and_leaves_what_it_found():
    owner = types.SimpleNamespace(f=lambda x: ("found", x))
    found = owner.f
    target = Target(owner, "f")
    inside, release, seen = threading.Event(), threading.Event(), {}

    def other_thread():
        seen["during"] = owner.f(1)

    def scoped():
        with target.replaced(lambda x: ("scoped",) + target(x)):
            inside.set()
            assert release.wait(60)
            seen["scoped"] = owner.f(2)
    worker = threading.Thread(target=scoped)
    worker.start()
    try:
        assert inside.wait(60)
        other = threading.Thread(target=other_thread)
        other.start()
        other.join(60)
    finally:
        release.set()
        worker.join(60)
    assert seen == {"during": ("found", 1), "scoped": ("scoped", "found", 2)}
    assert owner.f is found


def test_a_wrapper_installed_inside_a_scoped_window_is_kept_and_nesting_applies_once():
    class Base:
        def f(self, x):
            return ("fairseq", x)

    class Child(Base):
        pass
    target = Target(Child, "f")
    with target.replaced(lambda self, x: ("outer",) + target(self, x)):
        with target.replaced(lambda self, x: ("inner",) + target(self, x)):
            assert Child().f(1) == ("inner", "fairseq", 1)
        assert Child().f(1) == ("outer", "fairseq", 1)
    assert "f" not in vars(Child)  # inherited: deleted again

    with target.replaced(lambda self, x: ("scoped",) + target(self, x)):
        dispatcher = Child.f
        Child.f = lambda self, x: ("later",) + dispatcher(self, x)
        later = Child.f
        assert Child().f(1) == ("later", "scoped", "fairseq", 1)
    assert Child.f is later and Child().f(1) == ("later", "fairseq", 1)  # kept; the scope passes through


def test_set_to_restores_an_instance_attribute_or_its_absence():
    obj = types.SimpleNamespace(flag=False)
    with Target(obj, "flag").set_to(True):
        assert obj.flag is True
    assert obj.flag is False
    with Target(obj, "absent").set_to(1):
        assert obj.absent == 1
    assert not hasattr(obj, "absent")


# -- a target that is not what the patch expects -------------------------------------------------------------------

class Owner:
    def method(self, x, y):
        return ("fairseq", x, y)

    def other(self, x):
        return ("fairseq other", x)


def replacement(self, x, y):
    return ("suite",) + FAKE_METHOD(self, x, y)


FAKE_METHOD = Target(Owner, "method", "self, x, y")


@pytest.mark.parametrize("bad", [Target(Owner, "missing", "self"), Target(Owner, "other", "self, x, z")],
                         ids=["missing", "changed signature"])
def test_a_changed_target_keeps_fairseqs_behaviour_with_one_warning(caplog, bad):
    fake = Patch("tests.fake", {FAKE_METHOD: replacement, bad: lambda self, x: None})
    with caplog.at_level(logging.DEBUG, logger="fairseq_plugins.patches"):
        assert not fake.install()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("fairseq-plugins: patch fake not installed, fairseq's own behaviour is kept")
    assert repr(bad) in lines[0] and "fairseq 0.12" in lines[0]
    assert Owner().method(1, 2) == ("fairseq", 1, 2) and Owner().other(1) == ("fairseq other", 1)  # nothing half-done
    assert "missing" not in vars(Owner)


def test_fake_patch_install_uninstall_inherited():
    """An inherited attribute: the replacement calls the original; uninstalling deletes it again."""
    class Child(Owner):
        pass
    target = Target(Child, "method", "self, x, y")
    fake = Patch("tests.child", {target: lambda self, x, y: ("suite",) + target(self, x, y)})
    assert fake.install() and Child().method(1, 2) == ("suite", "fairseq", 1, 2)
    fake.uninstall()
    assert "method" not in vars(Child) and Child.method is Owner.method


def test_two_behaviours_of_one_attribute_run_in_the_declared_order_and_uninstall_in_either_order():
    """One Wrap: the order its list gives, whichever behaviour goes in first; either one out leaves the other."""
    class Stack(Owner):
        def method(self, x, y):
            return ("fairseq", x, y)
    wrap = Wrap(Target(Stack, "method", "self, x, y"), order=["upper", "lower"])
    lower = Patch("tests.lower", steps={wrap: lambda call, self, x, y: ("lower",) + call(self, x, y)})
    upper = Patch("tests.upper", steps={wrap: lambda call, self, x, y: ("upper",) + call(self, x, y)})
    fairseq_own = vars(Stack)["method"]
    for first, second in ((lower, upper), (upper, lower)):
        assert first.install() and second.install()
        assert Stack().method(1, 2) == ("upper", "lower", "fairseq", 1, 2)
        first.uninstall()
        assert Stack().method(1, 2) == (second.name, "fairseq", 1, 2)
        first.install()
        second.uninstall()
        assert Stack().method(1, 2) == (first.name, "fairseq", 1, 2)
        first.uninstall()
        assert vars(Stack)["method"] is fairseq_own


def test_an_attribute_two_patches_replace_is_refused_unless_they_share_a_wrap(monkeypatch):
    """Each fairseq function is replaced once: two behaviours replacing one attribute are a declaration error."""
    module = types.ModuleType("tests_two")
    module.PATCHES = [Patch("one", {Target(Owner, "method", "self, x, y"): replacement}),
                      Patch("two", {Target(Owner, "method", "self, x, y"): replacement})]
    monkeypatch.setattr(patches, "GROUPS", ["tests_two"])
    monkeypatch.setattr(patches.pkgutil, "iter_modules", lambda path: [types.SimpleNamespace(name="tests_two")])
    monkeypatch.setattr(patches.importlib, "import_module", lambda name: module)
    with pytest.raises(RuntimeError, match=r"\.Owner\.method is replaced by patches one and two: declare a Wrap$"):
        patches._declared()


def test_the_order_of_every_shared_fairseq_function_is_declared_and_each_behaviour_alone_leaves_the_others():
    """Every Wrap lists its behaviours, outermost first, in code; taking any one out (and back) keeps the
    others' steps in the same order and the attribute the one replacement."""
    wraps = {id(w): w for p in patches.PATCHES.values() for w in p.steps}.values()
    assert {repr(w.target): list(w.order) for w in wraps} == {
        "fairseq.trainer.Trainer.save_checkpoint": ["patience_state", "elastic_resume", "divergence", "numerical_faults"],
        "fairseq.checkpoint_utils.load_checkpoint": ["patience_state", "finished_run", "elastic_resume", "divergence"],
        "fairseq.trainer.Trainer.train_step": ["divergence", "numerical_faults"],
        "fairseq.distributed.utils.call_main": ["cpu_fp16", "cpu_launch"],
        "fairseq.sequence_generator.SequenceGenerator.generate": ["max_len_warning", "match_source_len"],
        "fairseq.sequence_generator.SequenceGeneratorWithAlignment.generate":
            ["max_len_warning", "match_source_len", "alignment_attention"],
    }
    for wrap in wraps:
        assert list(wrap.steps) == list(wrap.order)  # all in on this fairseq
        for name in wrap.order:
            # out: it and the behaviours that require it (divergence requires numerical_faults)
            others = [n for n in wrap.order if n != name and name not in patches.PATCHES[n].requires]
            with out(name):
                assert list(wrap.steps) == others and all(patches.PATCHES[n].installed for n in others)
                assert (getattr(wrap.target.owner, wrap.target.name) is wrap.run) == bool(others)
            assert list(wrap.steps) == list(wrap.order) and getattr(wrap.target.owner, wrap.target.name) is wrap.run


def test_a_patch_of_a_fix_fairseq_has_stays_out_silently(caplog):
    """Not needed on this fairseq: out, no line at any level (a plain run prints nothing about it)."""
    fake = Patch("tests.fixed", {FAKE_METHOD: replacement}, fixed_upstream=lambda: True)
    with caplog.at_level(logging.DEBUG, logger="fairseq_plugins.patches"):
        assert not fake.install()
    assert caplog.records == []
    assert "has this fix" in fake.unneeded() and Owner().method(1, 2) == ("fairseq", 1, 2)


# -- the environment variable -------------------------------------------------------------------------------------

def test_disable_by_name_and_unknown_name():
    assert patches.disabled(" no_repeat_ngram,cpu_launch ") == {"no_repeat_ngram", "cpu_launch"}
    with pytest.raises(ConfigError) as e:
        patches.disabled("no_repeat_ngram,no_such_patch")
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        "FAIRSEQ_PLUGINS_DISABLE_PATCHES='no_repeat_ngram,no_such_patch': no patch named no_such_patch; the patches are ")
    assert all(name in message for name in patches.PATCHES)


def test_unknown_name_in_the_environment_is_refused_and_nothing_changes(monkeypatch):
    monkeypatch.setenv(patches.DISABLE, "nope")
    monkeypatch.setattr(patches, "_disabled", None)  # as in a process that has not installed yet
    patches.uninstall("no_repeat_ngram")
    try:
        with pytest.raises(ConfigError, match=r"^FAIRSEQ_PLUGINS_DISABLE_PATCHES='nope': no patch named nope; "):
            patches.install_all()
        assert not patches.PATCHES["no_repeat_ngram"].installed
    finally:
        patches.install("no_repeat_ngram")


def test_a_patch_whose_requirement_is_out_stays_out(caplog):
    with out("checkpoint_loading"):
        assert not patches.PATCHES["broadcast_state"].installed
        with caplog.at_level(logging.INFO, logger="fairseq_plugins.patches"):
            assert not patches.install("broadcast_state", skip={"checkpoint_loading"})
        assert [r.getMessage() for r in caplog.records] == [
            "fairseq-plugins: patch broadcast_state left out (fairseq's own behaviour kept): it requires "
            "checkpoint_loading, which is not installed"]


@pytest.mark.parametrize("applies, installed", [(False, True), (True, False)])
def test_a_requirement_this_fairseq_does_not_need_counts_as_met(monkeypatch, applies, installed):
    """Beside a required patch that is out because fairseq behaves so itself, a patch goes in (0.12.2's
    elastic_resume beside resume_batches); beside one that cannot go in, it stays out."""
    other = Target(Owner, "other", "self, x")
    required = Patch("tests.required", {Target(Owner, "missing", "self"): None}, applies=lambda: applies)
    dependent = Patch("tests.dependent", {other: lambda self, x: ("suite",) + other(self, x)}, requires=["required"])
    monkeypatch.setitem(patches.PATCHES, "required", required)
    monkeypatch.setitem(patches.PATCHES, "dependent", dependent)
    assert patches.install("dependent") == installed and not required.installed
    assert Owner().other(1) == (("suite", "fairseq other", 1) if installed else ("fairseq other", 1))
    dependent.uninstall()


# -- for each patch: fairseq's behaviour with it out, the suite's with it in -------------------------------------------

@pytest.fixture(scope="module")
def tiny(data_bin):
    """(cfg, task, model, sample): an untrained vaswani_transformer_tiny on ``data_bin`` and 4 validation sentences."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--arch", "vaswani_transformer_tiny", "--encoder-layers", "1", "--decoder-layers", "1",
        "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--seed", "1", "--max-tokens", "500"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    torch.manual_seed(1)
    model = task.build_model(cfg.model).eval()
    model.prepare_for_inference_(cfg)  # as fairseq-generate and the hub do: attention only on demand
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(4)])
    return cfg, task, model, sample


def generation(cfg, **options_):
    gen = OmegaConf.create(OmegaConf.to_container(cfg.generation))
    with open_dict(gen):
        gen.update({"beam": 2, "max_len_b": 10, **options_})
    return gen


def hypotheses(tiny, **options_):
    cfg, task, model, sample = tiny
    generator = task.build_generator([model], generation(cfg, **options_))
    return generator, task.inference_step(generator, [model], sample)


def has_repeat(tokens, n=2):
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


def test_no_repeat_ngram(tiny):
    def repeats():
        _, hypos = hypotheses(tiny, no_repeat_ngram_size=2)
        return sum(has_repeat(h[0]["tokens"].tolist()) for h in hypos)
    with out("no_repeat_ngram"):
        assert repeats() > 0  # fairseq's CPU fallback bans nothing
    assert repeats() == 0


def test_torchscript_of_fairseqs_generator_with_the_suite(tiny, data_bin):
    """As fairseq's own test_ensemble_sequence_generator: scripting compiles the patched n-gram block."""
    from fairseq.sequence_generator import SequenceGenerator
    _, task, _, sample = tiny
    args = options.parse_args_and_arch(options.get_training_parser(), [data_bin, *TINY_BUILTIN_TRANSFORMER])
    torch.manual_seed(1)
    model = task.build_model(convert_namespace_to_omegaconf(args).model).eval()
    scripted = torch.jit.script(SequenceGenerator([model], task.tgt_dict, beam_size=2, no_repeat_ngram_size=2,
                                                  max_len_b=10))
    net_input = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}
    for hypos in scripted({"net_input": net_input}):
        assert not has_repeat(hypos[0]["tokens"].tolist())


def test_match_source_len(tiny):
    sample = tiny[3]
    words = (sample["net_input"]["src_tokens"].ne(1) & sample["net_input"]["src_tokens"].ne(2)).sum(1).tolist()

    def lengths():
        _, hypos = hypotheses(tiny, match_source_len=True)
        return [len(h[0]["tokens"]) - 1 for h in hypos]  # without the EOS
    with out("match_source_len"):  # fairseq's main branch counts the source's EOS; 0.12.2 does not
        assert lengths() == (words if OFFICIAL_0_12_2 else [w + 1 for w in words])
    assert lengths() == words


def test_max_len_warning_counts_per_generator(tiny):
    with out("max_len_warning"):
        generator, _ = hypotheses(tiny, max_len_b=3)
        assert "length_limit_counts" not in vars(generator)
    first, hypos = hypotheses(tiny, max_len_b=3)
    second, _ = hypotheses(tiny, max_len_b=3)
    tiny[1].inference_step(second, [tiny[2]], tiny[3])
    cut = sum(len(h[0]["tokens"]) > 3 for h in hypos)
    assert cut > 0 and (first.length_limit_counts.sentences, first.length_limit_counts.at_limit) == (4, cut)
    assert (second.length_limit_counts.sentences, second.length_limit_counts.at_limit) == (8, 2 * cut)


def test_alignment_attention(tiny):
    cfg, task, model, sample = tiny

    def align():
        generator, hypos = hypotheses(tiny, print_alignment="hard")
        return hypos
    with out("alignment_attention"):
        with pytest.raises(IndexError):  # the suite's Transformer computes attention only on demand
            align()
    hypos = align()
    assert all(len(h[0]["alignment"]) > 0 for h in hypos)


def test_replace_unk(tiny):
    cfg = tiny[0]
    with out("replace_unk"):
        generator, _ = hypotheses(tiny, replace_unk="@@ ")
        assert not getattr(generator, "unk_alignment", False)
        with pytest.raises(FileNotFoundError):
            fairseq_utils.load_align_dict("@@ ")  # --replace-unk alone: fairseq opens a file named '@@ '
    model = tiny[2]
    need_attn = {name: m.need_attn for name, m in model.named_modules() if hasattr(m, "need_attn")}
    assert need_attn and not any(need_attn.values())  # prepared for inference: attention only on demand
    generator, hypos = hypotheses(tiny, replace_unk="@@ ")
    assert generator.unk_alignment and all(len(h[0]["alignment"]) > 0 for h in hypos)
    assert fairseq_utils.load_align_dict("@@ ") == {}
    # attention was on for that generation only: the next one, without --replace-unk, computes none
    assert {name: m.need_attn for name, m in model.named_modules() if hasattr(m, "need_attn")} == need_attn


def test_hub_score(tiny):
    from fairseq.hub_utils import GeneratorHubInterface
    cfg, task, model, sample = tiny
    hub = GeneratorHubInterface(cfg, task, [model])
    source = task.src_dict.string(sample["net_input"]["src_tokens"][0]).replace("<pad>", "").strip()
    with out("hub_score"):
        with pytest.raises(TypeError):
            hub.score(source)
    scored = hub.score(source, targets="the")
    assert scored["positional_scores"].shape == (2,)  # "the" and the EOS


def test_batch_by_size():
    indices = np.arange(5, dtype=np.int64)

    def covered():
        batches = data_utils.batch_by_size(indices, num_tokens_fn=lambda i: 1, max_sentences=2,
                                           required_batch_size_multiple=2)
        return sorted(int(i) for b in batches for i in b)
    assert patches.PATCHES["batch_by_size"].installed != OFFICIAL_0_12_2  # 0.12.2 keeps every index itself
    if not OFFICIAL_0_12_2:
        with out("batch_by_size"):
            assert covered() == [0, 1, 2, 3]  # fairseq's main branch drops the last batch
    assert covered() == [0, 1, 2, 3, 4]


def test_checkpoint_loading(tmp_path):
    path = tmp_path / "not_a_checkpoint.pt"
    path.write_bytes(b"PK\x03\x04 truncated")
    with out("checkpoint_loading"):
        with pytest.raises(Exception) as fairseq_error:
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert not isinstance(fairseq_error.value, CheckpointError)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))}: not a readable checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    # a torch file that is no fairseq checkpoint (a bare state_dict()): fairseq's upgrade raises a KeyError
    state_dict = tmp_path / "state_dict.pt"
    torch.save({"encoder.w": torch.ones(2)}, state_dict)
    with out("checkpoint_loading"):
        with pytest.raises(KeyError):
            checkpoint_utils.load_checkpoint_to_cpu(str(state_dict))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(state_dict))}: not a fairseq checkpoint \(no 'model'"):
        checkpoint_utils.load_checkpoint_to_cpu(str(state_dict))


def test_the_weights_only_window_keeps_other_loads_and_later_wrappers(tmp_path):
    """A torch.load wrapper installed after the suite is called during fairseq's load and still there after;
    another thread's torch.load in that window is not made weights-only."""
    path = tmp_path / "state.pt"
    torch.save({"model": {}, "obj": types.SimpleNamespace(a=1)}, path)  # a class no allowlist holds
    calls, seen = [], {}
    real = torch.load

    def wrapper(f, *args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        if threading.current_thread() is threading.main_thread():
            other = threading.Thread(target=lambda: seen.update(other=real_load_through_torch(path)))
            other.start()
            other.join()
        return real(f, *args, **kwargs)

    def real_load_through_torch(p):
        return torch.load(p, weights_only=False)["obj"].a

    torch.load = wrapper
    try:
        with pytest.raises(CheckpointError, match="SimpleNamespace"):
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert torch.load is wrapper
    finally:
        torch.load = real
    assert calls[0] is True and seen == {"other": 1}


def test_broadcast_state(monkeypatch):
    """rank 1's side of fairseq's pickle broadcast: a DictConfig arrives (fairseq's refuses it under torch >= 2.6)."""
    state = {"cfg": OmegaConf.create({"model": {"dropout": 0.1}}), "n": 3}
    wire = []

    def broadcast(tensor, src, group=None):
        if sending[0]:
            wire.append(tensor.clone())
        else:
            tensor.copy_(wire.pop(0))

    monkeypatch.setattr(distributed_utils, "broadcast", broadcast)

    def send_then_receive():
        wire.clear()
        sending[0] = True
        monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 0)
        distributed_utils._broadcast_object_slow(state, 0, None, torch.device("cpu"))
        sending[0] = False
        monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 1)
        return distributed_utils._broadcast_object_slow(None, 0, None, torch.device("cpu"))
    sending = [True]
    with out("broadcast_state"):
        with pytest.raises(Exception, match="Weights only load failed"):
            send_then_receive()
    received = send_then_receive()
    assert received["n"] == 3 and received["cfg"].model.dropout == 0.1


def test_atomic_checkpoints(tmp_path):
    path = str(tmp_path / "checkpoint_last.pt")
    unpicklable = {"f": lambda: 0}
    with out("atomic_checkpoints"):
        with pytest.raises(Exception):
            checkpoint_utils.torch_persistent_save(unpicklable, path)
        assert os.listdir(tmp_path) == ["checkpoint_last.pt.tmp"]  # fairseq leaves the half-written file
        os.remove(path + ".tmp")
    with pytest.raises(Exception):
        checkpoint_utils.torch_persistent_save(unpicklable, path)
    assert os.listdir(tmp_path) == []


def test_numerical_faults(tiny, tmp_path):
    from fairseq.trainer import Trainer
    cfg, task, model, _ = tiny
    with open_dict(cfg):
        cfg.checkpoint.save_dir = str(tmp_path)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # as checkpoint_utils.save_checkpoint does first
    weight = next(model.parameters())
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[0, 0] = float("inf")
        with out("numerical_faults"):
            trainer.save_checkpoint(str(tmp_path / "checkpoint_1.pt"), {})  # fairseq saves Inf parameters
            assert os.path.exists(tmp_path / "checkpoint_1.pt")
        with pytest.raises(NumericalError, match="checkpoint_2.pt was not written"):
            trainer.save_checkpoint(str(tmp_path / "checkpoint_2.pt"), {})
        assert not os.path.exists(tmp_path / "checkpoint_2.pt")
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_resume_batches(tiny):
    _, task, _, _ = tiny
    task.load_dataset("train")
    dataset = task.dataset("train")

    def epoch2(start_epoch):
        task.dataset_to_epoch_iter.clear()
        iterator = task.get_batch_iterator(dataset, max_tokens=500, seed=1, epoch=start_epoch)
        if start_epoch == 1:
            list(iterator.next_epoch_itr(shuffle=True))  # the whole of epoch 1
        return [b["id"].tolist() for b in iterator.next_epoch_itr(shuffle=True)]
    if OFFICIAL_0_12_2:  # it groups with the seed alone, so the patch stays out
        assert not patches.PATCHES["resume_batches"].installed
    else:
        with out("resume_batches"):
            assert sorted(map(sorted, epoch2(1))) != sorted(map(sorted, epoch2(2)))  # other groups of sentences
    assert epoch2(1) == epoch2(2)


def test_clean_exit():
    def blocked_consumer():
        iterator = iterators.BufferedIterator(1, range(100))
        next(iterator)  # starts the thread; it fills the queue and blocks on put
        return iterator._consumer
    with out("clean_exit"):
        consumer = blocked_consumer()
        assert not hasattr(consumer, "stop")  # fairseq's thread can only be abandoned
    consumer = blocked_consumer()
    importlib.import_module("fairseq_plugins.patches.preemption").stop_consumers()
    assert not consumer.is_alive()


def test_one_line_errors(capsys):
    error = ConfigError("--arch nope: no such model")
    with out("command_line"):
        sys.excepthook(ConfigError, error, None)
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith("ConfigError: --arch nope: no such model")
    sys.excepthook(ConfigError, error, None)
    assert capsys.readouterr().err == "error: --arch nope: no such model\n"


def slurm_cfg(data_bin, *flags):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--arch", "rnnsearch_tiny", "--optimizer", "adam", "--lr", "1e-3", "--cpu", *flags])
    return convert_namespace_to_omegaconf(args)


def test_cpu_launch(data_bin, monkeypatch):
    """Two SLURM tasks on CPU: fairseq makes each an independent world of 1; the suite joins them."""
    for key, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                       "SLURM_JOB_NODELIST": "node[3-4]"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol
    started = []
    monkeypatch.setattr(distributed_utils, "distributed_main",
                        lambda i, main, cfg, kwargs: started.append(("worker", cfg.distributed_training)))

    def main(cfg, **kwargs):
        started.append(("alone", cfg.distributed_training))
    with out("cpu_launch"):
        distributed_utils.call_main(slurm_cfg(data_bin, "--distributed-port", "12345"), main)
        assert started[-1][0] == "alone" and started[-1][1].distributed_world_size == 1
    distributed_utils.call_main(slurm_cfg(data_bin, "--distributed-port", "12345"), main)
    kind, d = started[-1]
    assert (kind, d.distributed_world_size, d.distributed_init_method, d.distributed_backend, d.ddp_backend) == (
        "worker", 2, "tcp://node3:12345", "gloo", "legacy_ddp")


def test_cpu_fp16(data_bin):
    ran = []
    with out("cpu_fp16"):
        distributed_utils.call_main(slurm_cfg(data_bin, "--fp16"), lambda cfg, **kw: ran.append(cfg))
        assert len(ran) == 1  # fairseq trains in fp16 on CPU until the first overflow
    with pytest.raises(ConfigError, match="^--fp16: fairseq's fp16 training needs a CUDA GPU"):
        distributed_utils.call_main(slurm_cfg(data_bin, "--fp16"), lambda cfg, **kw: ran.append(cfg))


def test_lost_worker(data_bin, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")

    def dies(cfg, **kwargs):
        raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")

    def run():
        cfg = slurm_cfg(data_bin, "--distributed-world-size", "1", "--distributed-backend", "gloo",
                        "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}")
        try:
            distributed_utils.distributed_main(0, dies, cfg, {})
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    with out("lost_worker"):
        with pytest.raises(RuntimeError, match=r"^\[gloo\] Connection closed by peer"):
            run()
    with pytest.raises(RuntimeError, match=r"^lost a worker on another host of 1 during training \(gloo: Connection "
                                           r"closed by peer\); stopped; restart all workers"):
        run()


def test_heartbeat_timeout_reaches_init_process_group_which_is_left_as_found(data_bin, monkeypatch):
    """--heartbeat-timeout S: the process group's timeout, through a torch.distributed.init_process_group
    installed after the suite (kept afterwards, as found)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    timeouts, real = [], torch.distributed.init_process_group

    def recording(*args, **kwargs):
        timeouts.append(kwargs.get("timeout"))
        return real(*args, **kwargs)
    monkeypatch.setattr(torch.distributed, "init_process_group", recording)
    cfg = slurm_cfg(data_bin, "--distributed-world-size", "1", "--distributed-backend", "gloo", "--heartbeat-timeout",
                    "17", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}")
    try:
        distributed_utils.distributed_init(cfg)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert timeouts == [datetime.timedelta(seconds=17)]
    assert torch.distributed.init_process_group is recording


def test_the_first_preemption_signal_is_the_one_named_and_arms_one_deadline(monkeypatch):
    """The watcher fed through its pipe as the C handler feeds it (no real signal: pytest keeps its
    own): SIGINT, then SIGTERM, SIGUSR1 and SIGTERM again. SIGINT is not a preemption; the stop names
    SIGTERM, and one --preemption-timeout deadline is armed, a daemon (it must not hold the exit of
    a run that ends normally after the signal)."""
    from fairseq_plugins.patches import preemption
    deadlines = []

    class Deadline:
        def __init__(self, seconds, then):
            self.seconds, self.daemon = seconds, False

        def start(self):
            deadlines.append((self.seconds, self.daemon))

    monkeypatch.setattr(preemption.threading, "Timer", Deadline)
    run = preemption.Preemption(30.0)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, bytes([signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGTERM]))
    os.close(write_fd)
    with contextlib.suppress(IndexError):  # the pipe's end: an empty read (a real one never ends)
        run._watch(read_fd)
    os.close(read_fd)
    assert run.received == "SIGTERM" and deadlines == [(30.0, True)]


class _Exited(Exception):
    """os._exit, made to return to the test."""


def test_a_stop_saves_once_and_once_saved_its_deadline_says_no_lie(monkeypatch, tmp_path, capsys):
    """A stop agreed after an update fairseq has just saved (--save-interval-updates) writes no second
    checkpoint, one after an update it has not saved writes one; and once the stop's checkpoint is
    written, a --preemption-timeout deadline that fires (rank 0 waiting at the barrier for a slow peer)
    exits without its "stopped without a new checkpoint" line. fairseq's save and the exit are faked."""
    from fairseq_plugins.patches import preemption
    saves = []
    monkeypatch.setattr(preemption, "SAVE",
                        lambda cfg, trainer, epoch_itr, val_loss: saves.append(trainer.get_num_updates()))
    monkeypatch.setattr(preemption.os, "_exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    monkeypatch.setattr(preemption.logging, "shutdown", lambda: None)  # pytest's own handlers stay open
    trainer = types.SimpleNamespace(get_num_updates=lambda: 6, data_parallel_world_size=1, data_parallel_rank=0,
                                    checkpoint_suffix="")
    cfg = types.SimpleNamespace(checkpoint=types.SimpleNamespace(save_dir=str(tmp_path)))
    for scheduled_save in (True, False):
        trainer.preemption = preemption.Preemption(60.0)
        trainer.preemption.received = "SIGTERM"
        saves.clear()
        if scheduled_save:
            checkpoint_utils.save_checkpoint(cfg, trainer, None, None)  # fairseq's save of update 6
        with pytest.raises(_Exited, match=str(preemption.EXIT_PREEMPTED)):
            preemption._stop(cfg, trainer, None, trainer.preemption)
        assert saves == [6], scheduled_save
        assert capsys.readouterr().err.splitlines() == [
            f"preempted (SIGTERM): saved {tmp_path}/checkpoint_last.pt at update 6; rerun the same command to "
            f"resume (exit status {preemption.EXIT_PREEMPTED})"]
    with pytest.raises(_Exited):
        trainer.preemption._give_up()
    assert capsys.readouterr().err == ""


def test_preemption_option_from_the_configuration(data_bin):
    with out("preemption"):
        with pytest.raises(SystemExit):  # fairseq has no such flag
            slurm_cfg(data_bin, "--preemption-timeout", "30")
    assert slurm_cfg(data_bin, "--preemption-timeout", "30").checkpoint.preemption_timeout == 30
    assert slurm_cfg(data_bin).checkpoint.preemption_timeout == 60


@pytest.mark.parametrize("timeout", [-5.0, 0.0, 0.5])
def test_preemption_timeout_reaches_the_patch_through_train_main(data_bin, tmp_path, timeout):
    """``fairseq_cli.train.main(cfg)`` from Python: the value in the cfg is the one the patch checks;
    any positive number of seconds is taken, below one too."""
    import fairseq_cli.train
    cfg = slurm_cfg(data_bin, "--max-update", "1", "--save-dir", str(tmp_path), "--max-tokens", "500",
                    "--num-workers", "0")
    with open_dict(cfg):
        cfg.checkpoint.preemption_timeout = timeout
    if timeout > 0:
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            fairseq_cli.train.main(cfg)
        finally:  # the run armed its signals in this process: give pytest's back
            signal.set_wakeup_fd(-1)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        assert (tmp_path / "checkpoint_last.pt").is_file()
        return
    with pytest.raises(ConfigError, match=rf"^--preemption-timeout {timeout:g}: must be a positive number of seconds$"):
        fairseq_cli.train.main(cfg)


def test_preemption_timeout_reaches_the_patch_through_hydra_train(data_bin, tmp_path):
    """A config file as fairseq's docs write them, and the option added on the command line with ``+``."""
    (tmp_path / "run.yaml").write_text(f"""
task: {{_name: translation, data: {data_bin}}}
model: {{_name: transformer, encoder_layers: 1, decoder_layers: 1, encoder_embed_dim: 32, decoder_embed_dim: 32,
        encoder_ffn_embed_dim: 64, decoder_ffn_embed_dim: 64}}
criterion: {{_name: cross_entropy}}
optimizer: {{_name: adam}}
lr_scheduler: {{_name: fixed}}
optimization: {{lr: [0.001], max_update: 1}}
dataset: {{max_tokens: 500, num_workers: 0}}
common: {{cpu: true, user_dir: {REPO}/fairseq_plugins}}
checkpoint: {{save_dir: {tmp_path}}}
""")
    out_ = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-hydra-train"),
                           "--config-dir", str(tmp_path), "--config-name", "run", "+checkpoint.preemption_timeout=-5",
                           f"hydra.run.dir={tmp_path}/hydra"],
                          capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
    if hydra.__version__.startswith("1.0."):  # fairseq 0.12.2's hydra adds no key to a schema (docs/COMPATIBILITY.md)
        assert "Key 'preemption_timeout' not in 'CheckpointConfig'" in out_.stderr, out_.stderr[-3000:]
    else:
        assert "--preemption-timeout -5: must be a positive number of seconds" in out_.stderr, out_.stderr[-3000:]


def test_encoder_fast_path_is_only_for_fairseq_0_12_2(caplog, tiny):
    """0.12.2: a loaded built-in transformer encodes as one never loaded (fairseq's own path dies); others: out."""
    patch = patches.PATCHES["encoder_fast_path"]
    if not OFFICIAL_0_12_2:  # fairseq-fixed has no fast path to keep off: the patch stays out
        assert not patch.installed
        with caplog.at_level(logging.DEBUG, logger="fairseq_plugins.patches"):
            assert not patch.install()
        assert caplog.records == [] and "not for this fairseq" in patch.unneeded()  # silent: not needed here
        return
    cfg, task, _, sample = tiny
    with open_dict(cfg):
        cfg.model._name = "transformer"
    torch.manual_seed(1)
    never_loaded = task.build_model(cfg.model).eval()  # the ordinary path: the oracle

    def encode():
        model = task.build_model(cfg.model)
        model.load_state_dict(never_loaded.state_dict())  # as fairseq-generate loads a checkpoint
        return model.eval().encoder(source, lengths)["encoder_out"][0]
    source, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    with torch.no_grad():
        expected = never_loaded.encoder(source, lengths)["encoder_out"][0]
        with out("encoder_fast_path"), pytest.raises(RuntimeError, match="Mask Type"):
            encode()
        assert patch.installed
        torch.testing.assert_close(encode(), expected, rtol=0, atol=0)
