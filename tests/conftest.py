import os
import pathlib
import pickle

import pytest
from filelock import FileLock

from helpers import ONE_THREAD, TINY_BUILTIN_TRANSFORMER, generate, in_parallel, make_corpus, preprocess, train
from skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (CI=true: no skips)


def built_once(tmp_path_factory, name, build):
    """``build(folder)``'s result, built once per test run: under pytest-xdist the workers share one
    folder (the first builds it under a file lock, the others wait and read the pickled result).
    With FAIRSEQ_PLUGINS_TEST_SHARED=DIR, built once in DIR for every run that sets it: for
    scripts/mutation.sh, whose mutants of one file all reuse what the unmutated code built."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above every worker's own
    if os.environ.get("FAIRSEQ_PLUGINS_TEST_SHARED"):
        root = pathlib.Path(os.environ["FAIRSEQ_PLUGINS_TEST_SHARED"])
    folder, result = root / f"shared-{name}", root / f"shared-{name}.pickle"
    with FileLock(str(result) + ".lock"):
        if not result.exists():
            folder.mkdir()
            result.write_bytes(pickle.dumps(build(folder)))
    return pickle.loads(result.read_bytes())


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """Raw text of the embedded corpus: {train,valid,test}.{src,tgt}, short sentences."""
    return built_once(tmp_path_factory, "corpus", lambda folder: make_corpus(str(folder)))


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory, corpus_dir):
    """fairseq-preprocess output of ``corpus_dir`` with a joined dictionary (langs src/tgt)."""
    return built_once(tmp_path_factory, "data-bin", lambda folder: preprocess(corpus_dir, str(folder)))


@pytest.fixture(scope="session")
def data_bin_separate(tmp_path_factory, corpus_dir):
    """The same corpus with separate source and target dictionaries."""
    return built_once(tmp_path_factory, "data-bin-sep",
                      lambda folder: preprocess(corpus_dir, str(folder), joined=False))


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
    def build(root):
        in_parallel([lambda family=family, arch=arch: train(data_bin, root / family, arch, 60,
                                                            ["--dropout", "0.3", "--no-epoch-checkpoints"], ONE_THREAD)
                     for family, arch in GENERATION_FAMILIES.items()])
        return {family: str(root / family / "checkpoint_last.pt") for family in GENERATION_FAMILIES}
    return built_once(tmp_path_factory, "generation-models", build)


@pytest.fixture(scope="session")
def plain_generations(tmp_path_factory, generation_models, data_bin):
    """{family: helpers.generate output of ``generation_models[family]``, beam 2, --nbest 2}: the plain
    decoding that tests of generation options compare with (run once for all of them)."""
    return built_once(tmp_path_factory, "plain-generations",
                      lambda _: {family: generate(data_bin, path, "--nbest", "2")
                                 for family, path in generation_models.items()})
