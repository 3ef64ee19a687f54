"""RNNencdec, the baseline of Bahdanau et al. (2015): Cho et al.'s (2014a) encoder-decoder,
as the fairseq model ``rnnencdec``.

A GRU encoder summarises the source into one vector c (:class:`GRUEncoder`); the decoder is
RNNsearch's :class:`~fairseq_plugins.models.rnnsearch.ConditionalGRUDecoder` given c at every
step instead of an attention context (:class:`FixedContext`).
"""
from typing import Dict, Optional

import torch
import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from torch import Tensor

from fairseq_plugins.models.rnnsearch import (
    RNNsearchModel,
    StackedGRUEncoder,
    _gru_defaults,
    _tiny_sizes,
    add_gru_model_args,
)
from fairseq_plugins.modules.beam_cache import EncoderOut


class GRUEncoder(StackedGRUEncoder):
    """Cho et al. (2014a) encoder: a GRU whose last state summarises the source,
    ``c = tanh(V h_T)``. ``encoder_out``: c (bsz, n)."""

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, max_source_positions):
        super().__init__(dictionary, embed_dim, hidden_size, num_layers, dropout, max_source_positions,
                         bidirectional=False)
        self.V = nn.Linear(hidden_size, hidden_size)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None) -> EncoderOut:
        _, h_n, _ = self.run_layers(src_tokens)  # e(x_t) through the GRUs
        c = torch.tanh(self.V(h_n[0]))  # c = tanh(V h_T), h_T of the top layer
        return {"encoder_out": [c]}


class FixedContext(nn.Module):
    """RNNencdec's context source: the encoder's summary c at every step and ``x_0 = c``
    (Cho et al.: ``h'_0 = tanh(V' c)``)."""

    def initial_input(self, encoder_out: EncoderOut) -> Tensor:
        return encoder_out["encoder_out"][0]  # c: (bsz, n)

    def start(self, encoder_out: EncoderOut) -> Dict[str, Tensor]:
        return {"c": encoder_out["encoder_out"][0]}  # once per sentence: (bsz, n)

    def step(self, s_prev: Tensor, per_beam: Dict[str, Tensor]):
        """c (R, 1, n) for the G hypotheses (R, G, n) of each beam; no alignment."""
        return per_beam["c"].unsqueeze(1), None

    def compile_step(self) -> Optional[str]:
        return None  # no alignment: a step is the GRU's and the deep output's matmuls


@register_model("rnnencdec")
class RNNencdecModel(RNNsearchModel):
    """RNNencdec (Cho et al., 2014a, as trained by Bahdanau et al.): GRU encoder summarised
    into one vector c, the same decoder and deep output conditioned on c at every step."""

    encoder_class = GRUEncoder
    has_attention = False  # one fixed context: --print-alignment is refused (patches/generation.py)

    @staticmethod
    def add_args(parser):
        add_gru_model_args(parser)

    @staticmethod
    def build_context(args, encoder):
        return FixedContext()

    @staticmethod
    def base_architecture(args):
        rnnencdec_base(args)


@register_model_architecture("rnnencdec", "rnnencdec")
def rnnencdec_base(args):
    """Paper sizes: n = 1000, m = 620, l = 500."""
    _gru_defaults(args)


@register_model_architecture("rnnencdec", "rnnencdec_tiny")
def rnnencdec_tiny(args):
    _tiny_sizes(args)
    rnnencdec_base(args)
