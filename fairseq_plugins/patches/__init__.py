"""Every change the suite makes to fairseq's behaviour, grouped by what it changes.

Each group module (:data:`GROUPS`, in install order) declares ``PATCHES``, its named behaviours,
each a :class:`~fairseq_plugins.patches._mechanism.Patch`: the fairseq attributes it replaces
and relies on (checked at install: present, same parameters), and the behaviours it requires.
Each fairseq function is replaced once: where behaviours share one, it is a
:class:`~fairseq_plugins.patches._mechanism.Wrap` whose steps run in the order it lists.
:func:`install_all` installs them, once; ``fairseq_plugins/__init__.py`` calls it before the
registries are imported. Nothing here patches fairseq as an import side effect.
``FAIRSEQ_PLUGINS_DISABLE_PATCHES=name1,name2`` keeps fairseq's own behaviour for the behaviours
or whole groups named (read once, at the first install). docs/PATCHES.md lists them.
"""
import importlib
import logging
import os
import pkgutil

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import logger

DISABLE = "FAIRSEQ_PLUGINS_DISABLE_PATCHES"
GROUPS = ["command_line", "checkpoint_io", "data", "models", "launch", "numerical", "resume", "preemption",
          "generation"]  # install order (a behaviour's requirements come before it)


def _declared():
    """(name -> Patch in install order, group -> names of its behaviours)."""
    modules = {info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")}
    if modules != set(GROUPS):
        raise RuntimeError(f"{__name__}.GROUPS lists {sorted(GROUPS)}, the package holds {sorted(modules)}")
    patches, groups = {}, {}
    for group in GROUPS:
        module = importlib.import_module(f"{__name__}.{group}")
        declared = getattr(module, "PATCHES", None) or [module.PATCH]
        groups[group] = [patch.name for patch in declared]
        for patch in declared:
            for required in patch.requires:
                if required not in patches:
                    raise RuntimeError(f"patch {patch.name} requires {required}, which no earlier patch is")
            patches[patch.name] = patch
    replacing = {}  # each fairseq attribute is replaced by one patch, or by one Wrap that several share
    for patch in patches.values():
        for target in {*patch.replaces, *{wrap.target for wrap in patch.steps}}:
            first = replacing.setdefault((id(target.owner), target.name), (target, patch.name))
            if first[0] is not target:
                raise RuntimeError(f"{target!r} is replaced by patches {first[1]} and {patch.name}: declare a Wrap")
    return patches, groups


PATCHES, GROUP_PATCHES = _declared()


def disabled(value):
    """The patch names of ``FAIRSEQ_PLUGINS_DISABLE_PATCHES=value`` (a group stands for its behaviours);
    an unknown one is a ConfigError."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(PATCHES) - set(GROUP_PATCHES))
    if unknown:
        raise ConfigError(f"{DISABLE}={value!r}: no patch named {', '.join(unknown)}; the patches are "
                          f"{', '.join(sorted(PATCHES))}; the groups are {', '.join(GROUPS)}")
    return {p for n in names for p in GROUP_PATCHES.get(n, [n])}


_disabled = None  # the names read from the environment at the first install_all


def install(name, skip=frozenset()):
    """Install patch ``name`` (after what it requires); whether it is in."""
    patch = PATCHES[name]
    if patch.installed:
        return True
    # A required patch that this fairseq does not need counts as in: its behaviour is fairseq's own.
    out = [r for r in patch.requires if r in skip or not install(r, skip) and PATCHES[r].unneeded() is None]
    if out:
        logger.warning("fairseq-plugins: patch %s left out (fairseq's own behaviour kept): it requires %s, "
                       "which is not installed", name, ", ".join(out))
        return False
    return patch.install()


def uninstall(name):
    """Restore fairseq's attributes for patch ``name`` and every installed patch that requires it."""
    for other in reversed(list(PATCHES.values())):
        if other.installed and name in other.requires:
            uninstall(other.name)
    PATCHES[name].uninstall()


def install_all():
    """Install every patch not named in ``FAIRSEQ_PLUGINS_DISABLE_PATCHES``; idempotent."""
    global _disabled
    if _disabled is None:
        _disabled = disabled(os.environ.get(DISABLE, ""))
    for name in PATCHES:
        if name in _disabled:
            logger.log(logging.INFO, "fairseq-plugins: patch %s disabled by %s", name, DISABLE)
        else:
            install(name, _disabled)


def uninstall_all():
    """Every attribute back to what it was before :func:`install_all`."""
    for name in reversed(list(PATCHES)):
        uninstall(name)
