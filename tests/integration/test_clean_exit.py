"""The suite's clean_exit (patches/preemption.py): a process that imported the suite exits cleanly
while fairseq prefetches a batch or a gloo group is alive, where fairseq alone aborts (the controls).
Small Python scripts in subprocesses, since the abort is the process's own end."""
import os
import signal
import subprocess
import sys

import helpers

from fairseq_plugins.network import free_port

# One thread (two cores for the whole suite) and unbuffered: a control's output is read after its abort.
ONE_THREAD = {**helpers.ONE_THREAD, "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# The main thread exits while fairseq's prefetching thread runs torch calls (GIL released) without end.
# Deterministic: Python clears __main__'s globals after it has stopped handing the GIL to other threads
# (CPython 3.10-3.13: a thread asking for it then is ended with pthread_exit, which std::terminate
# stops in torch's noexcept frames); SlowTeardown's __del__ sleeps there with the GIL released, so the
# prefetching thread always finishes its current call and asks for the GIL in that window. The queue
# (100 items) never fills, so the thread is never parked on it instead.
PREFETCH_AT_EXIT = """
import sys, time, torch
torch.set_num_threads(1)
if sys.argv[1] == "suite":
    import fairseq_plugins
from fairseq.data.iterators import BufferedIterator

def batches():
    a = torch.full((400, 400), 1 / 400)  # a @ a == a: no overflow however many products
    while True:
        yield torch.linalg.matrix_power(a, 1 << 20)  # one torch call of 20 products

class SlowTeardown:
    def __init__(self):
        self.sleep = time.sleep
    def __del__(self):
        self.sleep(0.5)

teardown = SlowTeardown()
buffered = BufferedIterator(100, list(range(10 ** 6)))
buffered._iterable = batches()
next(buffered)
print("took one batch")
"""


def test_exit_while_fairseq_prefetches_a_batch_is_clean(tmp_path):
    script = tmp_path / "prefetch_at_exit.py"
    script.write_text(PREFETCH_AT_EXIT)
    env = {**os.environ, **ONE_THREAD}
    plain = subprocess.run([sys.executable, str(script), "fairseq"], capture_output=True, text=True, env=env)
    # The control: fairseq alone aborts (what ended a finished `fairseq-train --max-update 1`), every time.
    assert plain.returncode == -signal.SIGABRT, plain.stderr
    assert "terminate called without an active exception" in plain.stderr
    for _ in range(2):
        suite = subprocess.run([sys.executable, str(script), "suite"], capture_output=True, text=True, env=env)
        assert suite.returncode == 0 and suite.stdout == "took one batch\n", suite.stderr


# Exits with the gloo process group alive (fairseq never destroys it) and collectives in its queue.
# The control is deterministic: LateCollective's __del__ runs while Python clears __main__, after it
# has stopped handing the GIL to other threads; with the group still alive it queues collectives and
# sleeps (GIL released), so gloo's worker thread always finishes one then and asks for the GIL to free
# its tensor (measured on 2026-12-01: 14 aborts in 14 runs). With the suite the group is gone by then (atexit).
GROUP_AT_EXIT = """
import os, sys, time, torch, torch.distributed as dist
if sys.argv[2] == "suite":
    import fairseq_plugins
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])

class LateCollective:
    def __init__(self):
        self.dist, self.torch, self.sleep = dist, torch, time.sleep
    def __del__(self):
        if self.dist.is_initialized():
            for _ in range(20):
                self.dist.all_reduce(self.torch.ones(1000), async_op=True)
        self.sleep(0.5)

late = LateCollective()
dist.init_process_group("gloo", rank=0, world_size=1)
for _ in range(200):
    dist.all_reduce(torch.ones(1000), async_op=True)
print("reduced")
"""


def test_exit_with_a_live_gloo_group_is_clean(tmp_path):
    script = tmp_path / "group_at_exit.py"
    script.write_text(GROUP_AT_EXIT)
    env = {**os.environ, **ONE_THREAD}
    plain = subprocess.run([sys.executable, str(script), str(free_port()), "torch"], capture_output=True, text=True,
                           env=env)
    # The control: without the suite the group outlives Python's teardown and the run aborts, by
    # std::terminate ("without an active exception", or from a c10::Error of a tensor freed then).
    assert plain.returncode == -signal.SIGABRT and plain.stdout == "reduced\n", plain.stderr
    assert "terminate called" in plain.stderr
    for attempt in range(3):
        suite = subprocess.run([sys.executable, str(script), str(free_port()), "suite"], capture_output=True,
                               text=True, env=env)
        assert suite.returncode == 0 and suite.stdout == "reduced\n", (attempt, suite.returncode, suite.stderr)
