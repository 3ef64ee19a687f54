"""RNNsearch (Bahdanau, Cho & Bengio, ICLR 2015) as the fairseq model ``rnnsearch``.

The decoder, :class:`ConditionalGRUDecoder` (``s_0 = tanh(W_s ·)``, the conditional GRU, the
maxout deep output and the softmax), is shared with RNNencdec (:mod:`.rnnencdec`): the two
differ only in the context source module it is given, here the additive alignment model over
the annotations (:class:`AttentionContext`). Equations: docs/PAPERS.md.

The encoder's GRU is the papers' GRU (reset gate before the recurrent matrix,
:class:`fairseq_plugins.modules.gru.GRU`), not ``torch.nn.GRU``, which puts it
after. Tensors are batch-first everywhere (``encoder_out`` included); shapes are in comments.
"""
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.models import (
    FairseqEncoder,
    register_model,
    register_model_architecture,
)
from fairseq.modules import FairseqDropout
from torch import Tensor

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models._decoding import SuiteModel
from fairseq_plugins.models._initialisation import log_initialisation
from fairseq_plugins.models.rnn_common import check_positive
from fairseq_plugins.modules.additive_attention import AdditiveAttention
from fairseq_plugins.modules.beam_cache import (
    BeamCache,
    BeamCacheDecoder,
    EncoderOut,
    IncrementalState,
    reorder_encoder_out,
)
from fairseq_plugins.modules.conditional_gru import ConditionalGRUCell
from fairseq_plugins.modules.gru import GRU
from fairseq_plugins.modules.maxout import Maxout


class StackedGRUEncoder(FairseqEncoder):
    """Embedding, then ``num_layers`` of the papers' GRU (one or two directions), dropout between.

    Subclasses turn the top layer's outputs and final states into their ``encoder_out``.
    """

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, max_source_positions,
                 bidirectional):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.max_source_positions = max_source_positions
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, self.padding_idx)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        directions = 2 if bidirectional else 1
        self.layers = nn.ModuleList(
            GRU(embed_dim if k == 0 else directions * hidden_size, hidden_size, bidirectional=bidirectional)
            for k in range(num_layers)
        )
        self.output_units = directions * hidden_size

    def run_layers(self, src_tokens: Tensor):
        """(outputs (bsz, src_len, directions·n), final states (directions, bsz, n), padding mask (bsz, src_len))."""
        padding_mask = src_tokens.eq(self.padding_idx)
        h = self.dropout_module(self.embed_tokens(src_tokens))  # Ē x_j
        for k, layer in enumerate(self.layers):
            h, h_n = layer(self.dropout_module(h) if k > 0 else h, padding_mask)
        return h, h_n, padding_mask

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self):
        return self.max_source_positions


class BiGRUEncoder(StackedGRUEncoder):
    """Bidirectional GRU over ``Ē x_j`` (one embedding shared by both directions).

    ``encoder_out``: annotations ``h_j = [→h_j; ←h_j]`` (bsz, src_len, 2n), the padding
    mask (bsz, src_len) and ``←h_1`` (bsz, n), the backward state at the first word.
    """

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, max_source_positions):
        super().__init__(dictionary, embed_dim, hidden_size, num_layers, dropout, max_source_positions,
                         bidirectional=True)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None) -> EncoderOut:
        h, h_n, padding_mask = self.run_layers(src_tokens)
        return {
            "encoder_out": [h],  # h_j = [→h_j; ←h_j]: (bsz, src_len, 2n)
            "encoder_padding_mask": [padding_mask],
            "backward_first": [h_n[1]],  # ←h_1 of the top layer: (bsz, n)
        }


class AttentionContext(nn.Module):
    """RNNsearch's context source: ``c_i`` from the additive alignment model over the
    annotations, ``x_0 = ←h_1`` for the initial state."""

    def __init__(self, hidden_size: int, annotation_size: int, attention_hidden_size: int):
        super().__init__()
        self.attention = AdditiveAttention(hidden_size, annotation_size, attention_hidden_size)

    def initial_input(self, encoder_out: EncoderOut) -> Tensor:
        return encoder_out["backward_first"][0]  # ←h_1: (bsz, n)

    def start(self, encoder_out: EncoderOut) -> Dict[str, Tensor]:
        """What every step reads, once per sentence."""
        h = encoder_out["encoder_out"][0]
        return {
            "h": h,  # (bsz, src_len, 2n)
            "U_a_h": self.attention.project_annotations(h),  # U_a h_j: (bsz, src_len, n')
            "padding_mask": encoder_out["encoder_padding_mask"][0],
        }

    def step(self, s_prev: Tensor, per_beam: Dict[str, Tensor]):
        """c_i (R, G, 2n) and α_i (R, G, src_len) from s_{i-1} (R, G, n): the G hypotheses of a
        beam attend together to their sentence's annotations."""
        return self.attention(s_prev, per_beam["U_a_h"], per_beam["h"], per_beam["padding_mask"])

    def compile_step(self) -> Optional[str]:
        self.attention.compile_energies()
        return "the alignment model's energies v_a^T tanh(W_a s + U_a h_j)"


class ConditionalGRUDecoder(BeamCacheDecoder):
    """The decoder of both RNNsearch and RNNencdec (appendix A.2.2)::

        s_0  = tanh(W_s x_0)                       x_0 = ←h_1 (RNNsearch) or c (RNNencdec)
        s_i  = ConditionalGRU(E y_{i-1}, s_{i-1}, c_i)
        t̃_i  = U_o s + V_o E y_{i-1} + C_o c_i      s = s_i (eq. 4) or s_{i-1} (appendix)
        t_i  = maxout(t̃_i)
        p(y_i | ·) = softmax(W_o t_i)

    ``context`` (an :class:`AttentionContext` or a :class:`FixedContext`) is the only
    difference between the two models; it computes ``c_i`` from what it is given, the decoder
    projects it. Decoding step by step keeps ``s`` per hypothesis and the context's tensors
    (``h_j``, ``U_a h_j``, mask, or ``c``) once per beam in a
    :class:`~fairseq_plugins.modules.beam_cache.BeamCache`. The deep output runs on all steps at
    once after the loop.
    """

    def __init__(
        self, dictionary, embed_dim, hidden_size, context: nn.Module, context_size, init_size,
        maxout_dim, dropout, deep_output_state, max_target_positions,
    ):
        super().__init__(dictionary)
        self.max_target_positions = max_target_positions
        self.use_previous_state = deep_output_state == "previous"
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, dictionary.pad())
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.context = context
        self.W_s = nn.Linear(init_size, hidden_size)
        self.cell = ConditionalGRUCell(embed_dim, hidden_size, context_size)
        self.U_o = nn.Linear(hidden_size, 2 * maxout_dim)  # carries the deep output's bias
        self.V_o = nn.Linear(embed_dim, 2 * maxout_dim, bias=False)
        self.C_o = nn.Linear(context_size, 2 * maxout_dim, bias=False)
        self.maxout = Maxout(2 * maxout_dim, pool_size=2)
        self.W_o = nn.Linear(maxout_dim, len(dictionary))

    def initial_state(self, encoder_out: EncoderOut) -> Tensor:
        """``s_0 = tanh(W_s x_0)``: (bsz, n)."""
        return torch.tanh(self.W_s(self.context.initial_input(encoder_out)))

    def start_cache(self, encoder_out: EncoderOut, cache: BeamCache) -> None:
        """``s_0`` per hypothesis; the context's tensors per beam."""
        cache.per_hypothesis["s"] = self.initial_state(encoder_out)  # (N, n)
        for name, tensor in self.context.start(cache.beam_rows(encoder_out)).items():
            cache.per_beam[name] = tensor

    def forward(self, prev_output_tokens, encoder_out: Optional[EncoderOut],
                incremental_state: Optional[IncrementalState] = None, **unused):
        t, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return self.output_layer(t), extra

    def extract_features(self, prev_output_tokens, encoder_out: Optional[EncoderOut],
                         incremental_state: Optional[IncrementalState] = None):
        """Returns the maxout outputs t (bsz, tgt_len, l) and ``{"attn": [α (bsz, tgt_len, src_len) or None]}``."""
        cache = None if incremental_state is None else self.decoding_cache(incremental_state, encoder_out)
        if cache is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            s, per_beam, beam_size = cache.per_hypothesis["s"], cache.per_beam, cache.beam_size  # s: (N, n)
        else:  # teacher forcing: every row a beam of its own
            s, per_beam, beam_size = self.initial_state(encoder_out), self.context.start(encoder_out), 1
        rows, n = s.size(0), s.size(1)

        Ey = self.dropout_module(self.embed_tokens(prev_output_tokens))  # E y_{i-1}: (N, tgt_len, m)
        W_Ey = self.cell.project_input(Ey.transpose(0, 1))  # (tgt_len, N, 3n), all steps at once
        s = s.reshape(-1, beam_size, n)  # a beam's hypotheses together: (R, G, n)
        states: List[Tensor] = []
        contexts: List[Tensor] = []
        alphas: List[Optional[Tensor]] = []
        for W_Ey_i in W_Ey.unbind(0):  # unbind: indexing's backward allocates a full-size zero tensor per step
            c, alpha = self.context.step(s, per_beam)  # c_i (R, G or 1, k), α_i
            s_prev = s
            s = self.cell(W_Ey_i.reshape(-1, beam_size, W_Ey_i.size(1)), self.cell.project_context(c), s_prev)  # s_i
            states.append((s_prev if self.use_previous_state else s).reshape(rows, n))
            contexts.append(c.expand(-1, beam_size, -1).reshape(rows, -1))
            alphas.append(None if alpha is None else alpha.reshape(rows, -1))

        t_tilde = (
            self.U_o(torch.stack(states, dim=1))
            + self.V_o(Ey)
            + self.C_o(torch.stack(contexts, dim=1))
        )  # t̃_i = U_o s + V_o E y_{i-1} + C_o c_i: (N, tgt_len, 2l)
        t = self.dropout_module(self.maxout(t_tilde))  # t_i: (N, tgt_len, l)

        if cache is not None:
            cache.per_hypothesis["s"] = s.reshape(rows, n)
        attn = None if alphas[0] is None else torch.stack(alphas, dim=1)  # (N, tgt_len, src_len)
        return t, {"attn": [attn]}

    def output_layer(self, t: Tensor) -> Tensor:
        return self.W_o(t)  # logits of p(y_i | ·) = softmax(W_o t_i)

    def max_positions(self):
        return self.max_target_positions


def paper_init_(model: nn.Module) -> None:
    """Appendix B.1 of Bahdanau et al.: recurrent matrices random orthogonal (each n × n
    gate block); ``W_a`` and ``U_a`` from N(0, 0.001²); ``v_a`` and all biases zero; every
    other weight matrix (embeddings included) from N(0, 0.01²)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif name.endswith((".U_zr.weight", ".U.weight")):  # the GRUs' recurrent matrices
                for block in p.view(-1, p.size(-1), p.size(-1)):  # each n × n gate block
                    nn.init.orthogonal_(block)
            elif name.endswith(("attention.W_a.weight", "attention.U_a.weight")):
                p.normal_(0.0, 0.001)
            elif name.endswith("attention.v_a.weight"):
                p.zero_()
            else:
                p.normal_(0.0, 0.01)
        for module in model.modules():
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()


def add_gru_model_args(parser):
    """Flags shared by ``rnnsearch`` and ``rnnencdec`` (names as fairseq's ``lstm``)."""
    # fmt: off
    parser.add_argument('--dropout', type=float, metavar='D',
                        help='dropout on the source/target embeddings and the maxout output '
                             '(the paper uses none)')
    parser.add_argument('--encoder-embed-dim', type=int, metavar='N',
                        help='source word embedding size (paper: m = 620)')
    parser.add_argument('--encoder-hidden-size', type=int, metavar='N',
                        help='encoder GRU size per direction (paper: n = 1000)')
    parser.add_argument('--encoder-layers', type=int, metavar='N',
                        help='stacked encoder GRU layers (paper: 1)')
    parser.add_argument('--decoder-embed-dim', type=int, metavar='N',
                        help='target word embedding size (paper: m = 620)')
    parser.add_argument('--decoder-hidden-size', type=int, metavar='N',
                        help='decoder GRU size (paper: n = 1000)')
    parser.add_argument('--decoder-layers', type=int, metavar='N',
                        help='decoder layers; the paper\'s decoder is one conditional GRU, so only 1')
    parser.add_argument('--maxout-dim', type=int, metavar='N',
                        help='maxout deep output size l; t̃ has 2l units (paper: l = 500)')
    parser.add_argument('--deep-output-state', choices=['current', 'previous'],
                        help='state in the deep output: s_i (eq. 4, default) or s_{i-1} (appendix A.2.2)')
    parser.add_argument('--init', choices=['paper', 'pytorch'],
                        help="pytorch (default): PyTorch's initialisation, which trains in minutes with Adam; "
                             "paper: appendix B.1 (N(0, 0.01^2), orthogonal recurrent matrices), made for days "
                             "of Adadelta (docs/DEFAULTS.md)")
    # fmt: on


def check_gru_model_args(args) -> None:
    """One-line build-time errors (ConfigError) for sizes the model cannot be built with."""
    check_positive(args, ("encoder_embed_dim", "encoder_hidden_size", "encoder_layers", "decoder_embed_dim",
                          "decoder_hidden_size", "maxout_dim", "attention_hidden_size"))
    if args.decoder_layers != 1:
        raise ConfigError(
            f"--decoder-layers must be 1 (the paper's decoder is one conditional GRU), got {args.decoder_layers}"
        )


@register_model("rnnsearch")
class RNNsearchModel(SuiteModel):
    """RNNsearch: bidirectional GRU encoder, additive attention, conditional GRU decoder
    with a maxout deep output (Bahdanau et al., 2015)."""

    @staticmethod
    def add_args(parser):
        add_gru_model_args(parser)
        parser.add_argument('--attention-hidden-size', type=int, metavar='N',
                            help="alignment model hidden size n' (paper: 1000)")

    # What RNNencdec replaces: the encoder, the decoder's context source, the architecture defaults.
    encoder_class = BiGRUEncoder

    @staticmethod
    def build_context(args, encoder):
        return AttentionContext(args.decoder_hidden_size, encoder.output_units, args.attention_hidden_size)

    @staticmethod
    def base_architecture(args):
        rnnsearch_base(args)

    def compile_step(self) -> Optional[str]:
        return self.decoder.context.compile_step()

    @classmethod
    def build_model(cls, args, task):
        cls.base_architecture(args)
        check_gru_model_args(args)
        encoder = cls.encoder_class(
            task.source_dictionary, args.encoder_embed_dim, args.encoder_hidden_size,
            args.encoder_layers, args.dropout, args.max_source_positions,
        )
        decoder = ConditionalGRUDecoder(
            task.target_dictionary, args.decoder_embed_dim, args.decoder_hidden_size,
            context=cls.build_context(args, encoder), context_size=encoder.output_units,
            init_size=args.encoder_hidden_size,  # s_0 from ←h_1 (RNNsearch) or c (RNNencdec), both n wide
            maxout_dim=args.maxout_dim, dropout=args.dropout, deep_output_state=args.deep_output_state,
            max_target_positions=args.max_target_positions,
        )
        model = cls(encoder, decoder)
        if args.init == "paper":
            paper_init_(model)
        log_initialisation(args.arch, args.init, "Bahdanau et al. appendix B.1")
        return model


def _gru_defaults(args):
    args.dropout = getattr(args, "dropout", 0.0)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 620)
    args.encoder_hidden_size = getattr(args, "encoder_hidden_size", 1000)
    args.encoder_layers = getattr(args, "encoder_layers", 1)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 620)
    args.decoder_hidden_size = getattr(args, "decoder_hidden_size", 1000)
    args.decoder_layers = getattr(args, "decoder_layers", 1)
    args.maxout_dim = getattr(args, "maxout_dim", 500)
    args.deep_output_state = getattr(args, "deep_output_state", "current")
    # Not the paper's: its N(0, 0.01²) init barely learns in short Adam runs (docs/DEFAULTS.md).
    args.init = getattr(args, "init", "pytorch")
    args.max_source_positions = getattr(args, "max_source_positions", 1024)
    args.max_target_positions = getattr(args, "max_target_positions", 1024)


@register_model_architecture("rnnsearch", "rnnsearch")
def rnnsearch_base(args):
    """Paper sizes: n = 1000, m = 620, l = 500, n' = 1000."""
    args.attention_hidden_size = getattr(args, "attention_hidden_size", 1000)
    _gru_defaults(args)


def _tiny_sizes(args):
    """CPU tests and the quickstart: embeddings 32, GRUs 64, maxout 32."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 32)
    args.encoder_hidden_size = getattr(args, "encoder_hidden_size", 64)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 32)
    args.decoder_hidden_size = getattr(args, "decoder_hidden_size", 64)
    args.maxout_dim = getattr(args, "maxout_dim", 32)


@register_model_architecture("rnnsearch", "rnnsearch_tiny")
def rnnsearch_tiny(args):
    args.attention_hidden_size = getattr(args, "attention_hidden_size", 64)
    _tiny_sizes(args)
    rnnsearch_base(args)
