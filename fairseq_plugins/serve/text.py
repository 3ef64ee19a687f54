"""Raw text <-> the subword tokens a model reads and writes, with fairseq's own encoders
(``--tokenizer moses``: sacremoses; ``--bpe subword_nmt`` / ``sentencepiece``), as
``fairseq-interactive`` and the hub interface apply them."""
from argparse import Namespace
from typing import List, Optional

from fairseq.data import encoders

from fairseq_plugins.errors import ConfigError


class TextPipeline:
    """``encode``: raw sentence -> source tokens; ``decode``: target tokens -> raw sentence."""

    def __init__(self, tokenizer=None, bpe=None, description: Optional[dict] = None):
        self.tokenizer, self.bpe = tokenizer, bpe
        self.description = description or {"tokenizer": None, "bpe": None}

    @classmethod
    def from_options(cls, options: Namespace) -> "TextPipeline":
        """Build from fairseq's flags (``tokenizer``, ``bpe`` and their own options)."""
        if options.bpe == "subword_nmt" and not options.bpe_codes:
            raise ConfigError("--bpe subword_nmt needs --bpe-codes FILE")
        if options.bpe == "sentencepiece" and not options.sentencepiece_model:
            raise ConfigError("--bpe sentencepiece needs --sentencepiece-model FILE")
        try:
            tokenizer = encoders.build_tokenizer(options)
            bpe = encoders.build_bpe(options)
        except (OSError, RuntimeError) as e:  # a missing or unreadable codes / model file
            raise ConfigError(f"--bpe {options.bpe}: {e}") from None
        description = {"tokenizer": options.tokenizer, "bpe": options.bpe}
        return cls(tokenizer, bpe, description)

    def encode(self, text: str) -> List[str]:
        if self.tokenizer is not None:
            text = self.tokenizer.encode(text)
        if self.bpe is not None:
            text = self.bpe.encode(text)
        return text.split()

    def decode(self, tokens: List[str]) -> str:
        text = " ".join(tokens)
        if self.bpe is not None:
            text = self.bpe.decode(text)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(text)
        return text
