"""``torch.load`` weights-only for the thread inside one of fairseq's loads, unchanged for everyone else.

fairseq's loaders call ``torch.load`` by name. While at least one thread is inside
:func:`weights_only_torch_load`, ``torch.load`` is a wrapper that forces ``weights_only=True``
for the threads inside it and calls whatever ``torch.load`` was when the first of them entered
(a later wrapper or a test's mock included); other threads' calls pass through unchanged. When
the last one leaves, exactly the value it found is put back -- unless someone replaced the
wrapper meanwhile, whose value is then left in place (the wrapper stays a pass-through).
:func:`allowing` is the allowlist half: ``add_safe_globals`` as a patch's setup and teardown.
"""
import contextlib
import threading

import torch

_lock = threading.Lock()
_local = threading.local()  # .refuse: the current thread's error mapping, while inside


class _Window:
    wrapper = None  # the torch.load installed by the first thread in
    found = None  # what torch.load was then
    depth = 0  # threads (and nested loads) inside


def _wrapper(found):
    def load(f, *args, **kwargs):
        refuse = getattr(_local, "refuse", None)
        if refuse is None:
            return found(f, *args, **kwargs)
        _local.refuse = None  # once per call: a wrapper of an earlier window down the chain passes through
        kwargs["weights_only"] = True
        try:
            return found(f, *args, **kwargs)
        except Exception as e:  # whatever the bytes make torch raise, the file is the cause
            raise refuse(f, e) from None
        finally:
            _local.refuse = refuse
    return load


@contextlib.contextmanager
def weights_only_torch_load(refuse):
    """Inside: this thread's ``torch.load`` is weights-only; a failure becomes ``refuse(f, error)``."""
    with _lock:
        if _Window.depth == 0:
            _Window.found = torch.load
            _Window.wrapper = torch.load = _wrapper(_Window.found)
        _Window.depth += 1
    outer, _local.refuse = getattr(_local, "refuse", None), refuse
    try:
        yield
    finally:
        _local.refuse = outer
        with _lock:
            _Window.depth -= 1
            if _Window.depth == 0 and torch.load is _Window.wrapper:
                torch.load = _Window.found


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
