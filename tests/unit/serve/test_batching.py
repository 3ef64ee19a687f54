"""The server's dynamic batching (serve/batching.py) on a recording backend, without a server:
which sentences share a batch (the rules written in the module's doc, checked here on the
batches the backend saw), what each caller gets back, and what a cancelled request, a failing
batch and the delay do. The server end to end: test_serve.py."""
import asyncio
import threading

import pytest

from fairseq_plugins.serve.backends import Hypothesis, Options
from fairseq_plugins.serve.batching import Batcher


class Recorder:
    """A backend that answers each sentence with itself and its batch's number, after ``gate``."""

    def __init__(self, fail_batches=()):
        self.batches, self.fail_batches = [], set(fail_batches)
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def translate(self, sentences, options):
        self.gate.wait(10)
        with self.lock:
            number = len(self.batches)
            self.batches.append(([" ".join(s) for s in sentences], options))
        if number in self.fail_batches:
            raise RuntimeError(f"batch {number} failed")
        return [[Hypothesis(tokens=[*s, f"#{number}"], score=-float(number))] for s in sentences]


def serve(backend, scenario, max_batch_tokens=1000, max_delay_ms=50.0, workers=1):
    """Runs ``scenario(batcher)`` (a coroutine function) against a started Batcher; its result."""
    async def main():
        batcher = Batcher(backend, max_batch_tokens, max_delay_ms, workers)
        await batcher.start()
        try:  # a batcher that lost a sentence would leave its caller waiting forever
            return await asyncio.wait_for(scenario(batcher), 20), batcher
        finally:
            await batcher.stop()
    return asyncio.run(main())


def words(text):
    return [text.split()]


def answer(hypotheses):
    return " ".join(hypotheses[0].tokens)


def test_concurrent_requests_share_a_batch_and_each_gets_its_own_answer():
    backend = Recorder()

    async def scenario(batcher):
        return await asyncio.gather(batcher.translate([["a"], ["b", "c"]], Options()),
                                    batcher.translate(words("d e f"), Options()))

    (first, second), batcher = serve(backend, scenario)
    assert backend.batches == [(["a", "b c", "d e f"], Options())]  # arrival order
    assert [answer(h) for h in first] == ["a #0", "b c #0"] and [answer(h) for h in second] == ["d e f #0"]
    assert batcher.stats.as_dict() == {"batches": 1, "sentences": 3, "largest_batch": 3, "batches_of_several": 1,
                                       "failed_batches": 0}
    assert batcher.waiting == 0


def test_only_equal_options_share_a_batch_and_the_oldest_sentence_goes_first():
    backend = Recorder()
    beam2, alignment = Options(beam=2), Options(alignment=True)

    async def scenario(batcher):
        return await asyncio.gather(*(batcher.translate(words(text), options) for text, options in [
            ("a", Options()), ("b", beam2), ("c", Options()), ("d", alignment), ("e", beam2), ("f", Options(beam=4)),
            ("g", alignment)]))

    results, batcher = serve(backend, scenario)
    assert backend.batches == [(["a", "c", "f"], Options()), (["b", "e"], beam2), (["d", "g"], alignment)]
    assert [answer(r[0]) for r in results] == ["a #0", "b #1", "c #0", "d #2", "e #1", "f #0", "g #2"]
    assert batcher.stats.batches_of_several == 3 and batcher.stats.largest_batch == 3


@pytest.mark.parametrize("budget, expected", [
    # padded size = sentences x (longest source + </s>): 3 x 4 = 12
    (12, [["a b c", "d e", "f"], ["g h i j"]]),
    (11, [["a b c", "d e"], ["f", "g h i j"]]),  # the third would make 12
    (8, [["a b c", "d e"], ["f"], ["g h i j"]]),  # "f" then "g h i j": 2 x 5 = 10
    (10, [["a b c", "d e"], ["f", "g h i j"]]),  # exactly the budget fits
    (3, [["a b c"], ["d e"], ["f"], ["g h i j"]]),  # a sentence over the budget still goes, alone
])
def test_a_batch_stays_within_the_padded_token_budget(budget, expected):
    backend = Recorder()

    async def scenario(batcher):
        return await asyncio.gather(*(batcher.translate(words(text), Options())
                                      for text in ["a b c", "d e", "f", "g h i j"]))

    results, _ = serve(backend, scenario, max_batch_tokens=budget)
    assert [sentences for sentences, _ in backend.batches] == expected
    assert [answer(r[0]).rsplit(" ", 1)[0] for r in results] == ["a b c", "d e", "f", "g h i j"]


def test_a_sentence_waits_the_delay_for_company_and_a_full_batch_does_not():
    backend = Recorder()

    async def scenario(batcher):
        loop = asyncio.get_running_loop()
        start = loop.time()
        await batcher.translate(words("alone"), Options())
        alone = loop.time() - start
        start = loop.time()
        pending = [asyncio.ensure_future(batcher.translate(words("x y z"), Options())) for _ in range(3)]
        await asyncio.gather(*pending[:2])  # 2 x 4 fill the budget of 8
        full = loop.time() - start
        await pending[2]
        return alone, full, loop.time() - start

    (alone, full, third), _ = serve(backend, scenario, max_batch_tokens=8, max_delay_ms=1000)
    assert 1.0 <= alone < 1.7  # it left when its delay ran out (not before, nor long after)
    assert full < 1.0  # the first two filled the budget and left at once (in milliseconds)
    assert third >= 1.0  # the third waited its own delay
    assert [len(s) for s, _ in backend.batches] == [1, 2, 1]


def test_a_sentence_arriving_while_the_worker_is_busy_joins_the_next_batch():
    backend = Recorder()
    backend.gate.clear()

    async def scenario(batcher):
        first = asyncio.ensure_future(batcher.translate(words("first"), Options()))
        await asyncio.sleep(0)
        while batcher.waiting:  # until the first batch left the queue for the worker
            await asyncio.sleep(0.01)
        later = [asyncio.ensure_future(batcher.translate(words(w), Options())) for w in ("second", "third")]
        await asyncio.sleep(0.2)  # longer than the delay: they wait for the one worker, not the clock
        assert batcher.waiting == 2
        backend.gate.set()
        return await asyncio.gather(first, *later)

    results, _ = serve(backend, scenario, max_delay_ms=20, workers=1)
    assert [s for s, _ in backend.batches] == [["first"], ["second", "third"]]
    assert [answer(r[0]) for r in results] == ["first #0", "second #1", "third #1"]


def test_a_request_cancelled_while_waiting_is_dropped_and_the_others_are_answered():
    backend = Recorder()

    async def scenario(batcher):
        kept = asyncio.ensure_future(batcher.translate([["a"], ["b"]], Options()))
        dropped = asyncio.ensure_future(batcher.translate(words("c"), Options()))
        later = asyncio.ensure_future(batcher.translate(words("d"), Options()))
        await asyncio.sleep(0)  # all three queued, none decoded (the delay is 200 ms)
        assert batcher.waiting == 4
        dropped.cancel()
        await asyncio.sleep(0)
        assert batcher.waiting == 3
        return await asyncio.gather(kept, later)

    (kept, later), batcher = serve(backend, scenario, max_delay_ms=200)
    assert backend.batches == [(["a", "b", "d"], Options())]
    assert [answer(h) for h in kept] == ["a #0", "b #0"] and answer(later[0]) == "d #0"
    assert batcher.stats.sentences == 3


def test_a_failing_batch_fails_its_requests_only_and_the_next_batch_is_served():
    backend = Recorder(fail_batches={0})

    async def scenario(batcher):
        failed = await asyncio.gather(batcher.translate(words("a"), Options()),
                                      batcher.translate(words("b"), Options()), return_exceptions=True)
        served = await batcher.translate(words("c"), Options())
        return failed, served

    (failed, served), batcher = serve(backend, scenario)
    assert [str(e) for e in failed] == ["batch 0 failed", "batch 0 failed"]
    assert all(isinstance(e, RuntimeError) for e in failed)
    assert answer(served[0]) == "c #1"
    assert batcher.stats.failed_batches == 1 and batcher.stats.batches == 2 and batcher.stats.sentences == 3


def test_two_workers_decode_two_batches_at_once():
    backend = Recorder()
    backend.gate.clear()
    both_started = threading.Barrier(2, timeout=5)
    translate = backend.translate

    def meeting(sentences, options):
        both_started.wait()  # raises BrokenBarrierError unless a second batch runs meanwhile
        backend.gate.set()
        return translate(sentences, options)

    backend.translate = meeting

    async def scenario(batcher):
        return await asyncio.gather(batcher.translate(words("a b c"), Options()),
                                    batcher.translate(words("d e f"), Options()))

    results, _ = serve(backend, scenario, max_batch_tokens=4, workers=2)
    assert sorted(s for s, _ in backend.batches) == [["a b c"], ["d e f"]]
    assert sorted(answer(r[0])[:5] for r in results) == ["a b c", "d e f"]


def test_the_delay_runs_from_the_oldest_sentence_of_the_batch():
    backend = Recorder()

    async def scenario(batcher):
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(batcher.translate(words("first"), Options()))
        await asyncio.sleep(0.8)
        arrived = loop.time()
        second = await batcher.translate(words("second"), Options())
        return await first, second, loop.time() - arrived

    (first, second, waited), _ = serve(backend, scenario, max_delay_ms=1000)
    assert [s for s, _ in backend.batches] == [["first", "second"]]
    assert answer(second[0]) == "second #0"
    assert waited < 0.9  # it left with the first, 1 s after the first arrived, not 1 s after itself


def test_a_request_cancelled_in_a_running_batch_leaves_the_others_their_answers():
    backend = Recorder()
    backend.gate.clear()

    async def scenario(batcher):
        cancelled = asyncio.ensure_future(batcher.translate([["a"], ["b"]], Options()))
        kept = asyncio.ensure_future(batcher.translate(words("c"), Options()))
        await asyncio.sleep(0)
        while batcher.waiting:  # until the batch is with the worker (held at the gate)
            await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.sleep(0)
        backend.gate.set()
        return await kept, cancelled.cancelled()

    (kept, was_cancelled), batcher = serve(backend, scenario)
    assert was_cancelled and backend.batches == [(["a", "b", "c"], Options())]
    assert answer(kept[0]) == "c #0"
    assert batcher.stats.sentences == 3 and batcher.stats.failed_batches == 0


def test_a_batcher_that_decoded_nothing_reports_zeros():
    async def scenario(batcher):
        return batcher.stats.as_dict(), batcher.waiting

    (stats, waiting), _ = serve(Recorder(), scenario)
    assert stats == {"batches": 0, "sentences": 0, "largest_batch": 0, "batches_of_several": 0,
                     "failed_batches": 0} and waiting == 0
