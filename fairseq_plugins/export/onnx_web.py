"""The page of an ONNX folder: ``index.html`` translating in the browser with onnxruntime-web.

The page's files: onnxruntime-web's JavaScript and WebAssembly (copied from the npm package
``scripts/setup_onnx_web.sh`` installs; no CDN), the heat-map drawing shared with
``fairseq-plugins-serve``'s page (``serve/heatmap.js``), the page's beam search and subword code
(``onnx_page.js``) and, for a sentencepiece model, its pieces and scores (``sentencepiece.json``,
read with the sentencepiece library here, so the page needs no protobuf parser).
"""
import json
import logging
import os
import shutil
from importlib import resources
from typing import Optional

logger = logging.getLogger(__name__)

ORT_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs")
SETUP = "bash scripts/setup_onnx_web.sh"


def package_dir() -> str:
    """Where ``scripts/setup_onnx_web.sh`` installs onnxruntime-web (``$FAIRSEQ_PLUGINS_ONNX_WEB``)."""
    default = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                           "fairseq-plugins", "onnxruntime-web")
    root = os.environ.get("FAIRSEQ_PLUGINS_ONNX_WEB") or default
    return os.path.join(root, "node_modules", "onnxruntime-web", "dist")


def assets() -> Optional[str]:
    """onnxruntime-web's ``dist`` folder, or None (the folder is written without its page)."""
    dist = package_dir()
    missing = [name for name in ORT_FILES if not os.path.isfile(os.path.join(dist, name))]
    if missing:
        logger.warning("no index.html: onnxruntime-web is not installed in %s (%s installs it)", dist, SETUP)
        return None
    return dist


def _sentencepiece_pieces(model_path: str) -> dict:
    """The unigram lattice's pieces (normal and user-defined) with their scores, and the unknown
    piece's score (sentencepiece: the lowest score minus 10)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    pieces = [[sp.id_to_piece(i), sp.get_score(i)] for i in range(sp.get_piece_size())
              if not (sp.is_unknown(i) or sp.is_control(i) or sp.is_unused(i) or sp.is_byte(i))]
    return {"pieces": pieces, "unk_score": min(score for _, score in pieces) - 10.0}


def write_page(out_dir: str, dist: Optional[str], sentencepiece_model: Optional[str] = None) -> None:
    if dist is None:
        return
    for name in ORT_FILES:
        shutil.copyfile(os.path.join(dist, name), os.path.join(out_dir, name))
    here = resources.files(__package__)
    shared = resources.files("fairseq_plugins.serve").joinpath("heatmap.js")
    for source, name in ((here.joinpath("onnx_page.html"), "index.html"), (here.joinpath("onnx_page.js"), "onnx_page.js"),
                         (shared, "heatmap.js")):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(source.read_text(encoding="utf-8"))
    if sentencepiece_model is not None:
        with open(os.path.join(out_dir, "sentencepiece.json"), "w", encoding="utf-8") as f:
            json.dump(_sentencepiece_pieces(sentencepiece_model), f, ensure_ascii=False)
