"""fairseq-plugins' recurrent translation models in Hugging Face transformers: ``rnnsearch``
(Bahdanau et al. 2015), ``rnnencdec`` (Cho et al. 2014a, as Bahdanau et al. train it) and
``seq2seq_lstm`` (Sutskever et al. 2014).

This file ships inside every exported folder, with the layers it imports
(``fairseq_rnn_layers.py``), and is loaded with ``trust_remote_code=True``; both import torch and
transformers only (no fairseq). Parameter names are fairseq-plugins' own, so a checkpoint's
weights load unchanged, and the functions are the same:

* the papers' GRU, ``h̃_j = tanh(W x_j + U [r_j ∘ h_{j-1}])`` (``torch.nn.GRU`` puts the reset
  gate after ``U``), its state carried unchanged over padding on either side;
* RNNsearch: bidirectional encoder, ``s_0 = tanh(W_s ←h_1)``, additive attention
  ``e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)``, the conditional GRU decoder and the maxout deep
  output ``t̃_i = U_o s + V_o E y_{i-1} + C_o c_i`` with ``s = s_i`` or ``s_{i-1}``
  (``deep_output_state``);
* RNNencdec: the same decoder given the fixed summary ``c = tanh(V h_T)`` and ``s_0 = tanh(W_s c)``;
* seq2seq_lstm: source words reversed (padding and the final ``</s>`` in place), the encoder's
  final (h, c) of every layer start the decoder's, plain softmax.

Generation: the recurrent state (and RNNsearch's annotations and ``U_a h_j``) is the cache,
:class:`RecurrentState`, made by ``forward`` and reordered for beams by ``reorder_cache``.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils import ModelOutput

from .fairseq_rnn_layers import AdditiveAttention, BatchedLinear, ConditionalGRUCell, PaperGRU, reverse_words

FAMILIES = ("rnnsearch", "rnnencdec", "seq2seq_lstm")

if "cache" not in Seq2SeqLMOutput.__dataclass_fields__:  # older releases call it past_key_values
    raise ImportError(f"modeling_fairseq_rnn needs a transformers whose generate() hands models their state as "
                      f"`cache` (tested with 5.24), not {transformers.__version__}")


class FairseqRNNConfig(PreTrainedConfig):
    """Sizes and options of a fairseq-plugins recurrent model (fairseq's flag names, ``-`` as ``_``).

    ``vocab_size`` is the target dictionary's size, ``source_vocab_size`` the source's; the
    special ids are fairseq's (``</s>`` ends every source and starts decoding).
    """

    model_type = "fairseq_rnn"

    family: str = "rnnsearch"
    vocab_size: int = 8
    source_vocab_size: int = 8
    encoder_embed_dim: int = 32
    encoder_hidden_size: int = 64
    encoder_layers: int = 1
    decoder_embed_dim: int = 32
    decoder_hidden_size: int = 64
    decoder_layers: int = 1
    attention_hidden_size: int = 64  # rnnsearch
    maxout_dim: int = 32  # rnnsearch, rnnencdec
    deep_output_state: str = "current"  # rnnsearch, rnnencdec: s_i ("current") or s_{i-1} ("previous")
    reverse_source: bool = True  # seq2seq_lstm
    dropout: float = 0.0  # training only, where fairseq applies it
    source_pad_token_id: int = 1
    source_eos_token_id: int = 2
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 2
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = False
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.deep_output_state not in ("current", "previous"):
            raise ValueError(f"deep_output_state {self.deep_output_state!r} is not 'current' or 'previous'")
        super().__post_init__(**kwargs)


@dataclass
class FairseqRNNEncoderOutput(ModelOutput):
    """What the decoder starts from. ``last_hidden_state``: rnnsearch's annotations
    ``h_j = [→h_j; ←h_j]`` (B, S, 2n); rnnencdec's ``c`` (B, 1, n); seq2seq_lstm's top-layer final
    h (B, 1, H). ``padding_mask`` (B, S): True at padding. ``initial_input``: ``←h_1`` or ``c``
    (B, n); seq2seq_lstm: the final h of every layer (B, L, H), ``initial_cell`` its c."""

    last_hidden_state: Optional[Tensor] = None
    padding_mask: Optional[Tensor] = None
    initial_input: Optional[Tensor] = None
    initial_cell: Optional[Tensor] = None


class RecurrentState:
    """The decoder's cache: batch-first tensors by name (``s``; rnnsearch's ``h``, ``U_a_h``,
    ``padding_mask``; rnnencdec's ``c``, ``C_c``; seq2seq_lstm's ``h``, ``c`` (B, L, H))."""

    def __init__(self, tensors: Dict[str, Tensor]):
        self.tensors = tensors

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Rows in ``beam_idx``'s order, in place (beam search: the hypotheses kept)."""
        self.tensors = {k: v.index_select(0, beam_idx.to(v.device)) for k, v in self.tensors.items()}

    def __repr__(self):
        return f"RecurrentState({', '.join(f'{k}: {tuple(v.shape)}' for k, v in self.tensors.items())})"


class GRUEncoder(nn.Module):
    """Embedding, then ``encoder_layers`` GRU layers (dropout between): bidirectional for
    rnnsearch (annotations and ``←h_1``), one direction and ``c = tanh(V h_T)`` for rnnencdec."""

    main_input_name = "input_ids"  # generate() asks the encoder

    def __init__(self, config: FairseqRNNConfig):
        super().__init__()
        self.config = config
        self.attention = config.family == "rnnsearch"
        D, n = (2 if self.attention else 1), config.encoder_hidden_size
        self.embed_tokens = nn.Embedding(config.source_vocab_size, config.encoder_embed_dim,
                                         config.source_pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            PaperGRU(config.encoder_embed_dim if k == 0 else D * n, n, D) for k in range(config.encoder_layers)
        )
        if not self.attention:
            self.V = nn.Linear(n, n)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, **kwargs) -> FairseqRNNEncoderOutput:
        padding_mask = padding_mask_of(input_ids, attention_mask, self.config.source_pad_token_id)
        h = self.dropout(self.embed_tokens(input_ids))
        for k, layer in enumerate(self.layers):
            h, finals = layer(self.dropout(h) if k > 0 else h, padding_mask)
        if self.attention:
            return FairseqRNNEncoderOutput(last_hidden_state=h, padding_mask=padding_mask, initial_input=finals[1])
        c = torch.tanh(self.V(finals[0]))  # c = tanh(V h_T)
        return FairseqRNNEncoderOutput(last_hidden_state=c.unsqueeze(1), padding_mask=padding_mask, initial_input=c)


class AttentionContext(nn.Module):
    """Holds the alignment model under the name fairseq-plugins gives it (``decoder.context.attention``)."""

    def __init__(self, query_size: int, annotation_size: int, hidden_size: int):
        super().__init__()
        self.attention = AdditiveAttention(query_size, annotation_size, hidden_size)


class ConditionalGRUDecoder(nn.Module):
    """The decoder of rnnsearch and rnnencdec: ``s_0 = tanh(W_s x_0)``, the conditional GRU, the
    maxout deep output ``t_i = maxout(U_o s + V_o E y_{i-1} + C_o c_i)`` and ``softmax(W_o t_i)``."""

    def __init__(self, config: FairseqRNNConfig):
        super().__init__()
        self.attention = config.family == "rnnsearch"
        self.use_previous_state = config.deep_output_state == "previous"
        n, m, l = config.decoder_hidden_size, config.decoder_embed_dim, config.maxout_dim
        k = 2 * config.encoder_hidden_size if self.attention else config.encoder_hidden_size  # size of c_i
        self.embed_tokens = nn.Embedding(config.vocab_size, m, config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        if self.attention:
            self.context = AttentionContext(n, k, config.attention_hidden_size)
        self.W_s = nn.Linear(config.encoder_hidden_size, n)
        self.cell = ConditionalGRUCell(m, n, k)
        self.U_o = nn.Linear(n, 2 * l)
        self.V_o = nn.Linear(m, 2 * l, bias=False)
        self.C_o = nn.Linear(k, 2 * l, bias=False)
        self.W_o = nn.Linear(l, config.vocab_size)

    def initial_state(self, encoder_out: FairseqRNNEncoderOutput) -> Dict[str, Tensor]:
        state = {"s": torch.tanh(self.W_s(encoder_out.initial_input))}  # s_0 = tanh(W_s x_0)
        if self.attention:
            h = encoder_out.last_hidden_state
            state.update(h=h, U_a_h=self.context.attention.U_a(h), padding_mask=encoder_out.padding_mask)
        else:
            c = encoder_out.initial_input
            state.update(c=c, C_c=self.cell.C(c))  # C c once per sentence
        return state

    def forward(self, tokens: Tensor, state: Dict[str, Tensor]) -> Tuple[Tensor, Dict[str, Tensor], Optional[Tensor]]:
        """tokens (B, T) y_{i-1} -> logits (B, T, V), the state after them, α (B, T, S) or None."""
        Ey = self.dropout(self.embed_tokens(tokens))  # (B, T, m)
        W_Ey = self.cell.W(Ey)  # (B, T, 3n)
        s = state["s"]
        states, contexts, alphas = [], [], []
        for i in range(tokens.size(1)):
            if self.attention:
                c, alpha = self.context.attention(s, state["U_a_h"], state["h"], state["padding_mask"])
                C_c = self.cell.C(c)
                alphas.append(alpha)
            else:
                c, C_c = state["c"], state["C_c"]
            s_next = self.cell(W_Ey[:, i], C_c, s)
            states.append(s if self.use_previous_state else s_next)
            contexts.append(c)
            s = s_next
        t_tilde = self.U_o(torch.stack(states, 1)) + self.V_o(Ey) + self.C_o(torch.stack(contexts, 1))
        t = self.dropout(t_tilde.view(*t_tilde.shape[:-1], -1, 2).max(dim=-1).values)  # maxout, pools of 2
        return self.W_o(t), {**state, "s": s}, (torch.stack(alphas, 1) if alphas else None)


def padding_mask_of(input_ids: Tensor, attention_mask: Optional[Tensor], pad: int) -> Tensor:
    """(B, S) True at padding: from ``attention_mask`` when given, else where ``input_ids`` is pad."""
    return input_ids.eq(pad) if attention_mask is None else attention_mask.eq(0)


class LSTMEncoder(nn.Module):
    """Deep LSTM over the (reversed) source; only its final (h, c) of every layer is kept."""

    main_input_name = "input_ids"

    def __init__(self, config: FairseqRNNConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.source_vocab_size, config.encoder_embed_dim,
                                         config.source_pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = nn.LSTM(config.encoder_embed_dim, config.encoder_hidden_size, config.encoder_layers,
                           batch_first=True, dropout=config.dropout if config.encoder_layers > 1 else 0.0)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, **kwargs) -> FairseqRNNEncoderOutput:
        padding_mask = padding_mask_of(input_ids, attention_mask, self.config.source_pad_token_id)
        if self.config.reverse_source:
            input_ids = reverse_words(input_ids, ~padding_mask & input_ids.ne(self.config.source_eos_token_id))
        x = self.dropout(self.embed_tokens(input_ids))  # (B, S, d)
        # each sentence's tokens moved to the front and packed: its final state ignores the padding
        positions = torch.arange(x.size(1), device=x.device)
        front = (padding_mask.long() * x.size(1) + positions).argsort(dim=1)
        x = x.gather(1, front.unsqueeze(2).expand_as(x))
        lengths = (~padding_mask).sum(dim=1).cpu()
        _, (h_n, c_n) = self.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        h_n, c_n = h_n.transpose(0, 1), c_n.transpose(0, 1)  # (B, L, H)
        return FairseqRNNEncoderOutput(last_hidden_state=h_n[:, -1:], padding_mask=padding_mask,
                                       initial_input=h_n, initial_cell=c_n)


class LSTMDecoder(nn.Module):
    def __init__(self, config: FairseqRNNConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.decoder_embed_dim, config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = nn.LSTM(config.decoder_embed_dim, config.decoder_hidden_size, config.decoder_layers,
                           batch_first=True, dropout=config.dropout if config.decoder_layers > 1 else 0.0)
        self.fc_out = nn.Linear(config.decoder_hidden_size, config.vocab_size)

    def initial_state(self, encoder_out: FairseqRNNEncoderOutput) -> Dict[str, Tensor]:
        return {"h": encoder_out.initial_input, "c": encoder_out.initial_cell}  # (B, L, H) each

    def forward(self, tokens: Tensor, state: Dict[str, Tensor]) -> Tuple[Tensor, Dict[str, Tensor], None]:
        x = self.dropout(self.embed_tokens(tokens))
        hc = (state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous())
        x, (h, c) = self.rnn(x, hc)
        return self.fc_out(self.dropout(x)), {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}, None


class FairseqRNNForConditionalGeneration(PreTrainedModel, GenerationMixin):
    config_class = FairseqRNNConfig
    base_model_prefix = "model"  # no such attribute: the model is its own base
    main_input_name = "input_ids"

    def __init__(self, config: FairseqRNNConfig):
        super().__init__(config)
        lstm = config.family == "seq2seq_lstm"
        self.encoder = LSTMEncoder(config) if lstm else GRUEncoder(config)
        self.decoder = LSTMDecoder(config) if lstm else ConditionalGRUDecoder(config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loader, but a weight missing from the folder (or one the model does not
        have) is an error instead of a freshly initialised parameter and a warning."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        wrong = {k: sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
        if wrong:
            raise ValueError(f"{args[0] if args else kwargs.get('pretrained_model_name_or_path')}: "
                             f"the weights do not match the model: {wrong}")
        return (model, info) if want_info else model

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # no key/value cache: forward returns the recurrent state (RecurrentState)

    def _init_weights(self, module):
        if isinstance(module, BatchedLinear):
            init.normal_(module.weight, mean=0.0, std=0.02)
        else:
            super()._init_weights(module)

    def get_encoder(self, modality=None):
        return self.encoder

    def get_input_embeddings(self):
        return self.encoder.embed_tokens

    def get_output_embeddings(self):
        return self.decoder.fc_out if self.config.family == "seq2seq_lstm" else self.decoder.W_o

    def forward(
        self,
        input_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        decoder_input_ids: Optional[Tensor] = None,
        encoder_outputs: Optional[FairseqRNNEncoderOutput] = None,
        cache: Optional[RecurrentState] = None,
        labels: Optional[Tensor] = None,
        use_cache: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ):
        """Logits (B, T, V) of ``decoder_input_ids`` (B, T) — the tokens after ``cache``'s, or the
        whole prefix from ``decoder_start_token_id`` when there is no cache. ``labels`` (B, T): the
        cross-entropy loss (-100 ignored); ``decoder_input_ids`` default to them shifted right."""
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        if decoder_input_ids is None and labels is not None:
            decoder_input_ids = labels.new_full(labels.shape, self.config.decoder_start_token_id)
            decoder_input_ids[:, 1:] = labels[:, :-1].masked_fill(labels[:, :-1].eq(-100), self.config.pad_token_id)
        state = cache.tensors if cache is not None else self.decoder.initial_state(encoder_outputs)
        logits, state, alpha = self.decoder(decoder_input_ids, state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=-100)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        output = Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=RecurrentState(state) if use_cache else None,
            cross_attentions=(alpha.unsqueeze(1),) if output_attentions and alpha is not None else None,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        )
        return output if return_dict is not False else output.to_tuple()


__all__ = ["FairseqRNNConfig", "FairseqRNNForConditionalGeneration"]
