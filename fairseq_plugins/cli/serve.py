"""Serve a model over HTTP: translations, n-best lists and alignments, with dynamic batching.

    fairseq-plugins-serve MODEL [--port 8080] [--host 127.0.0.1] [--max-batch-tokens N]
                          [--max-delay-ms D] [--workers W] [--tokenizer moses --bpe ...]

MODEL is a CTranslate2 folder written by ``fairseq-plugins-export-ctranslate2``, an ONNX folder written
by ``fairseq-plugins-export-onnx`` or a checkpoint
of any family. The API and the page: :mod:`fairseq_plugins.serve.app`.
"""
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.serve.app import Limits
from fairseq_plugins.serve.server import serve


def get_parser():
    parser = ArgumentParser(prog="fairseq-plugins-serve", description=__doc__.split("\n")[0])
    parser.add_argument("model", metavar="MODEL", help="a CTranslate2 folder, an ONNX folder or a fairseq checkpoint file")
    parser.add_argument("--data", help="dictionaries of a checkpoint (default: its training data directory)")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this host only)")
    parser.add_argument("--port", type=int, default=8080, help="default 8080")
    batching = parser.add_argument_group("batching")
    batching.add_argument("--max-batch-tokens", type=int, default=4096,
                          help="most padded source tokens (sentences x longest, </s> counted) per batch; "
                          "a longer sentence goes alone (default 4096)")
    batching.add_argument("--max-delay-ms", type=float, default=10,
                          help="longest wait of a sentence for others to batch with (default 10)")
    batching.add_argument("--workers", type=int, default=1, help="batches decoded at once, one thread each (default 1)")
    batching.add_argument("--threads", type=int, default=1, help="intra-op threads per batch (default 1)")
    text = parser.add_argument_group(
        "preprocessing (fairseq's flags; a checkpoint's own --tokenizer/--bpe are used when none is given)")
    text.add_argument("--tokenizer", choices=["moses", "space"], help="moses: sacremoses, as fairseq's")
    text.add_argument("--source-lang", default="en", help="Moses tokenizer language (default en)")
    text.add_argument("--target-lang", default="en", help="Moses detokenizer language (default en)")
    text.add_argument("--moses-no-dash-splits", action="store_true", help="Moses: do not split hyphens")
    text.add_argument("--moses-no-escape", action="store_true", help="Moses: do not escape & < > ' \" etc.")
    text.add_argument("--bpe", choices=["subword_nmt", "sentencepiece"], help="subword model")
    text.add_argument("--bpe-codes", help="subword-nmt codes file")
    text.add_argument("--bpe-separator", default="@@", help="subword-nmt separator (default @@)")
    text.add_argument("--sentencepiece-model", help="sentencepiece .model file")
    limits = parser.add_argument_group("limits (a request above one is refused with 400)")
    limits.add_argument("--max-chars", type=int, default=Limits.max_chars, help="characters per sentence")
    limits.add_argument("--max-source-tokens", type=int, default=Limits.max_source_tokens,
                        help="tokens per sentence after tokenization and BPE")
    limits.add_argument("--max-sentences", type=int, default=Limits.max_sentences, help="sentences per request")
    limits.add_argument("--max-beam", type=int, default=Limits.max_beam, help="largest beam")
    parser.add_argument("--graceful-timeout", type=float, default=60,
                        help="on SIGTERM, seconds the requests in flight have to finish (default 60)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv=None):
    cli_main(get_parser, serve, argv)


if __name__ == "__main__":
    main()
