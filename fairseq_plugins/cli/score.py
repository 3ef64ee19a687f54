"""SacreBLEU (signature printed), chrF and the Transformer paper's compound-split tokenized BLEU.

The computation is in :mod:`fairseq_plugins.analysis.score`.
"""
from fairseq_plugins.analysis import score
from fairseq_plugins.cli import common


def get_parser():
    parser = common.ArgumentParser(prog="fairseq-plugins-score", description=__doc__.split("\n")[0])
    common.add_system_args(parser, src_help=None)
    parser.add_argument("--lang", default="de",
                        help="target language for Moses (de)tokenization (default de, the paper's En-De)")
    parser.add_argument("--input-tokenized", action="store_true",
                        help="hypotheses/references are Moses-tokenized: detokenize them for SacreBLEU "
                        "and chrF, use them as they are for the tokenized BLEU")
    common.add_out_arg(parser, "score")
    return parser


def main(argv=None):
    common.cli_main(get_parser, score.run, argv)


if __name__ == "__main__":
    main()
