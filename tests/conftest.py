import pytest

from helpers import ONE_THREAD, TINY_BUILTIN_TRANSFORMER, generate, in_parallel, make_corpus, preprocess, train


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """Raw text of the embedded corpus: {train,valid,test}.{src,tgt}, short sentences."""
    return make_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory, corpus_dir):
    """fairseq-preprocess output of ``corpus_dir`` with a joined dictionary (langs src/tgt)."""
    return preprocess(corpus_dir, str(tmp_path_factory.mktemp("data-bin")))


@pytest.fixture(scope="session")
def data_bin_separate(tmp_path_factory, corpus_dir):
    """The same corpus with separate source and target dictionaries."""
    return preprocess(corpus_dir, str(tmp_path_factory.mktemp("data-bin-sep")), joined=False)


# Every family and fairseq's built-in transformer, briefly trained with dropout 0.3 on ``data_bin``:
# undertrained enough to repeat words, trained enough that dropout changes the beam's choices.
GENERATION_FAMILIES = {
    "vaswani_transformer": ["--arch", "vaswani_transformer_tiny", "--encoder-layers", "1", "--decoder-layers", "1",
                            "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64"],
    "rnnsearch": ["--arch", "rnnsearch_tiny", "--init", "pytorch"],
    "rnnencdec": ["--arch", "rnnencdec_tiny", "--init", "pytorch"],
    "seq2seq_lstm": ["--arch", "seq2seq_lstm_tiny"],  # 2 layers: nn.LSTM's between-layer dropout too
    "builtin_transformer": TINY_BUILTIN_TRANSFORMER,
}


@pytest.fixture(scope="session")
def generation_models(tmp_path_factory, data_bin):
    """{family: checkpoint path} of GENERATION_FAMILIES, 60 updates each (1 thread, two at a time)."""
    root = tmp_path_factory.mktemp("generation-models")
    in_parallel([lambda family=family, arch=arch: train(data_bin, root / family, arch, 60,
                                                        ["--dropout", "0.3", "--no-epoch-checkpoints"], ONE_THREAD)
                 for family, arch in GENERATION_FAMILIES.items()])
    return {family: str(root / family / "checkpoint_last.pt") for family in GENERATION_FAMILIES}


@pytest.fixture(scope="session")
def plain_generations(generation_models, data_bin):
    """{family: helpers.generate output of ``generation_models[family]``, beam 2, --nbest 2}: the plain
    decoding that tests of generation options compare with (run once for all of them)."""
    return {family: generate(data_bin, path, "--nbest", "2") for family, path in generation_models.items()}
