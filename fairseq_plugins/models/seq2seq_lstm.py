"""Sequence to sequence learning with deep LSTMs (Sutskever, Vinyals & Le, NIPS 2014) as
fairseq model ``seq2seq_lstm``: two different deep LSTMs, the encoder's final (h, c) of every
layer initialise the decoder's, no attention, plain softmax, and the source fed reversed.
Facts: docs/PAPERS.md. Tensors are batch-first.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from fairseq.models import (
    FairseqEncoder,
    register_model,
    register_model_architecture,
)
from fairseq.modules import FairseqDropout
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models._decoding import SuiteModel
from fairseq_plugins.models._initialisation import log_initialisation
from fairseq_plugins.models.rnn_common import check_positive
from fairseq_plugins.modules.beam_cache import (
    BeamCache,
    BeamCacheDecoder,
    EncoderOut,
    IncrementalState,
    reorder_encoder_out,
)
from fairseq_plugins.modules.lstm import stacked_lstm_step
from fairseq_plugins.modules.recurrence import final_carry


def reverse_source_tokens(src_tokens: Tensor, pad: int, eos: int) -> Tensor:
    """Reverse the words of each sentence, leaving the padding and the final EOS in place.

    ``[pad pad a b c </s>]`` -> ``[pad pad c b a </s>]`` (either padding side). Returns a
    new tensor; ``src_tokens`` is not modified.
    """
    words = src_tokens.ne(pad) & src_tokens.ne(eos)  # (bsz, len)
    n = words.sum(dim=1, keepdim=True)  # words per sentence
    first = words.to(torch.uint8).argmax(dim=1, keepdim=True)  # position of the first word
    positions = torch.arange(src_tokens.size(1), device=src_tokens.device).unsqueeze(0)
    mirrored = 2 * first + n - 1 - positions  # the k-th word <- the (n-1-k)-th word
    return src_tokens.gather(1, torch.where(words, mirrored, positions))


class LSTMEncoder(FairseqEncoder):
    """Deep LSTM reading the (reversed) source; ``encoder_out`` holds its final (h, c)."""

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, reverse_source,
                 max_source_positions):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.eos_idx = dictionary.eos()
        self.reverse_source = reverse_source
        self.max_source_positions = max_source_positions
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, self.padding_idx)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.rnn = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True,
                           dropout=dropout if num_layers > 1 else 0.0)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None) -> EncoderOut:
        if self.reverse_source:
            src_tokens = reverse_source_tokens(src_tokens, self.padding_idx, self.eos_idx)
        padding_mask = src_tokens.eq(self.padding_idx)
        x = self.dropout_module(self.embed_tokens(src_tokens))  # (bsz, src_len, d)
        self.rnn.training = self.training or self.dropout_module.apply_during_inference  # see LSTMDecoder
        h_n, c_n = self.final_state(x, padding_mask)  # (layers, bsz, H) each
        # batch-first so that reordering is one index_select(0) for every entry
        return {"encoder_h": [h_n.transpose(0, 1)], "encoder_c": [c_n.transpose(0, 1)]}

    def final_state(self, x: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """Run the LSTM over the real tokens of each sentence only, so that a sentence's final
        state does not depend on its batch or on the padding side (fairseq left-pads sources).

        Training runs ``nn.LSTM`` packed, fused and with its dropout; generation and
        ``torch.export`` run one ``scan`` over time of the layers' cells on the same weights, the
        state kept unchanged over padding.

        Args:
            x: (bsz, len, C); padding_mask: (bsz, len), True at padding.

        Returns:
            the final state ``(h_n, c_n)``, each (layers, bsz, H).
        """
        if not torch.jit.is_scripting():  # TorchScript cannot compile scan: it keeps packing
            if not torch.is_grad_enabled() and not self.rnn.training:
                return self._final_state_by_scan(x, padding_mask)
        lengths = (~padding_mask).sum(dim=1)  # (bsz,)
        front = padding_mask.long().argsort(dim=1, stable=True)  # real tokens first, in order
        x_front = x.gather(1, front.unsqueeze(2).expand_as(x))
        packed = pack_padded_sequence(x_front, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, final = self.rnn(packed)
        return final

    def _final_state_by_scan(self, x: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        rnn = self.rnn
        state = x.new_zeros(2, rnn.num_layers, x.size(0), rnn.hidden_size)  # (h, c) per layer
        weights = [w for layer in rnn.all_weights for w in layer]
        final = final_carry(stacked_lstm_step, state, [x.transpose(0, 1), padding_mask.t().unsqueeze(2)], weights)
        return final[0], final[1]

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self):
        return self.max_source_positions


class LSTMDecoder(BeamCacheDecoder):
    """Deep LSTM language model over the target, started from the encoder's final (h, c);
    teacher forcing runs the fused ``nn.LSTM`` over the whole target at once."""

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, max_target_positions):
        super().__init__(dictionary)
        self.max_target_positions = max_target_positions
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, dictionary.pad())
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.rnn = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True,
                           dropout=dropout if num_layers > 1 else 0.0)
        self.fc_out = nn.Linear(hidden_size, len(dictionary))

    def forward(self, prev_output_tokens, encoder_out: EncoderOut,
                incremental_state: Optional[IncrementalState] = None, **unused):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return self.output_layer(x), extra

    def extract_features(self, prev_output_tokens, encoder_out: Optional[EncoderOut],
                         incremental_state: Optional[IncrementalState] = None):
        cache = None if incremental_state is None else self.decoding_cache(incremental_state, encoder_out)
        if cache is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            h, c = cache.per_hypothesis["h"], cache.per_hypothesis["c"]  # (bsz, layers, H)
        else:  # teacher forcing: the encoder's final states themselves
            h, c = encoder_out["encoder_h"][0], encoder_out["encoder_c"][0]
        x = self.dropout_module(self.embed_tokens(prev_output_tokens))  # (bsz, tgt_len, d)
        # nn.LSTM drops out between layers in training mode only: --retain-dropout keeps it on too
        self.rnn.training = self.training or self.dropout_module.apply_during_inference
        x, (h_n, c_n) = self.rnn(x, (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()))  # layers first
        if cache is not None:
            cache.per_hypothesis["h"], cache.per_hypothesis["c"] = h_n.transpose(0, 1), c_n.transpose(0, 1)
        return self.dropout_module(x), {"attn": [None]}

    def start_cache(self, encoder_out: EncoderOut, cache: BeamCache) -> None:
        """The encoder's final (h, c) per hypothesis, batch-first: (bsz, layers, H)."""
        cache.per_hypothesis["h"] = encoder_out["encoder_h"][0]
        cache.per_hypothesis["c"] = encoder_out["encoder_c"][0]

    def output_layer(self, x: Tensor) -> Tensor:
        return self.fc_out(x)  # plain softmax over the target vocabulary

    def max_positions(self):
        return self.max_target_positions


@register_model("seq2seq_lstm")
class Seq2SeqLSTMModel(SuiteModel):
    """Sutskever et al. (2014): deep LSTM encoder-decoder, source reversed, no attention."""

    has_attention = False  # --print-alignment is refused (patches/generation.py, alignment_attention)

    @staticmethod
    def add_args(parser):
        # fmt: off
        parser.add_argument('--dropout', type=float, metavar='D',
                            help='dropout on embeddings, between layers and on the top layer (paper: none)')
        parser.add_argument('--encoder-embed-dim', type=int, metavar='N',
                            help='source embedding size (paper: 1000)')
        parser.add_argument('--encoder-hidden-size', type=int, metavar='N',
                            help='encoder LSTM cells per layer (paper: 1000)')
        parser.add_argument('--encoder-layers', type=int, metavar='N',
                            help='encoder LSTM layers (paper: 4)')
        parser.add_argument('--decoder-embed-dim', type=int, metavar='N',
                            help='target embedding size (paper: 1000)')
        parser.add_argument('--decoder-hidden-size', type=int, metavar='N',
                            help='decoder LSTM cells per layer; must equal --encoder-hidden-size')
        parser.add_argument('--decoder-layers', type=int, metavar='N',
                            help='decoder LSTM layers; must equal --encoder-layers')
        parser.add_argument('--reverse-source', dest='reverse_source', action='store_true',
                            help='feed the source words reversed, padding and EOS in place (default, as in the paper)')
        parser.add_argument('--no-reverse-source', dest='reverse_source', action='store_false',
                            help='feed the source in its natural order')
        parser.add_argument('--init', choices=['paper', 'pytorch'],
                            help='paper: every parameter uniform in [-0.08, 0.08] (default); pytorch: PyTorch defaults')
        # fmt: on

    @classmethod
    def build_model(cls, args, task):
        seq2seq_lstm_base(args)
        check_positive(args, ("encoder_embed_dim", "encoder_hidden_size", "encoder_layers",
                              "decoder_embed_dim", "decoder_hidden_size", "decoder_layers"))
        if (args.encoder_layers, args.encoder_hidden_size) != (args.decoder_layers, args.decoder_hidden_size):
            raise ConfigError(
                "--encoder-layers/--encoder-hidden-size must equal --decoder-layers/--decoder-hidden-size "
                "(the encoder's final states initialise the decoder's), got "
                f"{args.encoder_layers}x{args.encoder_hidden_size} vs {args.decoder_layers}x{args.decoder_hidden_size}"
            )
        encoder = LSTMEncoder(
            task.source_dictionary, args.encoder_embed_dim, args.encoder_hidden_size, args.encoder_layers,
            args.dropout, args.reverse_source, args.max_source_positions,
        )
        decoder = LSTMDecoder(
            task.target_dictionary, args.decoder_embed_dim, args.decoder_hidden_size, args.decoder_layers,
            args.dropout, args.max_target_positions,
        )
        model = cls(encoder, decoder)
        if args.init == "paper":
            with torch.no_grad():
                for p in model.parameters():
                    p.uniform_(-0.08, 0.08)  # "initialized ... uniform distribution between -0.08 and 0.08"
        log_initialisation(args.arch, args.init, "Sutskever et al. §3.4, uniform in [-0.08, 0.08]")
        return model


@register_model_architecture("seq2seq_lstm", "seq2seq_lstm")
def seq2seq_lstm_base(args):
    """Paper sizes: 4 layers of 1000 cells, 1000-dim embeddings."""
    args.dropout = getattr(args, "dropout", 0.0)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 1000)
    args.encoder_hidden_size = getattr(args, "encoder_hidden_size", 1000)
    args.encoder_layers = getattr(args, "encoder_layers", 4)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 1000)
    args.decoder_hidden_size = getattr(args, "decoder_hidden_size", args.encoder_hidden_size)
    args.decoder_layers = getattr(args, "decoder_layers", args.encoder_layers)
    args.reverse_source = getattr(args, "reverse_source", True)
    args.init = getattr(args, "init", "paper")
    args.max_source_positions = getattr(args, "max_source_positions", 1024)
    args.max_target_positions = getattr(args, "max_target_positions", 1024)


@register_model_architecture("seq2seq_lstm", "seq2seq_lstm_tiny")
def seq2seq_lstm_tiny(args):
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 32)
    args.encoder_hidden_size = getattr(args, "encoder_hidden_size", 64)
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 32)
    seq2seq_lstm_base(args)
