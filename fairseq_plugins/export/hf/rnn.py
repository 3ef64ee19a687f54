"""Hugging Face transformers folders of the recurrent families: ``rnnsearch``, ``rnnencdec``,
``seq2seq_lstm`` (the family writer of :mod:`fairseq_plugins.export.hf`).

transformers has no such classes, so the folder ships their model code,
:mod:`.modeling_fairseq_rnn` and the layers it imports, :mod:`.fairseq_rnn_layers` (torch and
transformers only), loaded with ``trust_remote_code=True`` through ``auto_map``. Its parameters carry fairseq-plugins' names,
so the weights are the checkpoint's state dict unchanged (as float32). Sizes and options are
read from the built fairseq model's modules, i.e. what it computes, not from the flags.
"""
import os
import shutil
from typing import Dict

import torch
from safetensors.torch import save_file
from torch import nn

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.hf import fairseq_rnn_layers as layers
from fairseq_plugins.export.hf import modeling_fairseq_rnn as modeling
from fairseq_plugins.models.rnnencdec import RNNencdecModel
from fairseq_plugins.models.rnnsearch import RNNsearchModel
from fairseq_plugins.models.seq2seq_lstm import Seq2SeqLSTMModel

MODELING_FILE = "modeling_fairseq_rnn.py"
LAYERS_FILE = "fairseq_rnn_layers.py"  # imported by the modeling file: copied beside it
AUTO_MAP = {
    "AutoConfig": "modeling_fairseq_rnn.FairseqRNNConfig",
    "AutoModelForSeq2SeqLM": "modeling_fairseq_rnn.FairseqRNNForConditionalGeneration",
}


def family(model) -> str:
    # RNNencdecModel subclasses RNNsearchModel: test it first
    for cls, name in ((RNNencdecModel, "rnnencdec"), (RNNsearchModel, "rnnsearch"), (Seq2SeqLSTMModel, "seq2seq_lstm")):
        if isinstance(model, cls):
            return name
    raise ConfigError(f"{type(model).__name__} is not a model of rnnsearch, rnnencdec or seq2seq_lstm")


def _lstm_options(rnn: nn.LSTM, side: str) -> None:
    """nn.LSTM settings fairseq-plugins never changes; refused by name should they differ."""
    for option, expected in (("bidirectional", False), ("proj_size", 0), ("bias", True), ("batch_first", True)):
        if getattr(rnn, option) != expected:
            raise ConfigError(f"seq2seq_lstm {side} LSTM with {option}={getattr(rnn, option)!r}: not exported "
                              f"(the exported model computes {option}={expected!r})")


def config_fields(model) -> Dict:
    """The :class:`~.modeling_fairseq_rnn.FairseqRNNConfig` fields of ``model``."""
    name = family(model)
    encoder, decoder = model.encoder, model.decoder
    src_dict, tgt_dict = encoder.dictionary, decoder.dictionary
    fields = dict(
        family=name,
        vocab_size=len(tgt_dict), source_vocab_size=len(src_dict),
        encoder_embed_dim=encoder.embed_tokens.embedding_dim, decoder_embed_dim=decoder.embed_tokens.embedding_dim,
        dropout=encoder.dropout_module.p,
        source_pad_token_id=src_dict.pad(), source_eos_token_id=src_dict.eos(),
        pad_token_id=tgt_dict.pad(), eos_token_id=tgt_dict.eos(), bos_token_id=tgt_dict.bos(),
        decoder_start_token_id=tgt_dict.eos(),  # fairseq starts decoding from </s>
    )
    if name == "seq2seq_lstm":
        _lstm_options(encoder.rnn, "encoder")
        _lstm_options(decoder.rnn, "decoder")
        fields.update(
            encoder_hidden_size=encoder.rnn.hidden_size, encoder_layers=encoder.rnn.num_layers,
            decoder_hidden_size=decoder.rnn.hidden_size, decoder_layers=decoder.rnn.num_layers,
            reverse_source=bool(encoder.reverse_source),
        )
    else:
        if decoder.maxout.pool_size != 2:
            raise ConfigError(f"{name} maxout pool size {decoder.maxout.pool_size}: not exported (the exported "
                              "model pools pairs, as the paper)")
        fields.update(
            encoder_hidden_size=encoder.layers[0].hidden_size, encoder_layers=len(encoder.layers),
            decoder_hidden_size=decoder.W_s.out_features, decoder_layers=1,
            maxout_dim=decoder.maxout.in_features // 2,
            deep_output_state="previous" if decoder.use_previous_state else "current",
        )
        if name == "rnnsearch":
            fields["attention_hidden_size"] = decoder.context.attention.W_a.out_features
    return fields


def _config(model) -> modeling.FairseqRNNConfig:
    config = modeling.FairseqRNNConfig(**config_fields(model), auto_map=AUTO_MAP)
    config.architectures = ["FairseqRNNForConditionalGeneration"]
    return config


def check_supported(model) -> None:
    """One-line ConfigError for anything the exported model would not compute: another family,
    an option outside the fields, or any parameter whose name or shape the exported model lacks
    (so an option added to the fairseq model later is refused until the export computes it)."""
    config = _config(model)
    with torch.device("meta"):  # names and shapes only, no memory
        expected = {k: tuple(v.shape) for k, v in modeling.FairseqRNNForConditionalGeneration(config).state_dict().items()}
    actual = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for key in sorted(set(expected) | set(actual)):
        if expected.get(key) != actual.get(key):
            raise ConfigError(f"{config.family} parameter {key}: {actual.get(key) or 'absent'} in the checkpoint, "
                              f"{expected.get(key) or 'absent'} in the exported model; not exported")


def write_model(model, out_dir: str) -> None:
    """``config.json`` (with ``auto_map``), ``model.safetensors`` and the model code in ``out_dir``."""
    check_supported(model)
    _config(model).save_pretrained(out_dir)
    weights = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    for module, name in ((modeling, MODELING_FILE), (layers, LAYERS_FILE)):
        shutil.copyfile(module.__file__, os.path.join(out_dir, name))
