"""The fairseq functions that behaviours of several groups change: each replaced once, its steps in this order.

Outermost first: a step before another sees the call first and its result last.
"""
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

from fairseq_plugins.patches._mechanism import Target, Wrap

# Each behaviour adds its state to extra_state on the way in; numerical_faults refuses non-finite parameters last.
TRAINER_SAVE = Wrap(Target(Trainer, "save_checkpoint", "self, filename, extra_state"),
                    order=["patience_state", "elastic_resume", "divergence", "numerical_faults"])
# After fairseq's resume, innermost first: divergence's lr scale, elastic_resume's line, then the ends of a
# finished run.
LOAD_CHECKPOINT = Wrap(Target(checkpoint_utils, "load_checkpoint", "cfg, trainer, **passthrough_args"),
                       order=["patience_state", "finished_run", "elastic_resume", "divergence"])
