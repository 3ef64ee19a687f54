"""``torch.load`` weights-only for the thread inside one of fairseq's loads, unchanged for everyone else.

fairseq's loaders call ``torch.load`` by name. :func:`weights_only_torch_load` replaces it for
the calling thread only, through the scoped :meth:`~fairseq_plugins.patches._mechanism.Target.replaced`:
that thread's calls force ``weights_only=True`` and reach whatever ``torch.load`` was when the
window opened (a later wrapper or a test's mock included); other threads' calls pass through,
and that value is put back afterwards. A patch using it lists :data:`TORCH_LOAD` as ``scoped``.
:func:`allowing` is the allowlist half: ``add_safe_globals`` as a patch's setup and teardown.
"""
import torch

from fairseq_plugins.patches._mechanism import Target

TORCH_LOAD = Target(torch, "load")


def weights_only_torch_load(refuse, check=None):
    """Inside: this thread's ``torch.load`` is weights-only; a failure becomes ``refuse(f, error)``;
    ``check(f, obj)``, if given, sees what was loaded before the caller does (and may raise)."""
    def load(f, *args, **kwargs):
        kwargs["weights_only"] = True
        try:
            obj = TORCH_LOAD(f, *args, **kwargs)
        except Exception as e:  # whatever the bytes make torch raise, the file is the cause
            raise refuse(f, e) from None
        if check is not None:
            check(f, obj)
        return obj
    return TORCH_LOAD.replaced(load)


def allowing(classes):
    """``add_safe_globals(classes)`` as a setup, with its teardown (torch < 2.4 has no allowlist)."""
    serialization = torch.serialization
    if not hasattr(serialization, "add_safe_globals"):
        return None, None
    before = []

    def setup():
        before[:] = serialization.get_safe_globals()
        serialization.add_safe_globals(classes)

    def teardown():
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)
    return setup, teardown
