"""The one way the suite changes fairseq: a :class:`Patch` (one named behaviour) of :class:`Target` replacements.

A group module of this package declares ``PATCHES = [Patch("name", {TARGET: replacement, ...}), ...]``
where each :class:`Target` names an attribute of fairseq (or torch) and the parameters it is
expected to take. A replacement calls the original through its target (``TARGET(self, ...)``),
which is what the attribute held when the patch was installed, or fairseq's attribute while
the patch is out. ``reads``: the private fairseq attributes a behaviour relies on without
replacing them, checked the same way. Installing checks every target first (exists, same
parameters, the text it raises): on a mismatch the patch stays out whole, with one warning line
naming the fairseq attribute and the fairseq version. Uninstalling restores exactly what was there
(an attribute that was inherited is deleted again).

Each fairseq function is replaced once: where several behaviours change one, it is a :class:`Wrap`,
whose one replacement runs the steps of the behaviours installed, in the order its ``order`` lists.

A swap needed only during one call of the patch's own code is a scoped replacement instead:
``with TARGET.replaced(function):`` (this thread only; see :meth:`Target.replaced`) or
``with TARGET.set_to(value):`` (an attribute of an object the calling thread owns).
"""
import contextlib
import dataclasses
import functools
import inspect
import logging
import re
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
    """One attribute of ``owner`` (a module or class) that a patch replaces or relies on.

    ``params``: the parameters the attribute must take (see :func:`parameters`), or None for a
    value that is only checked to exist; ``absent=True``: an attribute the patch adds;
    ``instance=True``: an attribute ``owner.__init__`` sets on each instance (checked in its source);
    ``holds``: text the attribute's source must hold (an error message or a name the patch relies on).
    """

    def __init__(self, owner, name, params=None, absent=False, instance=False, holds=None):
        self.owner, self.name, self.params, self.absent = owner, name, params, absent
        self.instance, self.holds = instance, holds
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
        """Why this attribute cannot be replaced (or relied on) on the installed fairseq, or None."""
        if self.instance:
            return None if self._set_by_init() else f"{self} is missing (no longer set by its __init__)"
        present = hasattr(self.owner, self.name)
        if self.absent:
            return f"{self} exists already" if present else None
        if not present:
            return f"{self} is missing"
        # a Wrap's target already in (for another behaviour): the original is what is checked
        value = self.original if self.replacement is not None else getattr(self.owner, self.name)
        if self.holds is not None and self.holds not in _source(value, self.holds):
            return f"{self} no longer holds {self.holds!r}"
        if self.params is not None:
            try:
                found = parameters(value)
            except (TypeError, ValueError):
                return f"{self} is not a function"
            if found != self.params:
                return f"{self} takes ({found}), not ({self.params})"
        return None

    def _set_by_init(self):
        """Whether an ``__init__`` of the owner's classes assigns ``self.<name>`` (True where none has Python source)."""
        pattern = re.compile(rf"\bself\.{re.escape(self.name)}\s*(:[^=]*)?=[^=]")
        sources = [_source(vars(cls)["__init__"], None) for cls in self.owner.__mro__ if "__init__" in vars(cls)]
        sources = [source for source in sources if source is not None]  # object's and other built-in ones have none
        return not sources or any(pattern.search(source) for source in sources)

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
                        self.uninstall()
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

    def uninstall(self):
        """Put back what was there."""
        if self.saved[0]:
            setattr(self.owner, self.name, self.saved[1])
        else:
            delattr(self.owner, self.name)
        self.original = self.saved = self.replacement = None


class Wrap:
    """A fairseq function that several behaviours change, replaced once.

    ``order``: the names of those behaviours, outermost first. The one replacement runs, in that
    order, the step of each behaviour installed; a step is ``step(call, *args, **kwargs)`` and goes
    on with ``call(*args, **kwargs)`` (the next step, then the original). With no step in, the
    attribute is fairseq's own again.
    """

    def __init__(self, target, order):
        self.target, self.order = target, tuple(order)
        self.steps = {}  # behaviour name -> step, while that behaviour is installed
        wrap = self

        def run(*args, **kwargs):
            steps = [wrap.steps[name] for name in wrap.order if name in wrap.steps]
            call = wrap.target
            for step in reversed(steps):
                call = functools.partial(step, call)
            return call(*args, **kwargs)
        self.run = run

    def __repr__(self):
        return f"Wrap({self.target!r}: {', '.join(self.order)})"

    def add(self, name, step):
        if name not in self.order:
            raise RuntimeError(f"{self}: {name} is not in its order")
        if not self.steps:
            self.target.install(self.run)
            self.run.__signature__ = inspect.signature(self.target.original)  # what callers inspect is fairseq's
        self.steps[name] = step

    def remove(self, name):
        self.steps.pop(name, None)
        if not self.steps and self.target.replacement is not None:
            self.target.uninstall()


class Patch:
    """One behaviour of the suite: the attributes it replaces and the patches it needs first.

    ``replaces``: {Target: replacement} (attributes no other behaviour replaces); ``steps``:
    {Wrap: step} (its step in a function several behaviours change); ``reads``: Targets of the
    private attributes it relies on. ``fixed_upstream()``: True where the installed fairseq has
    the fix already (the patch stays out, silently); ``applies()``: False where the patch
    is for another fairseq version. ``setup``/``teardown``: what installing does besides replacing
    attributes, and its undoing. ``scoped``: the targets its code replaces only within a call
    (:meth:`Target.replaced`), checked at install like the others.
    """

    def __init__(self, name, replaces=(), requires=(), fixed_upstream=None, applies=None, setup=None,
                 teardown=None, scoped=(), steps=(), reads=()):
        self.name = name.rsplit(".", 1)[-1]
        self.replaces = dict(replaces)
        self.steps = dict(steps)
        self.scoped, self.reads = tuple(scoped), tuple(reads)
        self.requires = tuple(requires)
        self.fixed_upstream, self.applies = fixed_upstream, applies
        self.setup, self.teardown = setup, teardown
        self.installed = False

    def __repr__(self):
        return f"Patch({self.name})"

    def targets(self):
        """Every attribute this behaviour replaces, its own or shared."""
        return [*self.replaces, *(wrap.target for wrap in self.steps)]

    def unneeded(self):
        """Why the installed fairseq needs no such patch, or None."""
        if self.applies is not None and not self.applies():
            return f"not for this fairseq ({versions()})"
        if self.fixed_upstream is not None and self.fixed_upstream():
            return f"the installed fairseq has this fix ({versions()})"
        return None

    def problems(self):
        """The one warning line saying why the patch cannot go in on this fairseq, or None."""
        problems = [p for p in (t.problem() for t in (*self.targets(), *self.scoped, *self.reads)) if p]
        if problems:
            return (f"fairseq-plugins: patch {self.name} not installed, fairseq's own behaviour is kept: "
                    f"{'; '.join(problems)} ({versions()})")
        return None

    def install(self):
        """Replace every target, or none; returns whether the patch is in.

        A patch this fairseq does not need stays out silently (:meth:`unneeded` says why); one it
        cannot apply stays out with one warning line naming the fairseq attributes at fault.
        """
        if self.installed:
            return True
        if self.unneeded() is not None:
            return False
        problems = self.problems()
        if problems is not None:
            logger.warning(problems)
            return False
        for target, replacement in self.replaces.items():
            target.install(replacement)
        for wrap, step in self.steps.items():
            wrap.add(self.name, step)
        if self.setup is not None:
            self.setup()
        self.installed = True
        return True

    def uninstall(self):
        if not self.installed:
            return
        if self.teardown is not None:
            self.teardown()
        for wrap in self.steps:
            wrap.remove(self.name)
        for target in reversed(list(self.replaces)):
            target.uninstall()
        self.installed = False


def _source(value, unknown):
    """``value``'s source, or ``unknown`` where Python has none (a compiled module: nothing to check)."""
    try:
        return inspect.getsource(value)
    except (OSError, TypeError):
        return unknown


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
