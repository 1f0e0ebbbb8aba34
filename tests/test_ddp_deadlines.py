"""stragglar/ddp/deadlines.py: a Future settled once, by its work or by its deadline, whichever
comes first; the watching thread starts afresh in a forked child."""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref

import pytest

pytest.importorskip("torch")

import torch

from stragglar.ddp import deadlines


def late(seconds: float = 0.2) -> RuntimeError:
    return RuntimeError(f"no answer within {seconds} s")


def test_the_work_settles_it_when_it_comes_first_and_the_deadline_then_changes_nothing() -> None:
    engine: torch.futures.Future[int] = torch.futures.Future()
    outcome, _ = deadlines.bounded(engine, lambda f: f.value() * 2, 0.2, late)
    engine.set_result(21)
    time.sleep(0.4)  # past the deadline: already settled, it stays so
    assert outcome.wait() == 42


def test_the_deadline_fails_it_when_the_work_never_comes_and_the_work_then_changes_nothing() -> None:
    engine: torch.futures.Future[int] = torch.futures.Future()
    start = time.monotonic()
    outcome, _ = deadlines.bounded(engine, lambda f: f.value(), 0.2, late)
    with pytest.raises(RuntimeError, match=r"no answer within 0\.2 s"):
        outcome.wait()
    assert 0.15 < time.monotonic() - start < 5
    engine.set_result(1)  # too late: no second outcome, no error from setting one
    with pytest.raises(RuntimeError, match="no answer"):
        outcome.value()


def test_an_error_of_the_work_is_its_outcome() -> None:
    engine: torch.futures.Future[int] = torch.futures.Future()
    outcome, _ = deadlines.bounded(engine, lambda f: f.value(), 30.0, late)
    engine.set_exception(ConnectionError("closed by peer"))  # type: ignore[arg-type]  # torch types it as T
    with pytest.raises(ConnectionError, match="closed by peer"):
        outcome.wait()


def test_an_error_of_the_work_is_said_as_failed_says_it_and_a_deadline_meanwhile_changes_nothing() -> None:
    """A lost peer's error may take a moment to say (the roll call of the ranks not in the call):
    said off the engine's thread, the outcome claimed, so that the deadline passing meanwhile
    (0.1 s, while the saying takes 0.5 s) does not say a timeout instead."""
    engine: torch.futures.Future[int] = torch.futures.Future()
    seen: list[BaseException] = []
    said = threading.Event()

    def failed(error: BaseException) -> BaseException:
        seen.append(error)
        time.sleep(0.5)
        said.set()
        return ConnectionError(f"{error}; rank 2 was not in it")

    outcome, _ = deadlines.bounded(engine, lambda f: f.value(), 0.1, late, None, failed)
    engine.set_exception(ConnectionError("closed by peer"))  # type: ignore[arg-type]  # torch types it as T
    assert not said.is_set()  # the engine's thread did not wait for it
    with pytest.raises(ConnectionError, match=r"^closed by peer; rank 2 was not in it$"):
        outcome.wait()
    assert said.is_set() and [str(e) for e in seen] == ["closed by peer"]


def test_the_last_callback_is_let_go_once_run_though_an_error_is_still_held() -> None:
    """close() waits until the engine's thread has let go of its callbacks (probe.let_go).  A
    result that raised stays alive through its error's traceback, which the step's caller holds,
    so a weak reference to it kept close() waiting its whole bound; the last callback's does not."""
    engine: torch.futures.Future[int] = torch.futures.Future()

    def result(future: torch.futures.Future[int]) -> int:
        try:
            return future.value()
        except Exception as e:
            raise RuntimeError("a peer was lost") from e

    outcome, callback = deadlines.bounded(engine, result, 30.0, late)
    ran, kept = weakref.ref(callback), weakref.ref(result)
    del callback, result
    assert ran() is not None  # the engine holds it until it has run it
    engine.set_exception(ConnectionError("closed by peer"))  # type: ignore[arg-type]  # torch types it as T
    with pytest.raises(RuntimeError, match="a peer was lost") as info:
        outcome.wait()
    assert ran() is None
    assert kept() is not None and info.value is not None  # the error's frames hold the result


def test_settled_takes_the_first_outcome_only() -> None:
    once = deadlines.Settled()
    assert once.settle(1) and not once.settle(error=late()) and not once.settle(2)
    assert once.future.wait() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_has_a_watching_thread_of_its_own() -> None:
    """The parent's thread is not in a forked child: a deadline there would never fire."""
    deadlines.bounded(torch.futures.Future(), lambda f: f.value(), 30.0, late)  # the parent's thread
    pid = os.fork()
    if pid == 0:  # the child: its deadline must fire
        code = 1
        try:
            deadlines.bounded(torch.futures.Future(), lambda f: f.value(), 0.1, late)[0].wait()
        except RuntimeError:
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:  # the child's deadline never fired: end it, and fail
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0


def test_a_passed_deadline_claims_it_while_its_error_is_said() -> None:
    """The error may take a moment to say (the roll call of the ranks that had not reached the
    call): it is said off the watching thread, and the work that completes meanwhile, or its own
    timeout's error, changes nothing."""
    engine: torch.futures.Future[int] = torch.futures.Future()
    saying = threading.Event()

    def slow_error() -> RuntimeError:
        saying.set()
        time.sleep(0.5)
        return late(0.1)

    outcome, _ = deadlines.bounded(engine, lambda f: f.value(), 0.1, slow_error)
    other, _ = deadlines.bounded(torch.futures.Future(), lambda f: f.value(), 0.2, late)
    assert saying.wait(5)
    engine.set_result(1)  # too late: the deadline has claimed it
    with pytest.raises(RuntimeError, match=r"no answer within 0\.2 s"):  # not held up by the first
        other.wait()
    assert not outcome.done()
    with pytest.raises(RuntimeError, match=r"no answer within 0\.1 s"):
        outcome.wait()


def test_in_time_is_called_for_a_value_that_settled_it_only() -> None:
    called: list[int] = []
    engine: torch.futures.Future[int] = torch.futures.Future()
    outcome, _ = deadlines.bounded(engine, lambda f: f.value(), 30.0, late, lambda: called.append(1))
    engine.set_result(1)
    assert outcome.wait() == 1 and called == [1]
    failed: torch.futures.Future[int] = torch.futures.Future()
    outcome, _ = deadlines.bounded(failed, lambda f: f.value(), 30.0, late, lambda: called.append(2))
    failed.set_exception(ConnectionError("closed by peer"))  # type: ignore[arg-type]  # torch types it as T
    with pytest.raises(ConnectionError):
        outcome.wait()
    assert called == [1]


def test_a_reminder_runs_only_while_the_future_is_not_done() -> None:
    ran: list[str] = []
    pending: torch.futures.Future[int] = torch.futures.Future()
    done: torch.futures.Future[int] = torch.futures.Future()
    deadlines.remind(pending, 0.05, lambda: ran.append("pending"))
    deadlines.remind(done, 0.05, lambda: ran.append("done"))
    done.set_result(1)
    time.sleep(0.3)
    assert ran == ["pending"]


def test_no_thread_to_say_the_error_still_fails_it_and_the_watch_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deadline whose thread could not start (a thread limit) left its Future claimed and never
    settled, and the exception ended the watching thread: no later deadline passed again."""
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        if thread.name == "stragglar-deadline":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refused)
    first, second = torch.futures.Future(), torch.futures.Future()  # type: ignore[var-annotated]
    one, _ = deadlines.bounded(first, lambda f: f.value(), 0.1, late)
    with pytest.raises(RuntimeError, match=r"no answer within 0\.2 s"):
        one.wait()  # said in the watching thread itself
    monkeypatch.setattr(threading.Thread, "start", start)

    def broken() -> None:
        raise ValueError("a reminder's own failure")

    deadlines.remind(second, 0.05, broken)
    other, _ = deadlines.bounded(second, lambda f: f.value(), 0.2, late)
    with pytest.raises(RuntimeError, match=r"no answer within 0\.2 s"):
        other.wait()  # the watch outlived the failed reminder
