"""RNNencdec, the baseline of Bahdanau et al. (2015): Cho et al.'s (2014a) encoder-decoder,
as the fairseq model ``rnnencdec``.

A GRU encoder summarises the source into one vector c (:class:`GRUEncoder`); the decoder is
RNNsearch's :class:`~fairseq_plugins.models.rnnsearch.ConditionalGRUDecoder` given c at every
step instead of an attention context (:class:`FixedContext`).
"""
from typing import Dict, Optional

import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder, register_model, register_model_architecture
from fairseq.modules import FairseqDropout
from torch import Tensor

from fairseq_plugins.models.rnnsearch import (
    Cache,
    ConditionalGRUDecoder,
    EncoderOut,
    RNNsearchModel,
    _gru_defaults,
    _tiny_sizes,
    add_gru_model_args,
    check_gru_model_args,
    reorder_batch_first,
)
from fairseq_plugins.modules.conditional_gru import ConditionalGRUCell
from fairseq_plugins.modules.gru import GRU


class GRUEncoder(FairseqEncoder):
    """Cho et al. (2014a) encoder: a GRU whose last state summarises the source,
    ``c = tanh(V h_T)``. ``encoder_out``: c (bsz, n)."""

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, max_source_positions):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.max_source_positions = max_source_positions
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, self.padding_idx)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.layers = nn.ModuleList(
            GRU(embed_dim if k == 0 else hidden_size, hidden_size) for k in range(num_layers)
        )
        self.V = nn.Linear(hidden_size, hidden_size)
        self.output_units = hidden_size

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None) -> EncoderOut:
        padding_mask = src_tokens.eq(self.padding_idx)
        h = self.dropout_module(self.embed_tokens(src_tokens))  # e(x_t)
        for k, layer in enumerate(self.layers):
            h, h_n = layer(self.dropout_module(h) if k > 0 else h, padding_mask)
        c = torch.tanh(self.V(h_n[0]))  # c = tanh(V h_T), h_T of the top layer
        return {"encoder_out": [c]}

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        return reorder_batch_first(encoder_out, new_order)

    def max_positions(self):
        return self.max_source_positions


class FixedContext(nn.Module):
    """RNNencdec's context source: the encoder's summary c at every step (``C c`` computed
    once per sentence) and ``x_0 = c`` (Cho et al.: ``h'_0 = tanh(V' c)``)."""

    def initial_input(self, encoder_out: EncoderOut) -> Tensor:
        return encoder_out["encoder_out"][0]  # c: (bsz, n)

    def cache(self, encoder_out: EncoderOut, cell: ConditionalGRUCell) -> Dict[str, Tensor]:
        c = encoder_out["encoder_out"][0]
        return {"c": c, "C_c": cell.project_context(c)}  # (bsz, n), (bsz, 3n_dec)

    def step(self, s_prev: Tensor, cache: Cache, cell: ConditionalGRUCell):
        return cache["c"], cache["C_c"], None


@register_model("rnnencdec")
class RNNencdecModel(RNNsearchModel):
    """RNNencdec (Cho et al., 2014a, as trained by Bahdanau et al.): GRU encoder summarised
    into one vector c, the same decoder and deep output conditioned on c at every step."""

    @staticmethod
    def add_args(parser):
        add_gru_model_args(parser)

    @classmethod
    def build_model(cls, args, task):
        rnnencdec_base(args)
        check_gru_model_args(args)
        encoder = GRUEncoder(
            task.source_dictionary, args.encoder_embed_dim, args.encoder_hidden_size,
            args.encoder_layers, args.dropout, args.max_source_positions,
        )
        decoder = ConditionalGRUDecoder(
            task.target_dictionary, args.decoder_embed_dim, args.decoder_hidden_size,
            context=FixedContext(), context_size=encoder.output_units, init_size=encoder.output_units,
            maxout_dim=args.maxout_dim, dropout=args.dropout, deep_output_state=args.deep_output_state,
            max_target_positions=args.max_target_positions,
        )
        return cls.initialised(encoder, decoder, args)


@register_model_architecture("rnnencdec", "rnnencdec")
def rnnencdec_base(args):
    """Paper sizes: n = 1000, m = 620, l = 500."""
    _gru_defaults(args)


@register_model_architecture("rnnencdec", "rnnencdec_tiny")
def rnnencdec_tiny(args):
    _tiny_sizes(args)
    rnnencdec_base(args)
