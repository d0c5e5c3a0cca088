"""Asynchronous calls: a handle per call (`Work`) and one progress thread per communicator.

Invariant: the jobs a `ProgressEngine` was given run one at a time, in the order they were
submitted, on its single thread; every submitted `Work` completes exactly once, with the
job's result or its exception (or the caller's cancellation at close), and its callbacks
run once, right after it completes. `peek` shows the payload of the job that runs next (the
communicator posts that call's records behind the running call's data: netreduce/comm.py);
nothing but `close` takes a job off the queue, so that job runs next.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from netreduce.errors import CommunicatorError


class Work:
    """The handle of one asynchronous call (`allreduce(..., async_op=True)`): `wait()`
    returns the call's result (the reduced array or tensor) or raises its error, the same
    exception the synchronous call would have raised."""

    def __init__(self, what: str) -> None:
        self.what = what                  # "allreduce call #3 (float32[1024] ...)" etc.
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Work"], None]] = []

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the call completed (TimeoutError after `timeout` s, the call going
        on); return its result or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"netreduce: {self.what} not complete after {timeout:g}s")
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self) -> bool:
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        """The call's error once it completed (None while running or after success)."""
        return self._error

    def add_done_callback(self, callback: Callable[["Work"], None]) -> None:
        """Run `callback(self)` once the call completed (at once if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def get_future(self) -> Any:
        """A `torch.futures.Future` completed with the result or the error (imports torch)."""
        import torch
        future: Any = torch.futures.Future()

        def complete(work: Work) -> None:
            if work._error is not None:
                future.set_exception(work._error)
            else:
                future.set_result(work._result)
        self.add_done_callback(complete)
        return future

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete the call (once; the engine, or the communicator cancelling it)."""
        with self._lock:
            if self._done.is_set():
                return
            self._result, self._error = result, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def __repr__(self) -> str:
        state = ("failed" if self._error is not None else "done") if self._done.is_set() \
            else "pending"
        return f"Work({self.what!r}, {state})"


class ProgressEngine:
    """Runs submitted jobs in order on one daemon thread, started at the first `submit`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[tuple[Work, Callable[[], Any], Any]] = deque()
        self._running: Work | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], Any], what: str, payload: Any = None) -> Work:
        """Queue `job`; its `Work` completes with what it returns or raises. `payload`: what
        `peek` shows while the job waits."""
        work = Work(what)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"netreduce: {what}: the communicator is closing")
            self._queue.append((work, job, payload))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return work

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                work, job, _ = self._queue.popleft()
                self._running = work
            try:
                result = job()
            except BaseException as exc:        # noqa: BLE001 - handed to the caller's wait()
                work.finish(error=exc)
            else:
                work.finish(result=result)
            with self._cond:
                self._running = None
                self._cond.notify_all()

    def peek(self) -> Any:
        """The payload of the job that runs next (None: none queued, or it has none)."""
        with self._cond:
            return self._queue[0][2] if self._queue and not self._closed else None

    def on_thread(self) -> bool:
        """Is the caller the progress thread (a job calling back into the communicator)?"""
        return threading.current_thread() is self._thread

    def idle(self) -> bool:
        return not self._queue and self._running is None

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted so far finished; False if `timeout` ran out."""
        with self._cond:
            return self._cond.wait_for(self.idle, timeout)

    def close(self, timeout: float, rank: int) -> Work | None:
        """Refuse new jobs and wait up to `timeout` s for the submitted ones. The works not
        started by then are taken off the queue and fail with `CommunicatorError` (naming
        `rank`); returns the one still running (None when all finished)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(self.idle, timeout)
            left = [work for work, _, _ in self._queue]
            self._queue.clear()
            running = self._running
        for work in left:
            work.finish(error=CommunicatorError(
                f"netreduce: rank {rank}: {work.what} cancelled: the communicator was "
                f"closed before it started"))
        return running

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the thread to end (after `close`); False if it runs on."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True
