"""What every exporter shares: the checkpoint read as fairseq-generate reads it, the refusals
that come before building the model, and an output folder that appears whole or not at all."""
import contextlib
import glob
import os
import shutil
import tempfile
from argparse import Namespace
from typing import Iterable, Optional

from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
from omegaconf import OmegaConf

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.errors import CheckpointError, ConfigError


def check_output(out_dir: str, force: bool, marker: str, kind: str) -> None:
    """Refuse an existing ``out_dir`` without ``force``, and with it anything but a ``kind`` (holding ``marker``)."""
    if not os.path.exists(out_dir):
        return
    if not force:
        raise ConfigError(f"output {out_dir} exists; pass --force to overwrite it")
    if not os.path.isdir(out_dir) or (os.listdir(out_dir) and not os.path.isfile(os.path.join(out_dir, marker))):
        raise ConfigError(f"output {out_dir} is not a {kind}; --force only replaces one")


def read_checkpoint(checkpoint: str) -> dict:
    if not os.path.isfile(checkpoint):
        raise CheckpointError(f"checkpoint {checkpoint} does not exist")
    return load_state(checkpoint)


def model_options(state: dict, checkpoint: str) -> Namespace:
    """The checkpoint's model options (``cfg.model``, or ``args`` of an old checkpoint), flat."""
    options = state["cfg"]["model"] if state.get("cfg") is not None else state.get("args")
    if options is None:
        raise CheckpointError(f"{checkpoint}: no model options (cfg.model) in the checkpoint")
    if not isinstance(options, Namespace):
        options = Namespace(**OmegaConf.to_container(OmegaConf.create(options), resolve=True))
    return options


def architecture(options: Namespace) -> str:
    """The checkpoint's ``--arch`` (``_name`` in a dataclass config)."""
    return getattr(options, "arch", None) or getattr(options, "_name", None)


def model_family(options: Namespace, checkpoint: str, families: Iterable[str], target: str) -> str:
    """The registered model (``ARCH_MODEL_NAME_REGISTRY``) of the checkpoint's architecture, refused
    by name unless it is one of ``families``, the models exported to ``target``."""
    arch = architecture(options)
    family = ARCH_MODEL_NAME_REGISTRY.get(arch)
    if family not in families:
        raise CheckpointError(f"{checkpoint}: architecture {arch!r} (model {family!r}) is not exported to "
                              f"{target}, which takes {', '.join(families)} only")
    return family


def check_one_width(encoder_embed_dim: int, decoder_embed_dim: int, why: str) -> None:
    """Refuse a Transformer whose two sides have different widths; ``why``: the target's reason."""
    if encoder_embed_dim != decoder_embed_dim:
        raise ConfigError(f"--encoder-embed-dim {encoder_embed_dim} differs from --decoder-embed-dim "
                          f"{decoder_embed_dim}: not exported ({why})")


def build_model(state: dict, checkpoint: str, data: Optional[str] = None):
    """(model in eval mode, task with the dictionaries) of ``state``, its dictionaries from ``data``
    (default: the training data directory the checkpoint names)."""
    data = data or state["cfg"]["task"]["data"]
    if not os.path.isdir(data):
        raise ConfigError(f"data directory {data} (with the dictionaries of {checkpoint}) does not exist; "
                          "pass --data DIR")
    task_cfg = state["cfg"]["task"]
    languages = [task_cfg.get("source_lang"), task_cfg.get("target_lang")]
    for language in languages if None not in languages else ["*"]:  # fairseq infers unset languages
        if not glob.glob(os.path.join(glob.escape(data), f"dict.{language}.txt")):
            raise ConfigError(f"{os.path.join(data, f'dict.{language}.txt')}: not found (dictionary of {checkpoint}); "
                              "pass --data DIR")
    task_cfg["data"] = data  # fairseq applies arg_overrides only when it reads the file itself
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], state=state)
    except FileNotFoundError as e:
        raise ConfigError(f"{e.filename or e}: not found (dictionaries of {checkpoint}); pass --data DIR") from None
    except RuntimeError as e:
        if "size mismatch" not in str(e):
            raise
        raise ConfigError(f"the dictionaries in {data} do not fit {checkpoint} (its embeddings have other sizes); "
                          "pass the --data DIR it was trained on") from None
    return models[0].eval(), task


@contextlib.contextmanager
def staged_folder(out_dir: str):
    """A folder beside ``out_dir`` to write into; it replaces ``out_dir`` only once the block ends
    without an error, so a failed export leaves ``out_dir`` as it was."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}-", dir=parent)
    try:
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would keep the export from others; as mkdir makes it
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(staging, out_dir)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging)
