import pytest

from helpers import make_corpus, preprocess


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
