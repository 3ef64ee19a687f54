"""fairseq-plugins-serve: each client gets what translating its sentence alone gives, under
concurrency and load; bad input, SIGTERM and disconnecting clients.

Oracles: fairseq's hub interface (``from_pretrained`` + ``generate``, soft alignments from its
``SequenceGeneratorWithAlignment``) and ``ctranslate2.Translator.translate_batch``, each given one
sentence alone, in this process; sacremoses for the preprocessing; fairseq's Moses encoder on the
hub for the detokenized text.
"""
import json
import os
import signal
import socket
import threading
import time
from argparse import Namespace

import ctranslate2
import httpx
import pytest
from fairseq.data import encoders
from fairseq.models import BaseFairseqModel
from helpers import BIN, ONE_THREAD, run
from sacremoses import MosesTokenizer

from fairseq_plugins.cli.serve import get_parser
from fairseq_plugins.errors import PluginError
from fairseq_plugins.serve.backends import load_backend
from fairseq_plugins_lab.benchmarks.serve import ServerProcess, run_load

pytestmark = pytest.mark.slow

OPTIONS = [{"beam": 1}, {}, {"beam": 4, "n_best": 3}, {"beam": 2, "alignment": True},
           {"beam": 3, "n_best": 2, "alignment": True}]


SERVE = os.path.join(BIN, "fairseq-plugins-serve")  # the console script pip installed


def start(model, *flags, tmp_path_factory, name, installed=False):
    log = str(tmp_path_factory.mktemp("serve") / f"{name}.log")
    if installed:
        assert os.path.isfile(SERVE), f"{SERVE} is not installed: pip install -e . (scripts/setup_env.sh does)"
    return ServerProcess(model, flags, log=log, env=ONE_THREAD, **({"command": [SERVE]} if installed else {}))


@pytest.fixture(scope="module")
def sources(corpus_dir):
    return open(f"{corpus_dir}/test.src").read().splitlines()


@pytest.fixture(scope="module")
def ct2_dir(generation_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("serve-ct2") / "ct2"
    run(["fairseq-plugins-export-ctranslate2", generation_models["vaswani_transformer"], out])
    return str(out)


@pytest.fixture(scope="module")
def transformer_server(generation_models, tmp_path_factory):
    # a long delay and two workers: concurrent requests batch, and batches run side by side
    with start(generation_models["vaswani_transformer"], "--max-delay-ms", "150", "--workers", "2",
               tmp_path_factory=tmp_path_factory, name="transformer") as server:
        yield server


@pytest.fixture(scope="module")
def rnnsearch_server(generation_models, tmp_path_factory):
    with start(generation_models["rnnsearch"], "--max-delay-ms", "150",
               tmp_path_factory=tmp_path_factory, name="rnnsearch") as server:
        yield server


@pytest.fixture(scope="module")
def ct2_server(ct2_dir, tmp_path_factory):
    with start(ct2_dir, "--max-delay-ms", "20", "--tokenizer", "moses", "--source-lang", "en",
               "--target-lang", "fr", tmp_path_factory=tmp_path_factory, name="ct2") as server:
        yield server


def hub_oracle(checkpoint, data):
    hub = BaseFairseqModel.from_pretrained(os.path.dirname(checkpoint), checkpoint_file=os.path.basename(checkpoint),
                                           data_name_or_path=data).eval()

    def translate(sentence, beam=4, n_best=1, alignment=False):
        extra = {"print_alignment": "soft"} if alignment else {}
        hypos = hub.generate([hub.encode(sentence)], beam=beam, nbest=n_best, **extra)[0][:n_best]
        out = []
        for h in hypos:
            entry = {"text": hub.decode(h["tokens"]), "score": h["score"].item(),
                     "tokens": [hub.tgt_dict[i] for i in h["tokens"][:-1]]}
            if alignment:  # fairseq's rows and columns include </s>; the server's do not
                entry["alignment"] = [[float(p) for p in row[:-1]] for row in h["alignment"][:-1]]
            out.append(entry)
        return out
    return translate


def moses_hub(checkpoint, data):
    """fairseq's route for the CTranslate2 server's flags: the hub interface with fairseq's
    ``--tokenizer moses --source-lang en --target-lang fr`` encoder (set after loading: as an
    override, the languages would also rename the task's dictionaries)."""
    hub = BaseFairseqModel.from_pretrained(os.path.dirname(checkpoint), checkpoint_file=os.path.basename(checkpoint),
                                           data_name_or_path=data).eval()
    hub.tokenizer = encoders.build_tokenizer(Namespace(tokenizer="moses", source_lang="en", target_lang="fr",
                                                       moses_no_dash_splits=False, moses_no_escape=False))
    return hub


def fairseq_text(hub, tokens):
    """fairseq's detokenized string of target ``tokens``: ``hub.decode`` of their ids."""
    return hub.decode(hub.tgt_dict.encode_line(" ".join(tokens), add_if_not_exist=False, append_eos=False).long())


def ct2_oracle(folder, hub=None):
    """CTranslate2 on one sentence of Moses tokens; with ``hub``, the text is fairseq's detokenized string."""
    translator = ctranslate2.Translator(folder, inter_threads=1, intra_threads=1)
    tokenize = hub.tokenizer.encode if hub is not None else (lambda sentence: sentence)

    def translate(sentence, beam=4, n_best=1, alignment=False):
        r = translator.translate_batch([tokenize(sentence).split()], beam_size=beam, num_hypotheses=n_best,
                                       return_scores=True, return_attention=alignment, max_decoding_length=200)[0]
        return [{"tokens": tokens, "score": score, **({"alignment": r.attention[k]} if alignment else {}),
                 **({"text": fairseq_text(hub, tokens)} if hub is not None else {})}
                for k, (tokens, score) in enumerate(zip(r.hypotheses, r.scores))]
    return translate


def hypotheses(entry, options):
    return entry["hypotheses"] if options.get("n_best", 1) > 1 else [entry]


def assert_same(served, expected, source_tokens):
    assert len(served) == len(expected)
    for got, want in zip(served, expected):
        assert got["tokens"] == want["tokens"]
        assert got["source_tokens"] == source_tokens
        if "text" in want:
            assert got["text"] == want["text"]
        # batched matrix products round differently from one sentence's: scores agree to float32 rounding
        assert got["score"] == pytest.approx(want["score"], abs=1e-5)
        assert ("alignment" in got) == ("alignment" in want)
        if "alignment" in want:
            assert len(got["alignment"]) == len(got["tokens"])
            for row, want_row in zip(got["alignment"], want["alignment"]):
                assert len(row) == len(source_tokens)
                assert row == pytest.approx(want_row, abs=1e-5)


def assert_same_answer(got, want):
    """Two answers of the server to the same request; scores to float32 rounding, as above."""
    for a, b in zip(got["translations"], want["translations"], strict=True):
        assert (a["text"], a["tokens"], a["source_tokens"]) == (b["text"], b["tokens"], b["source_tokens"])
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)


def concurrent_requests(sources, count):
    """``count`` requests: different sentences and options; every third holds three sentences."""
    payloads = []
    for i in range(count):
        text = sources[i % len(sources)] if i % 3 else [sources[(i + k) % len(sources)] for k in range(3)]
        payloads.append({"text": text, **OPTIONS[i % len(OPTIONS)]})
    return payloads


def check_answers(server, payloads, oracle, tokenize=str.split):
    before = server.get("/health")["batching"]
    answers, _ = run_load(server.url, payloads, clients=len(payloads))
    after = server.get("/health")["batching"]
    for payload, answer in zip(payloads, answers):
        assert answer.status == 200, answer.body
        options = {k: v for k, v in payload.items() if k != "text"}
        texts = [payload["text"]] if isinstance(payload["text"], str) else payload["text"]
        assert len(answer.body["translations"]) == len(texts)
        for text, entry in zip(texts, answer.body["translations"]):
            assert_same(hypotheses(entry, options), oracle(text, **options), tokenize(text))
    sentences = sum(1 if isinstance(p["text"], str) else len(p["text"]) for p in payloads)
    assert after["sentences"] - before["sentences"] == sentences
    assert after["batches_of_several"] > before["batches_of_several"]  # batching did happen
    assert after["batches"] - before["batches"] < sentences


@pytest.mark.parametrize("family", ["vaswani_transformer", "rnnsearch"])
def test_concurrent_clients_get_what_translating_alone_gives(family, generation_models, data_bin, sources, request):
    server = request.getfixturevalue("transformer_server" if family == "vaswani_transformer" else "rnnsearch_server")
    check_answers(server, concurrent_requests(sources, 30), hub_oracle(generation_models[family], data_bin))


def test_ctranslate2_folder_concurrent_and_under_load(ct2_server, ct2_dir, generation_models, data_bin, sources):
    """The CTranslate2 folder, with Moses preprocessing: 30 concurrent mixed requests (each text
    fairseq's detokenized string of its tokens), then 16 clients x 50 requests: none lost, none
    answered with another's translation."""
    oracle = ct2_oracle(ct2_dir, moses_hub(generation_models["vaswani_transformer"], data_bin))
    check_answers(ct2_server, concurrent_requests(sources, 30), oracle)
    payloads = [{"text": sources[i % len(sources)], "beam": 1 + i % 4} for i in range(480)]
    expected = {(p["text"], p["beam"]): oracle(p["text"], beam=p["beam"])[0]["tokens"] for p in payloads}
    before = ct2_server.get("/health")["batching"]
    start_time = time.monotonic()
    answers, wall = run_load(ct2_server.url, payloads, clients=16)
    assert wall < 120 and time.monotonic() - start_time < 120
    assert [a.index for a in answers] == list(range(len(payloads)))
    assert all(a.status == 200 for a in answers)
    assert all(a.body["translations"][0]["tokens"] == expected[(p["text"], p["beam"])]
               and a.body["translations"][0]["source_tokens"] == p["text"].split() for a, p in zip(answers, payloads))
    after = ct2_server.get("/health")["batching"]
    assert after["sentences"] - before["sentences"] == len(payloads)
    assert after["failed_batches"] == 0


def test_moses_preprocessing_and_detokenization(ct2_server, ct2_dir, generation_models, data_bin, sources):
    text = "the netekka, tekluka barneto \"the\" dolmivik!"
    answer = httpx.post(ct2_server.url + "/translate", json={"text": text}).json()["translations"][0]
    assert answer["source_tokens"] == MosesTokenizer("en").tokenize(text, aggressive_dash_splits=True, escape=True)
    hub = moses_hub(generation_models["vaswani_transformer"], data_bin)
    expected = ct2_oracle(ct2_dir, hub)(text)[0]
    assert answer["tokens"] == expected["tokens"]
    assert answer["text"] == expected["text"] == hub.translate(text, beam=4)
    assert ct2_server.get("/info")["preprocessing"] == {"tokenizer": "moses", "bpe": None}
    # every answer's text is fairseq's detokenization of its tokens, on test sentences among whose
    # translations detokenization changes some (French elision: "l' ar" -> "l'ar")
    answers = httpx.post(ct2_server.url + "/translate", json={"text": sources[:40]}, timeout=120).json()["translations"]
    assert any(a["text"] != " ".join(a["tokens"]) for a in answers), "nothing to detokenize: the check cannot fail"
    assert [a["text"] for a in answers] == [fairseq_text(hub, a["tokens"]) for a in answers]


BAD = [  # (body, status, start of the message)
    (b'{"text": ""}', 400, "text[0] is empty"),
    (b'{"text": ["a b", "   "]}', 400, "text[1] is empty"),
    (b'{"text": []}', 400, '"text" holds 0 sentences'),
    (b'{"beam": 2}', 400, '"text" is required'),
    (b'{"text": 5}', 400, '"text" must be a string'),
    (('{"text": "%s"}' % ("a" * 100_000)).encode(), 400, "text[0] has 100000 characters, above the limit of 2000"),
    (('{"text": "%s"}' % ("a " * 300)).encode(), 400,
     "text[0] has 300 tokens after tokenization, above the limit of 250"),
    (b'{"text": "the \xff netekka"}', 400, "request body is not UTF-8: byte 0xff at position 14"),
    (b'{"text": "the \\ud800 netekka"}', 400, "text[0] holds a lone surrogate \\ud800"),
    (b'{"text": "the netekka"', 400, "malformed JSON: Expecting ',' delimiter"),
    (b"", 400, "malformed JSON"),
    (b'["the netekka"]', 400, "the body must be a JSON object"),
    (b'{"text": "the", "bem": 4, "lang": "de"}', 400,
     "unknown option(s) 'bem', 'lang'; known: text, beam, n_best, alignment"),
    (b'{"text": "the", "beam": 0}', 400, "beam 0 is out of range [1, 64]"),
    (b'{"text": "the", "beam": 10000}', 400, "beam 10000 is out of range [1, 64]"),
    (b'{"text": "the", "beam": "4"}', 400, 'beam must be an integer, got "4"'),
    (b'{"text": "the", "beam": true}', 400, "beam must be an integer, got true"),
    (b'{"text": "the", "beam": 2, "n_best": 3}', 400, "n_best 3 is out of range [1, 2]"),
    (b'{"text": "the", "alignment": "yes"}', 400, 'alignment must be true or false, got "yes"'),
    (('{"text": [%s]}' % ",".join(['"a"'] * 65)).encode(), 400, '"text" holds 65 sentences; give 1 to 64'),
    (b'{"text": "' + b"a" * (1 << 20) + b'"}', 413, "request body above the limit of 1048576 bytes"),
]


def test_bad_input_is_refused_in_one_line_and_the_server_keeps_serving(transformer_server, sources):
    good = {"text": sources[0]}
    expected = httpx.post(transformer_server.url + "/translate", json=good).json()
    with httpx.Client(base_url=transformer_server.url, timeout=30) as client:
        for body, status, message in BAD:
            response = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == status, (body[:60], response.text)
            error = response.json()["error"]
            assert error.startswith(message) and "\n" not in error, (body[:60], error)
            assert_same_answer(client.post("/translate", json=good).json(), expected)
        assert client.get("/translate").status_code == 405
        assert client.get("/nothing-here").json() == {"error": "Not Found"}


def test_health_info_alignment_rows_and_n_best(transformer_server, rnnsearch_server, data_bin, sources):
    symbols = 4 + sum(1 for _ in open(os.path.join(data_bin, "dict.src.txt")))  # fairseq's specials first
    for server, family in ((transformer_server, "vaswani_transformer"), (rnnsearch_server, "rnnsearch")):
        assert server.get("/health")["status"] == "ok"
        info = server.get("/info")
        assert (info["family"], info["backend"]) == (family, "fairseq")
        assert info["vocabulary"] == {"source": symbols, "target": symbols}
        assert info["options"] == {"beam": 4, "n_best": 1, "alignment": False}
        assert info["limits"]["max_chars"] == 2000
        entry = httpx.post(server.url + "/translate", json={"text": sources[1], "alignment": True}).json()
        entry = entry["translations"][0]
        assert len(entry["alignment"]) == len(entry["tokens"])  # one row per target token
        assert all(len(row) == len(entry["source_tokens"]) == len(sources[1].split()) for row in entry["alignment"])
        assert all(0 <= w <= 1 for row in entry["alignment"] for w in row)
        assert all(sum(row) <= 1 + 1e-5 for row in entry["alignment"])
        best = httpx.post(server.url + "/translate", json={"text": [sources[2], sources[3]], "n_best": 3}).json()
        for sentence in best["translations"]:
            assert list(sentence) == ["hypotheses"] and len(sentence["hypotheses"]) == 3
            assert all(set(h) == {"text", "score", "tokens", "source_tokens"} for h in sentence["hypotheses"])
            scores = [h["score"] for h in sentence["hypotheses"]]
            assert scores == sorted(scores, reverse=True)


def wait_for(condition, timeout=30, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def send_raw(server, payload):
    """A connected socket that has sent a whole ``POST /translate`` and reads nothing."""
    body = json.dumps(payload).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def post_in_threads(url, texts, timeout=120):
    """One thread per text posting it; (threads, results: responses or exceptions in text order)."""
    results = [None] * len(texts)

    def client(i):
        try:
            results[i] = httpx.post(url + "/translate", json={"text": texts[i]}, timeout=timeout)
        except httpx.HTTPError as e:
            results[i] = e

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    return threads, results


def test_a_client_disconnecting_mid_request_does_not_break_its_batch(ct2_dir, sources, tmp_path_factory):
    """Eight sentences wait in one batching window (5 s); the client of one of them closes its
    connection once its request is queued. The batch of eight is decoded, the abandoned
    sentence included, and the seven others get what translating alone gives."""
    oracle = ct2_oracle(ct2_dir)
    with start(ct2_dir, "--max-delay-ms", "5000", tmp_path_factory=tmp_path_factory, name="disconnect") as server:
        before = server.get("/health")["batching"]
        abandoned = send_raw(server, {"text": sources[3]})
        wait_for(lambda: server.get("/health")["waiting"] == 1, what="the abandoned request queued")
        others = [sources[i] for i in range(8) if i != 3]
        threads, results = post_in_threads(server.url, others)
        wait_for(lambda: server.get("/health")["waiting"] == 8, what="all eight queued")
        abandoned.close()  # the request was sent whole and is waiting: a certain disconnect
        for t in threads:
            t.join()
        for text, response in zip(others, results):
            assert response.status_code == 200, response
            assert response.json()["translations"][0]["tokens"] == oracle(text)[0]["tokens"]
        after = server.get("/health")["batching"]
        assert after["failed_batches"] == 0
        assert (after["batches"] - before["batches"], after["sentences"] - before["sentences"]) == (1, 8)
        assert after["largest_batch"] == 8  # the abandoned sentence was decoded with the others
        answer = httpx.post(server.url + "/translate", json={"text": sources[3]}, timeout=60).json()
        assert answer["translations"][0]["tokens"] == oracle(sources[3])[0]["tokens"]


def test_sigterm_answers_the_requests_in_flight_refuses_new_connections_then_exits_0(ct2_dir, sources,
                                                                                      tmp_path_factory):
    """Twelve sentences wait (5 s window); SIGTERM: new connections are refused while the twelve
    still wait, then all twelve are answered, in one batch, and the server exits with 0."""
    server = start(ct2_dir, "--max-delay-ms", "5000", tmp_path_factory=tmp_path_factory, name="sigterm")
    try:
        threads, results = post_in_threads(server.url, sources[:12])
        wait_for(lambda: server.get("/health")["waiting"] == 12, what="all twelve queued, none answered")
        server.process.send_signal(signal.SIGTERM)

        def refused():
            try:
                httpx.get(server.url + "/health", timeout=5)
            except httpx.ConnectError:
                return True
            return False

        wait_for(refused, what="new connections refused after SIGTERM")
        assert all(t.is_alive() for t in threads) and results == [None] * 12  # still draining
        assert server.process.wait(60) == 0
        for t in threads:
            t.join()
        oracle = ct2_oracle(ct2_dir)
        assert [r.status_code for r in results] == [200] * 12
        served = [r.json()["translations"][0]["tokens"] for r in results]
        assert served == [oracle(s)[0]["tokens"] for s in sources[:12]]
        assert "served 12 sentences in 1 batches" in server.log()
    finally:
        server.stop()


def test_graceful_timeout_ends_a_request_that_would_outlast_it(ct2_dir, sources, tmp_path_factory):
    """The installed fairseq-plugins-serve, --graceful-timeout 2: a sentence that would wait 10
    minutes for its batch is given up 2 s after SIGTERM, and the server still exits with 0."""
    server = start(ct2_dir, "--max-delay-ms", "600000", "--graceful-timeout", "2", tmp_path_factory=tmp_path_factory,
                   name="graceful", installed=True)
    try:
        assert server.get("/info")["backend"] == "ctranslate2"
        threads, results = post_in_threads(server.url, sources[:1])
        wait_for(lambda: server.get("/health")["waiting"] == 1, what="the request queued")
        signalled = time.monotonic()
        assert server.terminate(timeout=60) == 0
        waited = time.monotonic() - signalled
        threads[0].join()
        assert 2 <= waited < 30, waited
        assert not isinstance(results[0], httpx.Response) or results[0].status_code != 200, results[0]
        assert "timeout graceful shutdown exceeded" in server.log()
        assert "served 0 sentences in 0 batches" in server.log()
    finally:
        server.stop()


def test_benchmark_serve_takes_server_flags_after_dashes_as_its_help_shows(ct2_dir, sources, tmp_path):
    """``fairseq-plugins-benchmark-serve MODEL --sentences F -- --threads 1`` as typed, installed;
    each form its --help shows parses; a wrong server flag is refused in one line before any server starts."""
    from fairseq_plugins_lab.cli import benchmark_serve

    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(sources[:4]) + "\n")
    help_text = run(["fairseq-plugins-benchmark-serve", "--help"])
    usage = " ".join(help_text[help_text.index("usage: "):].split("\n\n")[0].split())  # after any log lines
    assert usage == ("usage: fairseq-plugins-benchmark-serve [-h] MODEL --sentences FILE [--clients N] [--requests N] "
                     "[--beam N] [--out FILE] [-- SERVER FLAGS ...]")
    assert "-- --max-delay-ms 10 --threads 2" in " ".join(help_text.split())
    parse = benchmark_serve.get_parser().parse_args
    assert parse(["m", "--sentences", "f"]).server_flags == []
    assert parse(["m", "--sentences", "f", "--clients", "2", "--", "--max-delay-ms", "10", "--threads", "2"]) \
        .server_flags == ["--max-delay-ms", "10", "--threads", "2"]

    out = run(["fairseq-plugins-benchmark-serve", ct2_dir, "--sentences", sentences, "--clients", "2",
               "--requests", "4", "--out", tmp_path / "table.md", "--", "--threads", "1"], env=ONE_THREAD)
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows[2].startswith("| unbatched (--max-batch-tokens 1) | 4/4 |")
    assert rows[3].startswith("| batched (--threads 1) | 4/4 |")
    assert (tmp_path / "table.md").read_text().strip() == "\n".join(rows)
    proc = run(["fairseq-plugins-benchmark-serve", ct2_dir, "--sentences", sentences, "--", "--no-such-flag", "1"],
               check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == \
        "fairseq-plugins-benchmark-serve: error: server flag: unrecognized arguments: --no-such-flag 1"


def test_bad_model_is_refused_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    options = get_parser().parse_args(["unused"])
    for model, message in ((tmp_path / "missing.pt", "neither a checkpoint file nor a CTranslate2 or ONNX folder$"),
                           (tmp_path / "empty", "is a folder without model.bin or decoder_step.onnx: neither a "
                                                "CTranslate2 nor an ONNX model$")):
        with pytest.raises(PluginError, match=message):
            load_backend(str(model), None, options, workers=1, threads=1)


def test_preprocessing_flags_are_fairseqs_encoders(corpus_dir, tmp_path):
    """--tokenizer moses --bpe subword_nmt / sentencepiece give what sacremoses, subword-nmt and
    sentencepiece give applied by hand, and decode back to the detokenized text."""
    import sentencepiece as spm
    from subword_nmt.apply_bpe import BPE

    from fairseq_plugins.data.subwords import learn_apply_bpe, learn_apply_sentencepiece
    from fairseq_plugins.serve.text import TextPipeline

    lines = open(f"{corpus_dir}/train.src").read().splitlines()
    learn_apply_bpe(lines, {}, 200, str(tmp_path / "codes"))
    learn_apply_sentencepiece(lines, {}, 200, str(tmp_path / "spm"))
    text = "The netekka, tekluka's barneto-dolmivik!"
    moses = " ".join(MosesTokenizer("en").tokenize(text, aggressive_dash_splits=True, escape=True))
    with open(tmp_path / "codes", encoding="utf-8") as codes:
        by_hand = {"subword_nmt": BPE(codes).process_line(moses).split(),
                   "sentencepiece": spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
                   .encode(moses, out_type=str)}
    for bpe, flags in (("subword_nmt", ["--bpe-codes", str(tmp_path / "codes")]),
                       ("sentencepiece", ["--sentencepiece-model", str(tmp_path / "spm.model")])):
        options = get_parser().parse_args(["m", "--tokenizer", "moses", "--bpe", bpe, *flags])
        pipeline = TextPipeline.from_options(options)
        tokens = pipeline.encode(text)
        assert tokens == by_hand[bpe] and len(tokens) > len(moses.split())  # words were split
        assert pipeline.decode(tokens) == text
    with pytest.raises(PluginError, match="--bpe subword_nmt needs --bpe-codes FILE"):
        TextPipeline.from_options(get_parser().parse_args(["m", "--bpe", "subword_nmt"]))


def test_a_model_without_attention_refuses_alignments(generation_models, data_bin, sources):
    """seq2seq_lstm (no attention): alignments refused in one line, translations served (in-process)."""
    from starlette.testclient import TestClient

    from fairseq_plugins.serve.app import Limits, build_app
    from fairseq_plugins.serve.batching import Batcher

    backend = load_backend(generation_models["seq2seq_lstm"], data_bin, get_parser().parse_args(["m"]), 1, 1)
    assert not backend.has_attention
    app = build_app(backend, Batcher(backend, 4096, 1, 1), Limits(), {"family": backend.family})
    with TestClient(app) as client:
        refused = client.post("/translate", json={"text": sources[0], "alignment": True})
        assert refused.status_code == 400
        assert refused.json() == {"error": "alignment: a seq2seq_lstm model has no attention to align with"}
        answer = client.post("/translate", json={"text": sources[0]}).json()["translations"][0]
        assert answer["tokens"] and "alignment" not in answer
