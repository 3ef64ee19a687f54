"""patches/resume.py: resuming a run, with the behaviours out and in."""

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
