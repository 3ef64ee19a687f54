"""fairseq-plugins-export-hf CHECKPOINT OUT_DIR [--data DIR] [--force] [--bpe-codes FILE | --sentencepiece-model FILE]
[--source-lang L] [--target-lang L] [--no-moses|--no-aggressive|--no-escape] [--beam N] [--max-len-b N]
[--lenpen P]"""
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError


def get_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fairseq-plugins-export-hf",
        description="Write a checkpoint as a Hugging Face transformers model folder (config.json, "
                    "model.safetensors, generation_config.json, tokenizer files) that "
                    "pipeline('translation', model=OUT_DIR, trust_remote_code=True) runs on raw text.")
    parser.add_argument("checkpoint", help="checkpoint written by fairseq-train (vaswani_transformer, rnnsearch, "
                                           "rnnencdec or seq2seq_lstm)")
    parser.add_argument("out_dir", help="the transformers model folder to write")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it is a transformers model folder")
    parser.add_argument("--data", metavar="DIR", help="directory with dict.SRC.txt/dict.TGT.txt (default: the "
                                                      "checkpoint's training data directory)")
    text = parser.add_argument_group(
        "preprocessing, as fairseq-interactive's --tokenizer moses --bpe subword_nmt|sentencepiece (recorded in "
        "the tokenizer)")
    subword = text.add_mutually_exclusive_group()
    subword.add_argument("--bpe-codes", metavar="FILE", help="subword-nmt BPE codes applied after Moses tokenization")
    subword.add_argument("--sentencepiece-model", metavar="FILE",
                         help="sentencepiece model applied to raw text (no Moses step, as "
                              "fairseq-plugins-tokenize spm-encode)")
    text.add_argument("--source-lang", metavar="L", help="Moses language of the source (default: the task's)")
    text.add_argument("--target-lang", metavar="L", help="Moses language of the target (default: the task's)")
    text.add_argument("--no-moses", dest="moses", action="store_false",
                      help="no Moses tokenization/detokenization (text split on spaces only; no --tokenizer)")
    text.add_argument("--no-aggressive", dest="aggressive", action="store_false",
                      help="fairseq's --moses-no-dash-splits")
    text.add_argument("--no-escape", dest="escape", action="store_false", help="fairseq's --moses-no-escape")
    gen = parser.add_argument_group("generation_config.json (fairseq-generate's flags and defaults)")
    gen.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    gen.add_argument("--max-len-a", type=float, default=0.0, help="must be 0: one length limit for all sentences")
    gen.add_argument("--max-len-b", type=int, default=200, help="at most this many tokens before </s> (default 200)")
    gen.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default 1)")
    return parser


def body(args):
    from fairseq_plugins.export.hf import export  # first: it keeps an unloadable torchaudio from transformers

    try:
        import safetensors  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError('transformers is not installed: pip install "fairseq-plugins[hf]"') from None

    export(args.checkpoint, args.out_dir, data=args.data, force=args.force, bpe_codes=args.bpe_codes,
           sentencepiece_model=args.sentencepiece_model, source_lang=args.source_lang, target_lang=args.target_lang,
           moses=args.moses, aggressive=args.aggressive, escape=args.escape,
           beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b, lenpen=args.lenpen)
    print(f"wrote {args.out_dir}")


def main(argv=None):
    cli_main(get_parser, body, argv)


if __name__ == "__main__":
    main()
