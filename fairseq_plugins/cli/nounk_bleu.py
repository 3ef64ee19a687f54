"""BLEU on all sentences and on the No-UNK subset (Bahdanau et al. 2015, Table 1).

    fairseq-plugins-nounk-bleu --gen RNNsearch=gen.txt --src-vocab data-bin/dict.en.txt \\
        --tgt-vocab data-bin/dict.fr.txt --top 30000 --out nounk

The computation is in :mod:`fairseq_plugins.analysis.nounk_bleu`.
"""
from fairseq_plugins.analysis import nounk_bleu
from fairseq_plugins.cli import common


def get_parser():
    parser = common.ArgumentParser(prog="fairseq-plugins-nounk-bleu", description=__doc__.split("\n")[0])
    common.add_system_args(parser, src_help="plain source file (with --hyp)")
    parser.add_argument("--src-vocab", metavar="FILE",
                        help="source vocabulary: fairseq dict.<src>.txt or one word per line")
    parser.add_argument("--tgt-vocab", metavar="FILE",
                        help="target vocabulary: fairseq dict.<tgt>.txt or one word per line")
    parser.add_argument("--top", type=int, metavar="N",
                        help="keep only the first N vocabulary entries (a shortlist, e.g. 30000)")
    parser.add_argument("--unk", default="<unk>",
                        help="unknown-word token, for a side without vocabulary (default <unk>)")
    parser.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer for BLEU (default 13a)")
    common.add_out_arg(parser, "nounk_bleu")
    return parser


def main(argv=None):
    common.cli_main(get_parser, nounk_bleu.run, argv)


if __name__ == "__main__":
    main()
