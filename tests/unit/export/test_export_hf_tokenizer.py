"""The exported folder's tokenizer segments raw text exactly as fairseq's own encoders do.

Oracle: ``fairseq.data.encoders`` built in this process as ``fairseq-interactive --tokenizer moses
--bpe subword_nmt`` and ``--bpe sentencepiece`` build them, then the source dictionary's
``encode_line``; decoding is the hub's (``Dictionary.string``, ``bpe.decode``, ``tokenizer.decode``).
Text: this machine's gettext catalogs (English msgids, German, Russian, Greek, Arabic, Japanese and
Chinese msgstrs), with camel case, digits, punctuation runs, URLs, non-Latin scripts and the
catalogs' own control characters (``msgctxt\\x04msgid``: ``Stock label\\x04Warning``, the word a
user saw split in two). BPE codes and the sentencepiece model are learned here on that text.
"""
import glob
import os
import re
from argparse import Namespace
from types import SimpleNamespace

import pytest
from fairseq.data import Dictionary, encoders
from transformers import AutoTokenizer

from fairseq_plugins.data.catalogs import collect
from fairseq_plugins.data.subwords import learn_apply_bpe, learn_apply_sentencepiece
from fairseq_plugins.export.hf import write_tokenizer

LOCALE = "/usr/share/locale"
LANGUAGES = ("de", "ru", "el", "ar", "ja", "zh_CN")
KINDS = {  # what the text must hold, each at least 10 times
    "camel case": re.compile(r"[a-z][A-Z]"),
    "digits": re.compile(r"\d"),
    "punctuation run": re.compile(r"[^\w\s]{2,}"),
    "URL": re.compile(r"https?://\S+"),
    "non-Latin script": re.compile(r"[\u0370-\u03ff\u0400-\u04ff\u0600-\u06ff\u3040-\u30ff\u4e00-\u9fff]"),
    "control character": re.compile(r"[\x00-\x08\x0b-\x1f]"),
}
PER_KIND, PLAIN = 300, 300
SOURCE, TARGET = "en", "de"


def catalog_lines():
    """The lines of every msgid (English) and msgstr of the LANGUAGES' catalogs, first seen first."""
    if not all(glob.glob(os.path.join(LOCALE, lang, "LC_MESSAGES", "*.mo")) for lang in LANGUAGES):
        pytest.skip(f"no gettext catalogs in {LOCALE}/{{{','.join(LANGUAGES)}}}/LC_MESSAGES on this machine")
    lines = {}
    for lang in LANGUAGES:
        for msgid, msgstr in collect(lang, [LOCALE]).pairs:
            for line in (msgid + "\n" + msgstr).split("\n"):
                if line.strip() and len(line) <= 300:
                    lines.setdefault(line, None)
    return list(lines)


@pytest.fixture(scope="module")
def text():
    """PER_KIND lines of each kind and PLAIN others: a few thousand lines."""
    lines = catalog_lines()
    kept = [line for pattern in KINDS.values() for line in [s for s in lines if pattern.search(s)][:PER_KIND]]
    kept = list(dict.fromkeys(kept + lines[:PLAIN]))
    for kind, pattern in KINDS.items():
        assert sum(bool(pattern.search(line)) for line in kept) >= 10, kind
    assert "Stock label\x04Warning" in kept
    return kept


def fairseq_encoders(bpe, path):
    """fairseq's tokenizer and BPE objects, from the flags fairseq-interactive parses."""
    if bpe == "subword_nmt":
        tokenizer = encoders.build_tokenizer(Namespace(tokenizer="moses", source_lang=SOURCE, target_lang=TARGET,
                                                       moses_no_dash_splits=False, moses_no_escape=False))
        subwords = encoders.build_bpe(Namespace(bpe="subword_nmt", bpe_codes=path, bpe_separator="@@"))
    else:
        tokenizer = None
        subwords = encoders.build_bpe(Namespace(bpe="sentencepiece", sentencepiece_model=path,
                                                sentencepiece_enable_sampling=False, sentencepiece_alpha=None))
    return tokenizer, subwords


def fairseq_line(tokenizer, subwords, line):
    """What fairseq-interactive hands the dictionary: encode_fn(line)."""
    if tokenizer is not None:
        line = tokenizer.encode(line)
    return subwords.encode(line)


@pytest.fixture(scope="module", params=["subword_nmt", "sentencepiece"])
def folder(request, text, tmp_path_factory):
    """(folder tokenizer, fairseq's tokenizer, fairseq's BPE, dictionary): codes or a model learned on
    the text, a dictionary of the first half's symbols (the second half has unknown ones)."""
    root = tmp_path_factory.mktemp(f"tokenizer-{request.param}")
    if request.param == "subword_nmt":
        moses = encoders.build_tokenizer(Namespace(tokenizer="moses", source_lang=SOURCE, target_lang=TARGET,
                                                   moses_no_dash_splits=False, moses_no_escape=False))
        learn_apply_bpe([moses.encode(line) for line in text], {}, 1000, str(root / "bpe.codes"))
        path, files = str(root / "bpe.codes"), {"bpe_codes": str(root / "bpe.codes")}
    else:
        learn_apply_sentencepiece(text, {}, 1000, str(root / "spm"))
        path, files = str(root / "spm.model"), {"sentencepiece_model": str(root / "spm.model")}
    tokenizer, subwords = fairseq_encoders(request.param, path)
    dictionary = Dictionary()
    for line in text[: len(text) // 2]:
        dictionary.encode_line(fairseq_line(tokenizer, subwords, line), add_if_not_exist=True)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary,
                           cfg=SimpleNamespace(source_lang=SOURCE, target_lang=TARGET))
    write_tokenizer(task, str(root / "model"), **files)  # what fairseq-plugins-export-hf writes
    return AutoTokenizer.from_pretrained(str(root / "model"), trust_remote_code=True), tokenizer, subwords, dictionary


def test_tokens_and_ids_are_fairseqs(folder, text):
    exported, tokenizer, subwords, dictionary = folder
    differ = []
    for line in text:
        encoded = fairseq_line(tokenizer, subwords, line)
        ids = dictionary.encode_line(encoded, add_if_not_exist=False).tolist()  # </s> appended
        got = exported(line)["input_ids"]
        if exported.tokenize(line) != encoded.split() or got != ids:
            differ.append((line, exported.tokenize(line), encoded.split()))
    assert not differ, f"{len(differ)}/{len(text)} lines differ, e.g. {differ[:3]}"
    assert any(dictionary.unk() in dictionary.encode_line(fairseq_line(tokenizer, subwords, line),
                                                          add_if_not_exist=False).tolist() for line in text)


def test_decoding_is_the_hubs(folder, text):
    exported, tokenizer, subwords, dictionary = folder
    differ = []
    for line in text:
        ids = dictionary.encode_line(fairseq_line(tokenizer, subwords, line), add_if_not_exist=False)
        expected = subwords.decode(dictionary.string(ids))  # GeneratorHubInterface.decode
        if tokenizer is not None:
            expected = tokenizer.decode(expected)
        if exported.decode(ids.tolist(), skip_special_tokens=True) != expected:
            differ.append((line, exported.decode(ids.tolist(), skip_special_tokens=True), expected))
    assert not differ, f"{len(differ)}/{len(text)} lines differ, e.g. {differ[:3]}"

