"""The tokenizer of a model exported by ``fairseq-plugins-export-hf`` (shipped in its folder).

Raw text is segmented exactly as ``fairseq-interactive`` and fairseq's hub interface segment it,
with the same libraries called the same way as fairseq's encoders (``fairseq.data.encoders``;
fairseq itself is not needed to load the folder):

* ``--tokenizer moses``: sacremoses' ``MosesTokenizer(SRC).tokenize(text, aggressive_dash_splits,
  return_str=True, escape)`` (``--moses-no-dash-splits`` / ``--moses-no-escape`` are
  ``aggressive=False`` / ``escape=False``); no punctuation normalisation, no control-character
  removal: fairseq does neither;
* ``--bpe subword_nmt``: subword-nmt's ``BPE(codes).process_line`` (``@@`` joins), or ``--bpe
  sentencepiece``: ``SentencePieceProcessor.encode(text, out_type=str)`` on the raw text (no Moses step);
* fairseq's dictionary: the line split on whitespace (``tokenize_line``), its ids
  (``vocab.src.json`` / ``vocab.tgt.json`` list the symbols in id order, special symbols
  included), unknown symbols to ``<unk>``, ``</s>`` appended.

Decoding is the hub's ``decode``: the target symbols (``</s>`` and padding dropped, ``<unk>``
kept), the BPE removed (``@@ `` or sentencepiece's), then ``MosesDetokenizer(TGT).detokenize``.
"""
import json
import os
import shutil

from transformers import PreTrainedTokenizer

SUBWORD_NMT, SENTENCEPIECE = "subword_nmt", "sentencepiece"
BPE_SEPARATOR = "@@"  # fairseq's --bpe-separator default


def _symbols(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class FairseqPluginsTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"source_vocab": "vocab.src.json", "target_vocab": "vocab.tgt.json",
                         "bpe_codes": "bpe.codes", "sentencepiece_model": "sentencepiece.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, source_vocab, target_vocab, bpe_codes=None, sentencepiece_model=None, source_lang="en",
                 target_lang="en", moses=True, aggressive=True, escape=True, **kwargs):
        self.source_symbols, self.target_symbols = _symbols(source_vocab), _symbols(target_vocab)
        # fairseq's Dictionary.indices: a symbol listed twice (#fairseq:overwrite) keeps its last id
        self.source_indices = {symbol: i for i, symbol in enumerate(self.source_symbols)}
        self.files = {"source_vocab": source_vocab, "target_vocab": target_vocab, "bpe_codes": bpe_codes,
                      "sentencepiece_model": sentencepiece_model}
        self.moses, self.aggressive, self.escape = moses, aggressive, escape
        self.source_lang, self.target_lang = source_lang, target_lang
        self._bpe = self._spm = self._moses = None
        if bpe_codes is not None:
            from subword_nmt.apply_bpe import BPE

            with open(bpe_codes, encoding="utf-8") as codes:
                self._bpe = BPE(codes, separator=BPE_SEPARATOR)
        if sentencepiece_model is not None:
            import sentencepiece

            self._spm = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model)
        if moses:
            from sacremoses import MosesDetokenizer, MosesTokenizer

            self._moses = (MosesTokenizer(lang=source_lang), MosesDetokenizer(lang=target_lang))
        # fairseq's special symbols; decoding never applies transformers' space clean-up
        for name, value in (("bos_token", "<s>"), ("pad_token", "<pad>"), ("eos_token", "</s>"),
                            ("unk_token", "<unk>"), ("clean_up_tokenization_spaces", False),
                            ("special_tokens_pattern", "eos")):
            kwargs.setdefault(name, value)
        super().__init__(source_lang=source_lang, target_lang=target_lang, moses=moses, aggressive=aggressive,
                         escape=escape, **kwargs)

    @property
    def vocab_size(self):
        return len(self.source_symbols)

    def get_vocab(self):
        return dict(self.source_indices)

    def preprocess(self, text):
        """Raw text -> the line fairseq's encoders give (``--tokenizer moses``, then ``--bpe``)."""
        if self._moses is not None:
            text = self._moses[0].tokenize(text, aggressive_dash_splits=self.aggressive, return_str=True,
                                           escape=self.escape)
        if self._bpe is not None:
            text = self._bpe.process_line(text)
        if self._spm is not None:
            text = " ".join(self._spm.encode(text, out_type=str))
        return text

    def tokenize(self, text, **kwargs):
        return self.preprocess(text).split()  # fairseq's tokenize_line; no special-token splitting

    def _tokenize(self, text, **kwargs):
        return self.tokenize(text)

    def _convert_token_to_id(self, token):
        return self.source_indices.get(token, self.source_indices["<unk>"])

    def _convert_id_to_token(self, index):
        return self.target_symbols[index]  # ids to text are outputs: the target dictionary

    def postprocess(self, symbols):
        """Target symbols -> text, as the hub's ``decode``: the BPE removed, then the Moses detokenizer."""
        text = " ".join(symbols)
        if self._bpe is not None:
            text = (text + " ").replace(BPE_SEPARATOR + " ", "").rstrip()
        if self._spm is not None:
            text = text.replace(" ", "").replace("\u2581", " ").strip()
        if self._moses is not None:
            text = self._moses[1].detokenize(text.split())
        return text

    def convert_tokens_to_string(self, tokens):
        return self.postprocess(tokens)

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs):
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        dropped = {self.eos_token_id, self.pad_token_id} if skip_special_tokens else set()
        return self.postprocess([self._convert_id_to_token(int(i)) for i in token_ids if int(i) not in dropped])

    def save_vocabulary(self, save_directory, filename_prefix=None):
        saved = []
        for name, path in self.files.items():
            if path is None:
                continue
            target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "")
                                  + self.vocab_files_names[name])
            if os.path.abspath(path) != os.path.abspath(target):
                shutil.copyfile(path, target)
            saved.append(target)
        return tuple(saved)
