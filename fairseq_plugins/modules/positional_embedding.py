"""Positional encodings of "Attention Is All You Need" (Vaswani et al., 2017, §3.5).

Three tables, looked up the same way:

* ``"paper"`` (default): ``PE(pos, 2i) = sin(pos / 10000^(2i/d))`` on even dimensions and
  ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`` on odd ones, with ``pos = 0`` for the first
  token of a sentence.
* ``"fairseq"``: fairseq's built-in table (tensor2tensor's): all sines, then all cosines,
  frequencies ``10000^(-i/(d/2 - 1))`` instead of ``10000^(-2i/d)``, and the first token
  at ``pos = padding_idx + 1``. Checkpoints converted from fairseq's ``transformer`` use it,
  so that they compute exactly what they computed there.
* ``"learned"``: a trained table (fairseq's ``--*-learned-pos``), same rows as fairseq's.

Rows follow fairseq's numbering: a token that is the p-th (from 0) non-pad token of its
sentence reads row ``padding_idx + 1 + p``; padding reads the all-zero row ``padding_idx``.
Left-padded sentences therefore get the same encodings as unpadded ones.
"""
import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import SinusoidalPositionalEmbedding
from torch import Tensor, nn

from fairseq_plugins.errors import ConfigError

KINDS = ("paper", "fairseq", "learned")


def paper_sinusoids(num_positions: int, d_model: int) -> Tensor:
    """[num_positions, d_model] table of §3.5, rows pos = 0 .. num_positions - 1."""
    pos = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # [P, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # [ceil(d/2)]: the "2i"
    angle = pos / 10000 ** (two_i / d_model)  # pos / 10000^(2i/d_model)
    pe = torch.zeros(num_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)  # PE(pos, 2i)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # PE(pos, 2i+1)
    return pe.float()


class PositionalEncoding(nn.Module):
    """Adds position information to token embeddings; ``weight`` is [rows, d_model].

    Args:
        max_positions: the longest sentence (in tokens, EOS included) the model accepts.
        flag: the command-line flag that sets ``max_positions``, named in errors.
    """

    def __init__(self, max_positions: int, d_model: int, padding_idx: int, kind: str = "paper",
                 flag: str = "--max-positions"):
        super().__init__()
        if kind not in KINDS:
            raise ConfigError(f"positional encoding kind {kind!r} is not one of {KINDS}")
        self.max_positions = max_positions
        self.padding_idx = padding_idx
        self.flag = flag
        rows = max_positions + padding_idx + 1
        if kind == "learned":
            # fairseq's LearnedPositionalEmbedding: same rows, same initialisation
            self.weight = nn.Parameter(torch.empty(rows, d_model).normal_(0, d_model**-0.5))
            with torch.no_grad():
                self.weight[padding_idx].zero_()
        elif kind == "fairseq":
            self.register_buffer(
                "weight", SinusoidalPositionalEmbedding.get_embedding(rows, d_model, padding_idx),
                persistent=False)
        else:
            table = torch.zeros(rows, d_model)
            table[padding_idx + 1:] = paper_sinusoids(max_positions, d_model)
            self.register_buffer("weight", table, persistent=False)

    def _too_long(self, length: int):
        return ConfigError(
            f"a sentence of {length} tokens (EOS included) is longer than {self.flag} "
            f"{self.max_positions}; raise {self.flag} or drop the sentence")

    def forward(self, tokens: Tensor, incremental: bool = False) -> Tensor:
        """tokens: [B, T] -> [B, T, d_model]; incremental: [B, 1, d_model] for token T only."""
        bsz, length = tokens.shape
        if incremental:
            # one decoding step: the T-th token of unpadded prefixes (as fairseq's)
            if length > self.max_positions:
                raise self._too_long(length)
            return self.weight[self.padding_idx + length].expand(bsz, 1, -1)
        if length > self.max_positions:
            longest = int(tokens.ne(self.padding_idx).sum(dim=1).max())
            if longest > self.max_positions:
                raise self._too_long(longest)
        rows = utils.make_positions(tokens, self.padding_idx)  # padding_idx + 1 + p, pad -> pad
        return F.embedding(rows, self.weight)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, padding_idx={self.padding_idx}"


def build_positional_encoding(max_positions: int, d_model: int, padding_idx: int, learned: bool,
                              fairseq_layout: bool, flag: str) -> PositionalEncoding:
    kind = "learned" if learned else ("fairseq" if fairseq_layout else "paper")
    return PositionalEncoding(max_positions, d_model, padding_idx, kind, flag)


