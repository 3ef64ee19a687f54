"""The one patch mechanism (fairseq_plugins/patches/_mechanism.py, __init__.py): every patch can be taken out and
put back, leaving fairseq's own attributes; the order of the steps of a shared fairseq function is declared; a
target that changed keeps fairseq's behaviour with one warning line; the environment variable that keeps
fairseq's behaviour by name."""
import json
import logging
import subprocess
import sys
import threading
import types

import pytest
from helpers import cli_env
from patching import OFFICIAL_0_12_2, out

from fairseq_plugins import patches
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target, Wrap, versions


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
        assert set(wrap.steps) == set(wrap.order)  # all in on this fairseq
        for name in wrap.order:
            # out: it and the behaviours that require it (divergence requires numerical_faults)
            others = [n for n in wrap.order if n != name and name not in patches.PATCHES[n].requires]
            with out(name):
                assert [n for n in wrap.order if n in wrap.steps] == others
                assert all(patches.PATCHES[n].installed for n in others)
                assert (getattr(wrap.target.owner, wrap.target.name) is wrap.run) == bool(others)
            assert set(wrap.steps) == set(wrap.order) and getattr(wrap.target.owner, wrap.target.name) is wrap.run


def test_a_patch_of_a_fix_fairseq_has_stays_out_silently(caplog):
    """Not needed on this fairseq: out, no line at any level (a plain run prints nothing about it)."""
    fake = Patch("tests.fixed", {FAKE_METHOD: replacement}, fixed_upstream=lambda: True)
    with caplog.at_level(logging.DEBUG, logger="fairseq_plugins.patches"):
        assert not fake.install()
    assert caplog.records == []
    assert "has this fix" in fake.unneeded() and Owner().method(1, 2) == ("fairseq", 1, 2)


def test_disable_by_name_and_unknown_name():
    assert patches.disabled(" no_repeat_ngram,cpu_launch ") == {"no_repeat_ngram", "cpu_launch"}
    with pytest.raises(ConfigError) as e:
        patches.disabled("no_repeat_ngram,no_such_patch")
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        "FAIRSEQ_PLUGINS_DISABLE_PATCHES='no_repeat_ngram,no_such_patch': no patch named no_such_patch; the patches are ")
    assert all(name in message for name in patches.PATCHES)
    assert message.endswith(f"; the groups are {', '.join(patches.GROUPS)}")


def test_a_group_name_disables_its_behaviours():
    """Users' settings name behaviours (the old patch names); a group's name stands for all of its own."""
    assert patches.disabled("numerical,cpu_launch") == {"numerical_faults", "divergence", "cpu_launch"}
    assert patches.disabled("resume") == {"resume_batches", "elastic_resume", "finished_run", "patience_state"}
    assert sorted(n for names in patches.GROUP_PATCHES.values() for n in names) == sorted(patches.PATCHES)


def _check_overflow_without_a_floor(self, grad_norm):
    return None


def _gone(owner, name):
    return lambda monkeypatch: monkeypatch.delattr(owner, name)


def _private_attributes():
    from fairseq.data import iterators
    from fairseq.distributed import utils as distributed_utils
    from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler
    from fairseq.trainer import Trainer
    return [
        ("broadcast_state", _gone(distributed_utils, "_TensorPlaceholder"),
         "fairseq.distributed.utils._TensorPlaceholder is missing"),
        ("numerical_faults", _gone(Trainer, "_set_seed"), "fairseq.trainer.Trainer._set_seed is missing"),
        ("clean_exit", _gone(iterators, "_sentinel"), "fairseq.data.iterators._sentinel is missing"),
        # set by __init__: an __init__ that no longer sets it
        ("elastic_resume", lambda m: m.setattr(iterators.EpochBatchIterator, "__init__", lambda self, *a, **k: None),
         "fairseq.data.iterators.EpochBatchIterator._supports_prefetch is missing (no longer set by its __init__)"),
        # the error message it recognises
        ("divergence", lambda m: m.setattr(DynamicLossScaler, "check_overflow", _check_overflow_without_a_floor),
         "fairseq.optim.dynamic_loss_scaler.DynamicLossScaler.check_overflow no longer holds "
         "'Minimum loss scale reached'"),
    ]


@pytest.mark.parametrize("case", range(5), ids=["_TensorPlaceholder", "_set_seed", "_sentinel", "instance attribute",
                                                "matched message"])
def test_a_private_fairseq_attribute_that_is_gone_keeps_the_behaviour_out_with_one_line(monkeypatch, caplog, case):
    behaviour, remove, named = _private_attributes()[case]
    with out(behaviour):
        with monkeypatch.context() as m:
            remove(m)
            with caplog.at_level(logging.DEBUG, logger="fairseq_plugins.patches"):
                assert not patches.install(behaviour)
            [line] = caplog.messages
            assert "\n" not in line and line.endswith(f" ({versions()})")
            assert line.startswith(f"fairseq-plugins: patch {behaviour} not installed, fairseq's own behaviour is "
                                   f"kept: {named}")
            others = [p for n, p in patches.PATCHES.items() if n != behaviour and behaviour not in p.requires]
            assert all(p.installed or p.unneeded() for p in others)  # the rest of the suite is in


PLAIN = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
import fairseq_plugins
"""


def test_a_plain_import_says_nothing_about_the_patches_even_at_debug_level():
    """What --user-dir fairseq_plugins adds to a command's output: no line about patches this fairseq does not
    need (encoder_fast_path is for 0.12.2 only), nor about any other."""
    err = subprocess.run([sys.executable, "-c", PLAIN], capture_output=True, text=True, env=cli_env(), check=True).stderr
    assert [line for line in err.splitlines() if line.startswith("fairseq_plugins")] == []
    assert OFFICIAL_0_12_2 or patches.PATCHES["encoder_fast_path"].unneeded()  # one was left out, silently


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

