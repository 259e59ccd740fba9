"""Faults in MathVerifier's grading processes: a grading worker SIGKILLed or hung (SIGSTOP) mid-call, and the
grading process itself hung or SIGKILLed mid-call.

What is lost: when a worker dies or hangs, the verdict of the one answer it held (it scores 0.0, like an answer over
its time budget); every other answer of the call is graded, in its place. When the grading process itself dies or
hangs, nothing: the call is sent again to a fresh grading process. In every case the next call works as usual.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

pytest.importorskip("math_verify")

from _helpers import children_of  # noqa: E402

from mcadvantage import MathVerifier  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds the grading workers in /proc"
)

# (answer, gold, verdict): the verdicts alternate, so a shifted answer cannot go unnoticed.
PAIRS = [
    ("x+y", "y+x", True),
    ("3", "4", False),
    (r"\sqrt{8}", r"2\sqrt{2}", True),
    ("0.5", r"\frac{1}{3}", False),
    (r"\frac14", "0.25", True),
]
HANG = (r"10000000!", "1")  # stuck in C code: only killing the worker stops it


def _verifier(**kwargs) -> MathVerifier:
    verifier = MathVerifier(interrupt_in_child=False, cache_size=0, num_workers=1, **kwargs)
    verifier.warmup()
    return verifier


def _pairs(items):
    return [(a, g) for a, g, *_ in items]


def _timed(verifier, pairs):
    start = time.monotonic()
    result = verifier.equivalent_batch(pairs)
    return result, time.monotonic() - start


def test_worker_sigkilled_mid_call(record_property):
    # The worker is killed while it holds an answer (one stuck in C code, so the kill surely lands mid-answer).
    verifier = _verifier(timeout_seconds=10.0)
    supervisor = verifier.grading_process_info()["pid"]
    [worker] = children_of(supervisor)
    threading.Timer(0.5, os.kill, args=(worker, signal.SIGKILL)).start()
    result, seconds = _timed(verifier, [HANG, *_pairs(PAIRS)])
    # The held answer scores False; the others keep their places. Noticed at once, not at the 10 s deadline.
    assert result == [False, *(v for *_, v in PAIRS)]
    assert seconds < 5, seconds
    record_property("seconds", round(seconds, 2))
    info = verifier.grading_process_info()
    assert info["pid"] == supervisor and info["kills"] == 1  # the same grading process, a new worker
    assert worker not in children_of(supervisor)
    # The next call recovers.
    assert verifier.equivalent_batch(_pairs(PAIRS[::-1])) == [v for *_, v in PAIRS[::-1]]
    verifier.close()


def test_worker_hung_mid_call_is_killed_at_its_deadline(record_property):
    verifier = _verifier(timeout_seconds=2.0)
    supervisor = verifier.grading_process_info()["pid"]
    [worker] = children_of(supervisor)
    os.kill(worker, signal.SIGSTOP)  # hangs on the first answer it is handed
    try:
        result, seconds = _timed(verifier, _pairs(PAIRS))
    finally:
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass
    # The hung worker's answer is lost (False, though correct); the rest are graded in order by a fresh worker.
    assert result == [False, *(v for *_, v in PAIRS[1:])]
    assert 2.0 <= seconds < 6, seconds
    record_property("seconds", round(seconds, 2))
    assert verifier.grading_process_info()["kills"] == 1
    assert verifier.equivalent_batch(_pairs(PAIRS)) == [v for *_, v in PAIRS]
    verifier.close()


def test_grading_process_hung_mid_call_is_replaced_and_the_call_retried(monkeypatch, record_property):
    import mcadvantage.tasks.grading as grading

    # The caller's backstop is 30 s + the answers' budgets; 2 s here so the test is quick.
    monkeypatch.setattr(grading, "_BACKSTOP_SLACK_SECONDS", 2.0)
    verifier = _verifier(timeout_seconds=0.5)
    supervisor = verifier.grading_process_info()["pid"]
    os.kill(supervisor, signal.SIGSTOP)
    result, seconds = _timed(verifier, _pairs(PAIRS))
    # Nothing lost: the hung process (and its worker) was killed and the whole call graded by a fresh one.
    assert result == [v for *_, v in PAIRS]
    # Given up after the backstop (2 s + 1.5 s per answer sent, at most 9.5 s), then graded anew.
    assert 2.0 <= seconds < 9.5 + 20, seconds
    record_property("seconds", round(seconds, 2))
    assert verifier.grading_process_info()["pid"] != supervisor
    with pytest.raises(ProcessLookupError):
        os.kill(supervisor, 0)
    assert verifier.equivalent_batch(_pairs(PAIRS[::-1])) == [v for *_, v in PAIRS[::-1]]
    verifier.close()


def test_grading_process_sigkilled_mid_call_is_replaced_and_the_call_retried(record_property):
    verifier = _verifier(timeout_seconds=3.0)
    supervisor = verifier.grading_process_info()["pid"]
    threading.Timer(0.5, os.kill, args=(supervisor, signal.SIGKILL)).start()
    # The grading process dies while its worker holds the first answer; the call is retried in a new one, where
    # the stuck answer runs to its 3 s deadline.
    result, seconds = _timed(verifier, [HANG, *_pairs(PAIRS)])
    assert result == [False, *(v for *_, v in PAIRS)]
    assert seconds < 3.5 + 20, seconds
    record_property("seconds", round(seconds, 2))
    assert verifier.grading_process_info()["pid"] != supervisor
    assert verifier.equivalent_batch(_pairs(PAIRS)) == [v for *_, v in PAIRS]
    verifier.close()
