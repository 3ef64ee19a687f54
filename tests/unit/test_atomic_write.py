"""The atomic checkpoint write (``fairseq_plugins.checkpoints.atomic_write``) and fairseq's checkpoint
writes through it (patches/checkpoint_io.py), in process: a full disk, planted symlinks, concurrent
writers, an interrupted save, a durable rename, remote paths left to fairseq. A writer killed mid-write
and training onto a full disk: tests/integration/test_reliability.py."""
import io
import os
import re
import subprocess
import sys

import pytest
import torch
from fairseq.file_io import PathManager

from fairseq_plugins import checkpoints
from fairseq_plugins.checkpoints import atomic_write
from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.patches import checkpoint_io


def test_package_import_makes_fairseq_checkpoint_writes_atomic():
    """What ``--user-dir fairseq_plugins`` gives every fairseq command (a fresh, isolated interpreter)."""
    probe = ("import fairseq_plugins\n"
             "from fairseq import checkpoint_utils\n"
             "print(checkpoint_utils.torch_persistent_save.__module__, checkpoint_utils.PathManager.__name__)\n")
    out = subprocess.run([sys.executable, "-I", "-c", probe], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert out.split() == ["fairseq_plugins.patches.checkpoint_io", "AtomicPathManager"]


def test_copy_into_full_disk_raises_one_line_and_keeps_previous_file(tmp_path, monkeypatch):
    """A real ENOSPC: the temporary file is a link to /dev/full, which refuses every write."""
    src, dst = tmp_path / "checkpoint_2_8.pt", tmp_path / "checkpoint_last.pt"
    torch.save({"new": torch.ones(1000)}, src)
    torch.save({"old": torch.zeros(3)}, dst)
    before = dst.read_bytes()

    def full_disk_temporary(path):
        tmp = path + ".full.tmp"
        os.symlink("/dev/full", tmp)
        return tmp, open(tmp, "wb")

    monkeypatch.setattr(checkpoints, "_create_temporary", full_disk_temporary)
    with pytest.raises(CheckpointError) as error:
        checkpoint_io.AtomicPathManager.copy(str(src), str(dst), overwrite=True)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{dst}: checkpoint not saved")
    assert "(ENOSPC)" in message and "intact" in message
    assert dst.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_2_8.pt", "checkpoint_last.pt"]


def test_planted_symlinks_are_never_written_through(tmp_path):
    """A symlink at the old fixed temporary name, or at the checkpoint's own name, pointing at a
    file of the user's: the save must leave that file alone and put a regular file in place."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    last = tmp_path / "checkpoint_last.pt"
    os.symlink(victim, str(last) + ".tmp")
    checkpoint_io.torch_persistent_save({"step": torch.ones(3)}, str(last))
    assert victim.read_bytes() == b"precious" and os.readlink(str(last) + ".tmp") == str(victim)
    assert not last.is_symlink() and torch.equal(torch.load(last)["step"], torch.ones(3))

    os.remove(last)
    os.symlink(victim, last)
    checkpoint_io.torch_persistent_save({"step": torch.zeros(3)}, str(last))
    assert victim.read_bytes() == b"precious"
    assert not last.is_symlink() and torch.equal(torch.load(last)["step"], torch.zeros(3))


def test_concurrent_writes_of_one_name_use_their_own_temporary_files(tmp_path):
    target = tmp_path / "checkpoint_last.pt"
    with atomic_write(str(target)) as first:
        with atomic_write(str(target)) as second:
            assert first.name != second.name and os.path.dirname(first.name) == str(tmp_path)
            first.write(b"first")
            second.write(b"second")
        assert target.read_bytes() == b"second"
    assert target.read_bytes() == b"first" and os.listdir(tmp_path) == ["checkpoint_last.pt"]


def test_interrupted_save_removes_its_temporary_file_and_leaves_target(tmp_path):
    target = tmp_path / "checkpoint_last.pt"
    torch.save({"old": torch.zeros(3)}, target)
    before = target.read_bytes()

    class Interrupt(BaseException):
        pass

    with pytest.raises(Interrupt):
        with atomic_write(str(target)) as f:
            f.write(b"half a checkpoint")
            raise Interrupt
    assert target.read_bytes() == before and os.listdir(tmp_path) == ["checkpoint_last.pt"]


@pytest.mark.parametrize("message, cause", [("first line\nsecond line", "RuntimeError: first line"),
                                             ("", "RuntimeError: ")])
def test_atomic_write_names_a_failure_that_is_no_os_error_by_its_type_and_first_line(tmp_path, message, cause):
    target = tmp_path / "checkpoint_last.pt"
    with pytest.raises(CheckpointError) as error:
        with atomic_write(str(target)):
            raise RuntimeError(message)
    assert str(error.value).startswith(f"{target}: checkpoint not saved: {cause}; the checkpoints already in "
                                       f"{tmp_path} are intact")
    assert os.listdir(tmp_path) == []


def test_atomic_write_makes_the_rename_durable_by_fsyncing_the_file_then_its_folder(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    folder = tmp_path / "run"
    folder.mkdir()
    with atomic_write(str(folder / "checkpoint_last.pt")) as f:
        f.write(b"last")
    assert re.fullmatch(re.escape(os.path.realpath(folder / "checkpoint_last.pt")) + r"\.[0-9a-f]+\.tmp", synced[0])
    assert synced[1:] == [os.path.realpath(folder)]  # the folder holding the new name, not the current one
    monkeypatch.chdir(folder)
    with atomic_write("checkpoint_best.pt") as f:  # a bare name: its folder is the current one
        f.write(b"best")
    assert synced[-1] == os.path.realpath(folder) and (folder / "checkpoint_best.pt").read_bytes() == b"best"


def test_atomic_write_skips_a_taken_temporary_name_and_a_hundred_taken_are_one_line(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint_last.pt"
    for taken in ("a", "b"):  # e.g. another writer's, or a planted file
        (tmp_path / f"checkpoint_last.pt.{taken}.tmp").write_bytes(b"theirs")
    names = iter(["a", "b", "c"])
    monkeypatch.setattr(checkpoints.secrets, "token_hex", lambda nbytes: next(names))
    with atomic_write(str(target)) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_last.pt", "checkpoint_last.pt.a.tmp", "checkpoint_last.pt.b.tmp"]
    tries = []
    monkeypatch.setattr(checkpoints.secrets, "token_hex", lambda nbytes: tries.append(nbytes) or "a")
    with pytest.raises(CheckpointError, match=r"no free temporary name beside it after 100 tries"):
        with atomic_write(str(target)):
            pass
    assert len(tries) == 100 and target.read_bytes() == b"new"
    assert (tmp_path / "checkpoint_last.pt.a.tmp").read_bytes() == b"theirs"


def test_atomic_save_leaves_asynchronous_writes_file_objects_and_remote_paths_to_fairseq(tmp_path, monkeypatch):
    saved, copied = [], []
    monkeypatch.setattr(checkpoint_io, "SAVE", lambda obj, filename, async_write: saved.append(
        (filename, async_write)))
    local, handle, remote = str(tmp_path / "checkpoint_last.pt"), io.BytesIO(), "manifold://bucket/checkpoint_last.pt"
    checkpoint_io.torch_persistent_save({}, local, async_write=True)
    checkpoint_io.torch_persistent_save({}, handle)  # fairseq's retry loop passes an open file
    monkeypatch.setattr(PathManager, "path_requires_pathmanager", staticmethod(lambda path: path.startswith("manifold:")))
    monkeypatch.setattr(PathManager, "copy", staticmethod(
        lambda src_path, dst_path, overwrite=False: copied.append((dst_path, overwrite)) or True))
    checkpoint_io.torch_persistent_save({}, remote)
    assert saved == [(local, True), (handle, False), (remote, False)] and os.listdir(tmp_path) == []
    checkpoint_io.torch_persistent_save({"step": 1}, local)  # local and synchronous: the atomic write
    assert len(saved) == 3 and torch.load(local) == {"step": 1}
    checkpoint_io.AtomicPathManager.copy(local, remote)
    checkpoint_io.AtomicPathManager.copy(local, remote, overwrite=True)
    assert copied == [(remote, False), (remote, True)]  # fairseq's signature and default, passed on
