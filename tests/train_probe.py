"""fairseq-train with test-only probes, set by environment variables (used by tests/integration/test_elastic_resume.py).

PROBE_IDS=path: append to ``path.rank<R>`` one line per training batch actually given to
    ``Trainer.train_step``: "epoch update id,id,..." (update: the one the batch belongs to).
PROBE_KILL_AFTER=K: SIGKILL every worker right after the checkpoint save of update K (once all
    workers are there): a kill mid-run whose last checkpoint is update K.
PROBE_KILL_AFTER_EPOCH=E: the same after the save at the end of epoch E.
PROBE_POISON=i: the batch holding sentence i is poisoned: the output of the encoder's token
    embedding is made Inf (inf added) while the trainer works on that update (its features are Inf).
PROBE_DROP=i: the update whose batches hold sentence i is never trained (the data without it).

Everything else is fairseq-train with the suite loaded, as ``--user-dir`` loads it.
"""
import os
import signal
import sys

import torch.distributed as dist
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main

import fairseq_plugins  # noqa: F401  (the suite's patches, installed as --user-dir installs them)

IDS = os.environ.get("PROBE_IDS")
KILL_AFTER = int(os.environ.get("PROBE_KILL_AFTER", "0"))
KILL_AFTER_EPOCH = int(os.environ.get("PROBE_KILL_AFTER_EPOCH", "0"))
POISON = os.environ.get("PROBE_POISON")
DROP = os.environ.get("PROBE_DROP")


def holds(samples, sentence):
    return any(sample and int(sentence) in sample["id"].tolist() for sample in samples)


def poison_or_drop():
    train_step, poisoned = Trainer.train_step, []

    def poison(module, inputs, output):
        return output + float("inf") if poisoned else output

    def step(self, samples, raise_oom=False):
        if DROP and holds(samples, DROP):
            return None
        if POISON and "probe_hooked" not in vars(self):
            self.get_model().encoder.embed_tokens.register_forward_hook(poison)
            self.probe_hooked = True
        poisoned[:] = [True] if POISON and holds(samples, POISON) else []
        try:
            return train_step(self, samples, raise_oom)
        finally:
            poisoned[:] = []

    Trainer.train_step = step


def record_batches():
    begin_epoch, train_step = Trainer.begin_epoch, Trainer.train_step

    def begin(self, epoch):
        self.probe_epoch = epoch
        return begin_epoch(self, epoch)

    def step(self, samples, raise_oom=False):
        update = self.get_num_updates() + 1
        with open(f"{IDS}.rank{self.data_parallel_rank}", "a") as out:
            for sample in samples:
                if sample:  # fairseq pads a worker's last step with empty (dummy) batches
                    out.write(f"{self.probe_epoch} {update} {','.join(map(str, sample['id'].tolist()))}\n")
        return train_step(self, samples, raise_oom)

    Trainer.begin_epoch, Trainer.train_step = begin, step


def kill_after_save():
    save = checkpoint_utils.save_checkpoint

    def save_then_die(cfg, trainer, epoch_itr, val_loss):
        path = save(cfg, trainer, epoch_itr, val_loss)
        end_of_epoch = epoch_itr.end_of_epoch() and epoch_itr.epoch == KILL_AFTER_EPOCH
        if trainer.get_num_updates() == KILL_AFTER or end_of_epoch:
            if dist.is_initialized():
                dist.barrier()  # rank 0 has written the checkpoint
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    checkpoint_utils.save_checkpoint = save_then_die


if POISON or DROP:
    poison_or_drop()
if IDS:
    record_batches()
if KILL_AFTER or KILL_AFTER_EPOCH:
    kill_after_save()
sys.argv[0] = "fairseq-train"
cli_main()
