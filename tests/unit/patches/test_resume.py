"""patches/resume.py: resuming a run, with the behaviours out and in; and, in process, a trainer
process started in epoch 2 grouping the batches as one started in epoch 1 (what makes kill -9 and
resume equal the uninterrupted run: tests/integration/test_reliability.py)."""
from helpers import TINY_BUILTIN_TRANSFORMER
from patching import OFFICIAL_0_12_2, out, tiny

from fairseq_plugins import patches


def test_resume_batches(tiny):
    _, task, _, _ = tiny
    task.load_dataset("train")
    dataset = task.dataset("train")

    def epoch2(start_epoch):
        task.dataset_to_epoch_iter.clear()
        iterator = task.get_batch_iterator(dataset, max_tokens=500, seed=1, epoch=start_epoch)
        if start_epoch == 1:
            list(iterator.next_epoch_itr(shuffle=True))  # the whole of epoch 1
        return [b["id"].tolist() for b in iterator.next_epoch_itr(shuffle=True)]
    if OFFICIAL_0_12_2:  # it groups with the seed alone, so the patch stays out
        assert not patches.PATCHES["resume_batches"].installed
    else:
        with out("resume_batches"):
            assert sorted(map(sorted, epoch2(1))) != sorted(map(sorted, epoch2(2)))  # other groups of sentences
    assert epoch2(1) == epoch2(2)



def epoch_batches(data_bin, start_epoch, epoch):
    """Sentence ids of each batch of ``epoch`` for a trainer process started in ``start_epoch``."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_bin, *TINY_BUILTIN_TRANSFORMER, "--max-tokens", "500"])
    task = tasks.setup_task(args)
    task.load_dataset("train")
    iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=500, seed=1, epoch=start_epoch)
    for _ in range(start_epoch, epoch + 1):
        batches = [batch["id"].tolist() for batch in iterator.next_epoch_itr(shuffle=True)]
    assert iterator.epoch == epoch
    return batches


def test_a_process_started_in_epoch_2_groups_the_batches_as_one_started_in_epoch_1(data_bin):
    """fairseq alone groups the reused batches with seed + the epoch the process started in, so a run
    resumed in epoch 2 trained on other batches (same sentences, other groups); the suite's
    resume_batches (patches/resume.py) groups them as epoch 1 did, in every process."""
    through_epoch_1, resumed_in_epoch_2 = epoch_batches(data_bin, 1, 2), epoch_batches(data_bin, 2, 2)
    assert through_epoch_1 == resumed_in_epoch_2
    assert epoch_batches(data_bin, 1, 1) != through_epoch_1  # ...and the epoch still shuffles their order
