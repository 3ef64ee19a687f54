"""Every checkpoint file fairseq writes is complete or absent, and a failed save says so.

fairseq's ``save_checkpoint`` writes the first file of a save (e.g. ``checkpoint_3_400.pt``)
with ``torch_persistent_save`` (``X.tmp``, then rename, no fsync) and then makes every other
name of that save -- ``checkpoint_best.pt``, ``checkpoint_last.pt`` -- with
``PathManager.copy``, a plain ``shutil.copyfile``. A process killed during that copy leaves a
truncated ``checkpoint_last.pt``, the very file the next ``fairseq-train`` resumes from; a
full disk leaves it half-written and ends in a traceback from inside torch's zip writer.

The patch changes two names inside ``fairseq.checkpoint_utils`` only:

* ``torch_persistent_save``: write a new file of a unique name beside ``X`` (``X.<random>.tmp``),
  flush and fsync it, ``os.replace`` it onto ``X``, fsync the directory (:func:`atomic_write`);
* ``PathManager``: fairseq's class with ``copy`` done the same way, so every extra name of a
  save is renamed into place whole.

A save that fails (``ENOSPC``, ``EFBIG`` from a file-size limit, ``EDQUOT``, ...) removes its
``.tmp`` file and raises :class:`~fairseq_plugins.errors.CheckpointError`, one line naming
the file and the cause, and saying that the previous file of that name is untouched.
Paths served by iopath handlers (``manifold://``, ``s3://``) and asynchronous writes keep
fairseq's own behaviour.
"""
import contextlib
import errno
import os
import secrets
import shutil

import torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.patches._mechanism import Patch, Target


def _os_error(error):
    """The OSError behind ``error``: torch's zip writer re-raises write errors as RuntimeError."""
    seen = error
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__cause__ or seen.__context__
    return seen


def _failure(path, error):
    os_error = _os_error(error)
    if os_error is not None and os_error.errno in errno.errorcode:
        cause = f"{os_error.strerror} ({errno.errorcode[os_error.errno]})"
    else:
        cause = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    directory = os.path.dirname(os.path.abspath(path))
    return CheckpointError(f"{path}: checkpoint not saved: {cause}; the checkpoints already in {directory} are "
                           "intact and no partial file was left; fix the cause (e.g. free disk space) and rerun "
                           "(training resumes from checkpoint_last.pt)")


def _fsync_directory(directory):
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temporary(path):
    """A new file beside ``path`` under a name no one else holds: ``open(..., "xb")`` is O_CREAT|O_EXCL,
    which fails on any existing name, a planted symlink included, instead of following it."""
    for _ in range(100):
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, open(tmp, "xb")
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: no free temporary name beside it after 100 tries")


@contextlib.contextmanager
def atomic_write(path):
    """Yield a binary file; on success it becomes ``path`` in one rename, else ``path`` is untouched.

    The bytes go to a new file of a unique name in ``path``'s folder (so concurrent writers and
    names planted there are never written through), then ``os.replace`` puts it in place, which
    replaces a symlink standing at ``path`` rather than writing where it points. A failure
    (``ENOSPC``, ``EFBIG``, ``EDQUOT``, ...) removes the temporary file and raises
    :class:`CheckpointError`, one line naming the file and the cause.
    """
    tmp = None
    try:
        try:
            tmp, f = _create_temporary(path)
            with f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except Exception as e:  # the bytes never reached disk whole: report the file, not torch internals
            raise _failure(path, e) from None
        _fsync_directory(os.path.dirname(path))
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.remove(tmp)


SAVE = Target(checkpoint_utils, "torch_persistent_save", "obj, filename, async_write")
PATH_MANAGER = Target(checkpoint_utils, "PathManager")


def torch_persistent_save(obj, filename, async_write=False):
    """fairseq's ``torch_persistent_save``, atomic and durable for local paths."""
    if async_write or not isinstance(filename, str) or PathManager.path_requires_pathmanager(filename):
        return SAVE(obj, filename, async_write=async_write)
    with atomic_write(filename) as f:
        torch.save(obj, f)


class AtomicPathManager(PathManager):
    """fairseq's ``PathManager`` whose ``copy`` renames a complete file into place."""

    @staticmethod
    def copy(src_path, dst_path, overwrite=False):
        if PathManager.path_requires_pathmanager(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite=overwrite)
        with atomic_write(dst_path) as dst, open(src_path, "rb") as src:
            shutil.copyfileobj(src, dst)
        return True


PATCH = Patch(__name__, {SAVE: torch_persistent_save, PATH_MANAGER: AtomicPathManager})
