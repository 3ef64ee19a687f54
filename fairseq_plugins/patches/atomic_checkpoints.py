"""Every checkpoint file fairseq writes is complete or absent, and a failed save says so.

fairseq's ``save_checkpoint`` writes the first file of a save (e.g. ``checkpoint_3_400.pt``)
with ``torch_persistent_save`` (``X.tmp``, then rename, no fsync) and then makes every other
name of that save -- ``checkpoint_best.pt``, ``checkpoint_last.pt`` -- with
``PathManager.copy``, a plain ``shutil.copyfile``. A process killed during that copy leaves a
truncated ``checkpoint_last.pt``, the very file the next ``fairseq-train`` resumes from; a
full disk leaves it half-written and ends in a traceback from inside torch's zip writer.

The patch changes two names inside ``fairseq.checkpoint_utils`` only:

* ``torch_persistent_save``: write ``X.tmp``, flush and fsync it, ``os.replace`` it onto
  ``X``, fsync the directory (:func:`fairseq_plugins.checkpoints.atomic_write`);
* ``PathManager``: fairseq's class with ``copy`` done the same way, so every extra name of a
  save is renamed into place whole.

A save that fails (``ENOSPC``, ``EFBIG`` from a file-size limit, ``EDQUOT``, ...) removes its
``.tmp`` file and raises :class:`~fairseq_plugins.errors.CheckpointError`, one line naming
the file and the cause, and saying that the previous file of that name is untouched.
Paths served by iopath handlers (``manifold://``, ``s3://``) and asynchronous writes keep
fairseq's own behaviour.
"""
import shutil

import torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from fairseq_plugins.checkpoints import atomic_write
from fairseq_plugins.patches._mechanism import Patch, Target

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
