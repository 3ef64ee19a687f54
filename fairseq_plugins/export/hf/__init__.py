"""Write a fairseq-plugins checkpoint as a Hugging Face transformers model folder.

    fairseq-plugins-export-hf CHECKPOINT OUT_DIR [--data DIR] [--force]
        [--bpe-codes FILE | --sentencepiece-model FILE] [--source-lang L] [--target-lang L]
        [--beam N] [--max-len-a A] [--max-len-b B] [--lenpen P]

Interface between the shared part (this package) and the model writers
-----------------------------------------------------------------------
``export(checkpoint, out_dir, data=None, force=False, bpe_codes=None, sentencepiece_model=None,
source_lang=None, target_lang=None, moses=True, aggressive=True, escape=True,
beam=5, max_len_a=0.0, max_len_b=200, lenpen=1.0)``:

1. refuses bad input with one-line :mod:`fairseq_plugins.errors` errors BEFORE writing anything
   (OUT_DIR exists without ``force``; unreadable checkpoint; another architecture; missing
   dictionary / ``--data``; missing BPE codes or sentencepiece model);
2. loads the model with fairseq's ``checkpoint_utils.load_model_ensemble_and_task`` on the state
   read by the suite's loader (:func:`fairseq_plugins.checkpoints.load_state`), eval mode;
3. dispatches by model family (``ARCH_MODEL_NAME_REGISTRY[arch]``):

   * ``vaswani_transformer`` -> :mod:`fairseq_plugins.export.hf.transformer`;
   * ``rnnsearch``, ``rnnencdec``, ``seq2seq_lstm`` -> :mod:`fairseq_plugins.export.hf.rnn`.

   A family module has exactly two functions:

   * ``check_supported(model) -> None``: raises a one-line ``ConfigError`` naming the option
     it cannot export; called before anything is written;
   * ``write_model(model, out_dir) -> None``: ``out_dir`` is an existing empty staging folder;
     writes ``config.json`` (with ``auto_map`` for remote code), ``model.safetensors`` and any
     modeling ``.py`` files. ``config.json`` must carry the TARGET dictionary's special ids:
     ``pad_token_id = tgt_dict.pad()`` (1), ``eos_token_id = tgt_dict.eos()`` (2),
     ``bos_token_id = tgt_dict.bos()`` (0), ``decoder_start_token_id = tgt_dict.eos()``
     (fairseq starts decoding from ``</s>``), ``is_encoder_decoder = True``, and the model must
     take ``input_ids`` of SOURCE dictionary ids ending with ``</s>`` (as fairseq's sources do),
     ``attention_mask`` 1 on tokens, and return logits over the target dictionary in its order.
     ``auto_map`` must name ``AutoConfig`` and ``AutoModelForSeq2SeqLM`` (the folder's pipeline
     loads the model with ``AutoModelForSeq2SeqLM``). It must not write
     ``generation_config.json`` or tokenizer files (the shared part does, after ``write_model``,
     overwriting whatever is there).

4. writes, for every family, ``custom_pipelines`` into ``config.json`` and
   ``pipeline_fairseq_plugins.py`` (transformers 5 removed ``pipeline("translation")``; the
   folder brings it back, so every family needs ``trust_remote_code=True``),
   ``generation_config.json`` (fairseq-generate's beam, max length, length penalty, its
   stopping rule: :func:`generation_config`) and the tokenizer files (same id = same token
   as fairseq's dictionaries; preprocessing from the files named: sacremoses [+ subword-nmt BPE
   codes] or a sentencepiece model);
5. moves the staging folder to ``out_dir`` (replacing it only with ``force``).
"""
import importlib
import json
import os
import shutil
import tempfile
from typing import Optional

from fairseq_plugins.errors import CheckpointError, ConfigError
from fairseq_plugins.export.common import (build_model, check_output, model_family, model_options, read_checkpoint,
                                           staged_folder)
from fairseq_plugins.torchaudio_guard import hide_unloadable_torchaudio

hide_unloadable_torchaudio()  # before this package imports transformers

# model family -> module of this package that writes it
FAMILIES = {"vaswani_transformer": "transformer", "rnnsearch": "rnn", "rnnencdec": "rnn", "seq2seq_lstm": "rnn"}
HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = "pipeline_fairseq_plugins"  # transformers 5 has no translation pipeline: the folder brings one


def load_model(checkpoint: str, data: Optional[str] = None):
    """(family, model in eval mode, task with the dictionaries), read as fairseq-generate does."""
    state = read_checkpoint(checkpoint)
    family = model_family(model_options(state, checkpoint), checkpoint, FAMILIES, "transformers")
    return (family, *build_model(state, checkpoint, data))


def generation_config(model, beam: int = 5, max_len_a: float = 0.0, max_len_b: int = 200, lenpen: float = 1.0):
    """transformers' GenerationConfig doing what ``fairseq-generate --beam --max-len-b --lenpen`` does.

    fairseq's stopping rule (a sentence is done once ``beam`` hypotheses ended with ``</s>``, each
    scored by its log-probability / (length with ``</s>``)^lenpen) is HF's ``early_stopping=True``
    with the same ``length_penalty``; both score in natural log (HF's ``sequences_scores``),
    fairseq-generate prints base 2. fairseq forbids ``<pad>`` always and ``</s>`` at the first
    step (``--min-len 1``) and forces ``</s>`` after ``max_len = min(b, max target positions - 1)``
    tokens: ``suppress_tokens``, ``min_new_tokens=1``, ``forced_eos_token_id`` with
    ``max_new_tokens = max_len + 1`` (the ``</s>``).
    """
    from transformers import GenerationConfig

    if beam < 1:
        raise ConfigError(f"--beam {beam}: must be >= 1")
    if max_len_a != 0:
        raise ConfigError(f"--max-len-a {max_len_a}: transformers' generate has one length limit for every "
                          "sentence, not one proportional to the source; export with --max-len-a 0")
    if max_len_b < 1:
        raise ConfigError(f"--max-len-b {max_len_b}: must be >= 1")
    d = model.decoder.dictionary
    max_len = min(max_len_b, model.decoder.max_positions() - 1)
    return GenerationConfig(
        num_beams=beam, length_penalty=lenpen, early_stopping=True, do_sample=False, num_return_sequences=1,
        max_new_tokens=max_len + 1, min_new_tokens=1, forced_eos_token_id=d.eos(), suppress_tokens=[d.pad()],
        bos_token_id=d.bos(), eos_token_id=d.eos(), pad_token_id=d.pad(), decoder_start_token_id=d.eos())


def _symbols_file(dictionary, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(list(dictionary.symbols), f, ensure_ascii=False)
    return path


def write_tokenizer(task, out_dir: str, bpe_codes=None, sentencepiece_model=None, source_lang=None,
                    target_lang=None, moses=True, aggressive=True, escape=True):
    """The tokenizer files and its code (``auto_map``: ``trust_remote_code=True``)."""
    from fairseq_plugins.export.hf import tokenization_fairseq_plugins as module

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = module.FairseqPluginsTokenizer(
            _symbols_file(task.source_dictionary, os.path.join(tmp, "src.json")),
            _symbols_file(task.target_dictionary, os.path.join(tmp, "tgt.json")),
            bpe_codes=bpe_codes, sentencepiece_model=sentencepiece_model,
            source_lang=source_lang or task.cfg.source_lang, target_lang=target_lang or task.cfg.target_lang,
            moses=moses and sentencepiece_model is None, aggressive=aggressive, escape=escape)
        tokenizer.register_for_auto_class("AutoTokenizer")
        tokenizer.save_pretrained(out_dir)


def add_pipeline(out_dir: str) -> None:
    """Name the folder's translation pipeline in config.json (``custom_pipelines``) and ship its code."""
    shutil.copyfile(os.path.join(HERE, f"{PIPELINE}.py"), os.path.join(out_dir, f"{PIPELINE}.py"))
    path = os.path.join(out_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["custom_pipelines"] = {"translation": {"impl": f"{PIPELINE}.TranslationPipeline",
                                                  "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def _check_file(path, flag):
    if path is not None and not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: no such file")


def export(checkpoint: str, out_dir: str, data: Optional[str] = None, force: bool = False,
           bpe_codes: Optional[str] = None, sentencepiece_model: Optional[str] = None,
           source_lang: Optional[str] = None, target_lang: Optional[str] = None, moses: bool = True,
           aggressive: bool = True, escape: bool = True,
           beam: int = 5, max_len_a: float = 0.0, max_len_b: int = 200, lenpen: float = 1.0) -> str:
    """Write ``out_dir``; every refusal comes before anything is written."""
    check_output(out_dir, force, "config.json", "transformers model folder")
    if bpe_codes is not None and sentencepiece_model is not None:
        raise ConfigError("--bpe-codes and --sentencepiece-model: name one subword model, not both")
    _check_file(bpe_codes, "--bpe-codes")
    _check_file(sentencepiece_model, "--sentencepiece-model")
    family, model, task = load_model(checkpoint, data)
    writer = importlib.import_module(f"{__name__}.{FAMILIES[family]}")
    writer.check_supported(model)
    generation = generation_config(model, beam, max_len_a, max_len_b, lenpen)
    with staged_folder(out_dir) as staging:
        writer.write_model(model, staging)
        generation.save_pretrained(staging)
        add_pipeline(staging)
        write_tokenizer(task, staging, bpe_codes, sentencepiece_model, source_lang, target_lang, moses,
                        aggressive, escape)
    return out_dir


def load_strict(model_dir: str, **kwargs):
    """``AutoModelForSeq2SeqLM.from_pretrained`` that fails on a missing, unexpected or mismatched
    weight: transformers itself only logs them and initialises the missing ones at random."""
    from transformers import AutoModelForSeq2SeqLM

    model, info = AutoModelForSeq2SeqLM.from_pretrained(model_dir, output_loading_info=True, **kwargs)
    wrong = {k: sorted(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if wrong:
        raise CheckpointError(f"{model_dir}: weights do not match the model: "
                              + "; ".join(f"{k.replace('_', ' ')} {', '.join(map(str, v))}" for k, v in wrong.items()))
    return model.eval()
