"""Every change the suite makes to fairseq's behaviour, one module per behaviour.

Each module declares ``PATCH``, a :class:`~fairseq_plugins.patches._mechanism.Patch`: the
fairseq attributes it replaces (checked at install: present, same parameters), and the
patches it requires. :func:`install_all` installs them, each after those it requires, once;
``fairseq_plugins/__init__.py`` calls it before the registries are imported. Nothing here
patches fairseq as an import side effect. ``FAIRSEQ_PLUGINS_DISABLE_PATCHES=name1,name2``
keeps fairseq's own behaviour for the patches named (read once, at the first install). The
README's "Patches to fairseq" table lists each one with the reason and the upstream issue.
"""
import importlib
import logging
import os
import pkgutil

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import in_order, logger

DISABLE = "FAIRSEQ_PLUGINS_DISABLE_PATCHES"


def _declared():
    """name -> Patch of every module of this package (those starting with "_" are helpers)."""
    patches = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            if not hasattr(module, "PATCH"):
                raise RuntimeError(f"{module.__file__}: a patch module declares PATCH = Patch(__name__, ...)")
            patches[info.name] = module.PATCH
    return patches


PATCHES = {patch.name: patch for patch in in_order(_declared())}  # install order


def disabled(value):
    """The patch names of ``FAIRSEQ_PLUGINS_DISABLE_PATCHES=value``; an unknown one is a ConfigError."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(PATCHES))
    if unknown:
        raise ConfigError(f"{DISABLE}={value!r}: no patch named {', '.join(unknown)}; "
                          f"the patches are {', '.join(sorted(PATCHES))}")
    return names


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
    targets = [t for p in PATCHES.values() if p.installed for t in p.replaces]
    PATCHES[name].uninstall(targets)


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
