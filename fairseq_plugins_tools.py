"""Console entry points of the tools that need no model: score, bleu-by-length, plot-curves,
tokenize, catalog-corpus.

Importing ``fairseq_plugins`` installs the plugin (every patch, every registry), which imports
torch and fairseq: seconds and hundreds of MB before a ``--help``. These tools only read and write
text, so their console scripts start here; while this module is loaded, ``fairseq_plugins`` does
not install the plugin (see its ``__init__``). ``--user-dir fairseq_plugins`` and ``import
fairseq_plugins`` in any other program install everything as before.
"""
import importlib

# console script name: module under fairseq_plugins.cli exposing main()
TOOLS = {
    "fairseq-plugins-score": "score",
    "fairseq-plugins-bleu-by-length": "bleu_by_length",
    "fairseq-plugins-plot-curves": "plot_curves",
    "fairseq-plugins-tokenize": "tokenize",
    "fairseq-plugins-catalog-corpus": "catalog_corpus",
}


def _main(module):
    """Run ``fairseq_plugins.cli.<module>.main()``; ``fairseq_plugins`` sees this module loaded and installs nothing."""
    return importlib.import_module(f"fairseq_plugins.cli.{module}").main()


def score():
    return _main("score")


def bleu_by_length():
    return _main("bleu_by_length")


def plot_curves():
    return _main("plot_curves")


def tokenize():
    return _main("tokenize")


def catalog_corpus():
    return _main("catalog_corpus")
