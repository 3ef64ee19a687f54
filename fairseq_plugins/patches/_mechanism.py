"""The one way the suite changes fairseq: a :class:`Patch` of :class:`Target` replacements.

A patch module declares ``PATCH = Patch(__name__, {TARGET: replacement, ...}, requires=(...))``
where each :class:`Target` names an attribute of fairseq (or torch) and the parameters it is
expected to take. A replacement calls the original through its target (``TARGET(self, ...)``),
which is what the attribute held when the patch was installed, or fairseq's attribute while
the patch is out. Installing checks every target first (exists, same parameters): on a
mismatch the patch stays out whole, with one warning line naming it and the fairseq version.
Uninstalling restores exactly what was there (an attribute that was inherited is deleted
again), also when another patch was installed over the same attribute afterwards.

A swap needed only during one call of the patch's own code is a scoped replacement instead:
``with TARGET.replaced(function):`` (this thread only; see :meth:`Target.replaced`) or
``with TARGET.set_to(value):`` (an attribute of an object the calling thread owns).
"""
import contextlib
import dataclasses
import inspect
import logging
import threading

logger = logging.getLogger("fairseq_plugins.patches")


def parameters(value):
    """``value``'s parameters as a patch declares them: ``"self, sample, *args, **kwargs"``."""
    marks = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return ", ".join(marks.get(p.kind, "") + p.name for p in inspect.signature(value).parameters.values())


def versions():
    import fairseq
    import torch
    return f"fairseq {getattr(fairseq, '__version__', '?')}, torch {torch.__version__}"


class Target:
    """One attribute of ``owner`` (a module or class) that a patch replaces.

    ``params``: the parameters the attribute must take (see :func:`parameters`), or None for a
    value that is only checked to exist; ``absent=True``: an attribute the patch adds.
    """

    def __init__(self, owner, name, params=None, absent=False):
        self.owner, self.name, self.params, self.absent = owner, name, params, absent
        self.original = None  # what the attribute gave when the patch was installed
        self.saved = None  # (whether it was in the owner's own __dict__, that raw value)
        self.replacement = None  # what the patch put there (while installed)
        self._lock = threading.Lock()  # the scoped windows of replaced(): open and close
        self._local = threading.local()  # .inside: this thread's replacements, innermost last
        self._depth = 0  # windows of replaced() open, all threads together

    def __repr__(self):
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", None)
        if owner is None:  # an instance
            return f"{type(self.owner).__name__} instance.{self.name}"
        module = getattr(self.owner, "__module__", None)
        return f"{module}.{owner}.{self.name}" if module else f"{owner}.{self.name}"

    def problem(self):
        """Why this attribute cannot be replaced on the installed fairseq, or None."""
        present = hasattr(self.owner, self.name)
        if self.absent:
            return f"{self} exists already" if present else None
        if not present:
            return f"{self} is missing"
        if self.params is not None:
            try:
                found = parameters(getattr(self.owner, self.name))
            except (TypeError, ValueError):
                return f"{self} is not a function"
            if found != self.params:
                return f"{self} takes ({found}), not ({self.params})"
        return None

    def __call__(self, *args, **kwargs):
        """The original: what was there at install, or the attribute itself while the patch is out."""
        original = self.original if self.replacement is not None else getattr(self.owner, self.name)
        return original(*args, **kwargs)

    def _dispatcher(self, found):
        """The attribute while windows are open: this thread's innermost replacement, or ``found``.

        The calls a replacement makes pass through (to ``found``, also through a dispatcher of an
        earlier window that a later wrapper still holds), so a replacement applies once per call.
        """
        local = self._local

        def dispatch(*args, **kwargs):
            inside = getattr(local, "inside", None)
            if not inside or inside[-1] is None:
                return found(*args, **kwargs)
            inside.append(None)
            try:
                return inside[-2](*args, **kwargs)
            finally:
                inside.pop()
        return dispatch

    @contextlib.contextmanager
    def replaced(self, replacement):
        """Inside: ``replacement`` is the attribute for the calling thread only.

        Other threads, and every call ``replacement`` makes (``self(...)`` included), get what the
        attribute was when the first thread entered (a wrapper or a test's mock installed over
        the suite included). When the last thread leaves, exactly that value is put back, unless
        someone replaced the attribute meanwhile: theirs stays (the dispatcher they may wrap
        passes through from then on).
        """
        with self._lock:
            if self._depth == 0:
                self.install(self._dispatcher(getattr(self.owner, self.name)))
            self._depth += 1
        inside = self._local.__dict__.setdefault("inside", [])
        inside.append(replacement)
        try:
            yield
        finally:
            inside.pop()
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    if getattr(self.owner, self.name) is self.replacement:
                        self.uninstall(())
                    else:
                        self.original = self.saved = self.replacement = None

    @contextlib.contextmanager
    def set_to(self, value):
        """Inside: the attribute is ``value`` (for every thread: use it on objects the calling thread owns)."""
        own = vars(self.owner)
        saved = (self.name in own, own.get(self.name))
        setattr(self.owner, self.name, value)
        try:
            yield
        finally:
            if saved[0]:
                setattr(self.owner, self.name, saved[1])
            else:
                delattr(self.owner, self.name)

    def install(self, replacement):
        own = vars(self.owner)
        self.saved = (self.name in own, own.get(self.name))
        self.original = None if self.absent else getattr(self.owner, self.name)
        self.replacement = replacement
        setattr(self.owner, self.name, replacement)

    def uninstall(self, targets):
        """Put back what was there; ``targets``: every installed target (one installed over this one is relinked)."""
        above = next((t for t in targets if t is not self and t.owner is self.owner and t.name == self.name
                      and t.replacement is not None and t.original is self.replacement), None)
        if above is not None:  # another patch wraps this one: it now wraps what this one wrapped
            above.original, above.saved = self.original, self.saved
        elif self.saved[0]:
            setattr(self.owner, self.name, self.saved[1])
        else:
            delattr(self.owner, self.name)
        self.original = self.saved = self.replacement = None


class Patch:
    """One behaviour of the suite: the attributes it replaces and the patches it needs first.

    ``fixed_upstream()``: True where the installed fairseq has the fix already (the patch stays
    out, with a debug line); ``applies()``: False where the patch is for another fairseq version.
    ``setup``/``teardown``: what installing does besides replacing attributes, and its undoing.
    ``scoped``: the targets its code replaces only within a call (:meth:`Target.replaced`),
    checked at install like the others.
    """

    def __init__(self, module_name, replaces, requires=(), fixed_upstream=None, applies=None, setup=None,
                 teardown=None, scoped=()):
        self.name = module_name.rsplit(".", 1)[-1]
        self.replaces = dict(replaces)
        self.scoped = tuple(scoped)
        self.requires = tuple(requires)
        self.fixed_upstream, self.applies = fixed_upstream, applies
        self.setup, self.teardown = setup, teardown
        self.installed = False

    def __repr__(self):
        return f"Patch({self.name})"

    def unneeded(self):
        """Why the installed fairseq needs no such patch, or None."""
        if self.applies is not None and not self.applies():
            return f"not for this fairseq ({versions()})"
        if self.fixed_upstream is not None and self.fixed_upstream():
            return f"the installed fairseq has this fix ({versions()})"
        return None

    def why_out(self):
        """(log level, reason) the patch must stay out on this fairseq, or None."""
        unneeded = self.unneeded()
        if unneeded is not None:
            return logging.DEBUG, f"patch {self.name}: {unneeded}; left out"
        problems = [p for p in (t.problem() for t in (*self.replaces, *self.scoped)) if p]
        if problems:
            return logging.WARNING, (f"fairseq-plugins: patch {self.name} not installed, fairseq's own behaviour "
                                     f"is kept: {'; '.join(problems)} ({versions()})")
        return None

    def install(self):
        """Replace every target, or (logging why) none; returns whether the patch is in."""
        if self.installed:
            return True
        out = self.why_out()
        if out is not None:
            logger.log(*out)
            return False
        for target, replacement in self.replaces.items():
            target.install(replacement)
        if self.setup is not None:
            self.setup()
        self.installed = True
        return True

    def uninstall(self, installed_targets=()):
        if not self.installed:
            return
        if self.teardown is not None:
            self.teardown()
        for target in reversed(list(self.replaces)):
            target.uninstall(installed_targets)
        self.installed = False


def in_order(patches):
    """``patches`` (name -> Patch) with each one after those it requires; ties by name."""
    done, order = set(), []

    def visit(name, path):
        if name in done:
            return
        if name in path:
            raise RuntimeError(f"patches require each other in a cycle: {' -> '.join(path + (name,))}")
        if name not in patches:
            raise RuntimeError(f"patch {path[-1]} requires {name}, which is no patch")
        for required in sorted(patches[name].requires):
            visit(required, path + (name,))
        done.add(name)
        order.append(patches[name])

    for name in sorted(patches):
        visit(name, ())
    return order


def config_options(config: type, options: type) -> dict:
    """The replacements that add the fields of the dataclass ``options`` to fairseq's config
    dataclass ``config`` (its fields, annotations and class defaults): fairseq makes the argparse
    flags, the omegaconf config and hydra's schema from them (the schema is stored again by
    fairseq's ``hydra_init``, which such a patch runs as its setup and teardown)."""
    return {
        Target(config, "__dataclass_fields__"): {**config.__dataclass_fields__, **options.__dataclass_fields__},
        Target(config, "__annotations__"): {**config.__annotations__, **options.__annotations__},
        **{Target(config, f.name, absent=True): f.default for f in dataclasses.fields(options)},
    }
