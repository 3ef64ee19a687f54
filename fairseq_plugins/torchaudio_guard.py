"""Keep an unloadable torchaudio away from transformers.

fairseq asks for torchaudio, so ``pip install fairseq-plugins[hf]`` installs its newest release, which
may not load beside the installed torch (torch 2.13's CPU build: ``OSError`` loading
``_torchaudio.so``). transformers counts torchaudio as available when the package is merely present
(``importlib.util.find_spec``), then imports it, and the export dies. Translation never needs it.
:func:`hide_unloadable_torchaudio`, called before transformers is imported, tries the import once
and, only where it fails, leaves ``None`` in ``sys.modules["torchaudio"]``: Python's documented
"not importable" entry, for which ``find_spec`` answers None (transformers sees no torchaudio) and
``import torchaudio`` raises ``ModuleNotFoundError``. A torchaudio that loads is left alone.
"""
import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)


def hide_unloadable_torchaudio():
    if "torchaudio" in sys.modules or importlib.util.find_spec("torchaudio") is None:
        return  # imported already (or hidden), or not installed
    try:
        import torchaudio  # noqa: F401
    except Exception as e:  # OSError from its C++ library, ImportError, RuntimeError: any failure
        for name in [name for name in sys.modules if name.split(".")[0] == "torchaudio"]:
            del sys.modules[name]  # what the failed import left half-made
        sys.modules["torchaudio"] = None
        logger.debug("torchaudio does not load (%s: %s); hidden from transformers", type(e).__name__, e)
