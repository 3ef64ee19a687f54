"""Deterministic synthetic translation corpus that behaves like a language pair.

The source language is English-like (adjective before noun, invariant articles, SVO
everywhere); the target is French/German-like:

* adjectives follow the noun and agree with its gender and number;
* the article depends on the noun that follows it ("the man" -> "l' homme",
  "the dog" -> "le chien", "the cats" -> "les chats"), so producing it needs the noun;
* subordinate clauses ("because ...") and relative clauses ("that sees the dog") put
  the verb last, so alignments are non-monotonic;
* coordination and relative clauses push sentences from 5 to 80+ words;
* with ``--rare-rate`` some nouns come from a long tail of thousands of words, which a
  word-level shortlist maps to <unk> (the No-UNK analysis needs them).

Every split has its own seeded random stream, so the same flags always give the
same files: DIR/{train,valid,test}.{src,tgt}, one tokenized sentence per line.
"""
import os
import random

from fairseq_plugins.errors import ConfigError

SPLITS = ("train", "valid", "test")

# Syllables of the two languages are disjoint, so the vocabularies are distinct.
SRC_SYLLABLES = ["ka", "to", "mi", "ru", "sen", "dol", "pa", "vik", "ne", "sho", "bar", "lu", "tek", "wo"]
TGT_SYLLABLES = ["é", "ou", "ar", "ier", "beau", "gne", "quil", "mont", "ail", "fre", "chon", "zé", "oix", "eur"]
TGT_VOWELS = ("a", "e", "é", "i", "o", "u", "ou")


class Lexicon:
    """Paired source/target words drawn from a seeded stream (independent of the split)."""

    def __init__(self, seed, n_nouns=150, n_rare=3000, n_adjs=50, n_verbs=60, n_advs=20):
        rng = random.Random(seed * 7919 + 1)
        used = set()

        def word(syllables, lo, hi):
            while True:
                w = "".join(rng.choice(syllables) for _ in range(rng.randint(lo, hi)))
                if w not in used:
                    used.add(w)
                    return w

        def nouns(n, lo, hi):
            return [(word(SRC_SYLLABLES, lo, hi), word(TGT_SYLLABLES, lo, hi), rng.choice("mf")) for _ in range(n)]

        self.nouns = nouns(n_nouns, 1, 3)
        self.rare_nouns = nouns(n_rare, 3, 4)
        self.adjs = [(word(SRC_SYLLABLES, 2, 3), word(TGT_SYLLABLES, 2, 3)) for _ in range(n_adjs)]
        self.verbs = [(word(SRC_SYLLABLES, 2, 3), word(TGT_SYLLABLES, 2, 3)) for _ in range(n_verbs)]
        self.advs = [(word(SRC_SYLLABLES, 3, 3) + "ly", word(TGT_SYLLABLES, 3, 3) + "ment") for _ in range(n_advs)]


def target_article(definite, gender, plural, noun):
    if plural:
        return "les" if definite else "des"
    if definite:
        return "l'" if noun.startswith(TGT_VOWELS) else ("le" if gender == "m" else "la")
    return "un" if gender == "m" else "une"


class Generator:
    def __init__(self, lexicon, rng, rare_rate):
        self.lex, self.rng, self.rare_rate = lexicon, rng, rare_rate

    def noun_phrase(self, budget):
        """Returns (source words, target words) of one noun phrase."""
        rng = self.rng
        pool = self.lex.rare_nouns if rng.random() < self.rare_rate else self.lex.nouns
        src_noun, tgt_noun, gender = rng.choice(pool)
        plural, definite = rng.random() < 0.3, rng.random() < 0.7
        adjs = [rng.choice(self.lex.adjs) for _ in range(rng.choice((0, 0, 1, 1, 2)))]
        src = ["the" if definite else ("some" if plural else "a")] + [a for a, _ in adjs]
        src.append(src_noun + ("s" if plural else ""))
        # Adjectives follow the noun and agree with gender ("e") and number ("s").
        agreement = ("e" if gender == "f" else "") + ("s" if plural else "")
        tgt = [target_article(definite, gender, plural, tgt_noun), tgt_noun + ("x" if plural else "")]
        tgt += [t + agreement for _, t in adjs]
        if budget > 8 and rng.random() < 0.35:
            # Relative clause, verb-final in the target: "that sees the dog" -> "qui le chien voit".
            verb = rng.choice(self.lex.verbs)
            obj_src, obj_tgt = self.noun_phrase(budget - len(src) - 2)
            src += ["that", verb[0]] + obj_src
            tgt += ["qui"] + obj_tgt + [verb[1]]
        return src, tgt

    def clause(self, budget, subordinate):
        subj_src, subj_tgt = self.noun_phrase(budget)
        verb = self.rng.choice(self.lex.verbs)
        obj_src, obj_tgt = self.noun_phrase(budget - len(subj_src) - 1)
        src = subj_src + [verb[0]] + obj_src
        # Main clauses keep SVO; subordinate clauses move the verb to the end.
        tgt = subj_tgt + (obj_tgt + [verb[1]] if subordinate else [verb[1]] + obj_tgt)
        if self.rng.random() < 0.2:
            adv = self.rng.choice(self.lex.advs)
            src.append(adv[0])
            tgt.append(adv[1])
        return src, tgt

    def sentence(self, min_len, max_len):
        target_len = self.rng.randint(min_len, max_len)
        while True:
            src, tgt = self.clause(target_len, subordinate=False)
            while len(src) < target_len:
                subordinate = self.rng.random() < 0.5
                more_src, more_tgt = self.clause(target_len - len(src), subordinate)
                link = ("because", "parce_que") if subordinate else ("and", "et")
                src += [link[0]] + more_src
                tgt += [link[1]] + more_tgt
            if min_len <= len(src) <= max_len:
                return " ".join(src), " ".join(tgt)
            target_len = self.rng.randint(min_len, max_len)


def write_split(out_dir, split, n, lexicon, seed, min_len, max_len, rare_rate):
    rng = random.Random(f"{seed}-{split}")
    gen = Generator(lexicon, rng, rare_rate)
    pairs = [gen.sentence(min_len, max_len) for _ in range(n)]
    for side, index in (("src", 0), ("tgt", 1)):
        path = os.path.join(out_dir, f"{split}.{side}")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(pair[index] + "\n" for pair in pairs)
        os.replace(path + ".tmp", path)


def write_corpus(out, train=10000, valid=500, test=500, min_len=5, max_len=30, test_max_len=None, rare_rate=0.0,
                 seed=1):
    """Write ``out``/{train,valid,test}.{src,tgt}; impossible settings raise ConfigError before any file is written.

    ``test_max_len`` bounds valid/test sentences (default ``max_len``), e.g. train up to 50 words
    and test up to 80 as Bahdanau et al. do. Returns ``out``.
    """
    test_max = test_max_len if test_max_len is not None else max_len
    if min_len < 5:
        raise ConfigError(f"--min-len {min_len} is below 5, the shortest sentence of the grammar")
    if min_len > min(max_len, test_max):
        raise ConfigError(f"--min-len {min_len} exceeds the maximum length {min(max_len, test_max)}")
    if train <= 0:
        raise ConfigError(f"--train {train}: need at least one training sentence")
    if valid < 0 or test < 0:
        raise ConfigError("--valid/--test must not be negative")
    if not 0.0 <= rare_rate <= 1.0:
        raise ConfigError(f"--rare-rate {rare_rate} is not a probability")
    os.makedirs(out, exist_ok=True)
    lexicon = Lexicon(seed)
    for split, n, split_max in (("train", train, max_len), ("valid", valid, test_max), ("test", test, test_max)):
        write_split(out, split, n, lexicon, seed, min_len, split_max, rare_rate)
    return out


def preprocess_args(raw, dest, joined=True, trainpref=None, srcdict=None, workers=1):
    """``fairseq-preprocess`` flags (without the program) binarizing ``raw``/{train,valid,test}.{src,tgt}.

    ``joined``: one dictionary for both sides (from ``srcdict`` when given, e.g. another
    data-bin's ``dict.src.txt``); ``trainpref``: another training prefix (a filtered copy).
    """
    flags = ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", trainpref or f"{raw}/train",
             "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", dest, "--workers", str(workers)]
    if joined:
        flags.append("--joined-dictionary")
    if srcdict:
        flags += ["--srcdict", srcdict]
    return flags
