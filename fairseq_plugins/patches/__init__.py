"""Every change the suite makes to fairseq's behaviour, one module per behaviour.

Each module has an idempotent ``install()``; :func:`install_all` calls them in order and
``fairseq_plugins/__init__.py`` calls it once, before the registries are imported. Nothing
here patches fairseq as an import side effect. The README's "Patches to fairseq" table lists
each one with the reason and the upstream issue.
"""
from fairseq_plugins.patches import (
    alignment_attention,
    atomic_checkpoints,
    batch_by_size,
    broadcast_state,
    checkpoint_loading,
    clean_exit,
    cpu_fp16,
    cpu_launch,
    encoder_fast_path,
    finished_run,
    hub_score,
    lost_worker,
    match_source_len,
    max_len_warning,
    no_repeat_ngram,
    numerical_faults,
    one_line_errors,
    preemption,
    replace_unk,
    resume_batches,
)

# Order: checkpoint loading first (everything after may load checkpoints), the excepthook last.
PATCHES = [checkpoint_loading, batch_by_size, encoder_fast_path, atomic_checkpoints, numerical_faults,
           no_repeat_ngram, match_source_len, alignment_attention, hub_score, replace_unk, broadcast_state,
           cpu_launch, lost_worker, preemption, resume_batches, finished_run, clean_exit, cpu_fp16,
           max_len_warning, one_line_errors]


def install_all():
    for patch in PATCHES:
        patch.install()
