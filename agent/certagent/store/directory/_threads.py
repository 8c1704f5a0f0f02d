"""A small, bounded pool of daemon threads for blocking filesystem calls.

:class:`concurrent.futures.ThreadPoolExecutor` joins its threads when the
interpreter exits, even after ``shutdown(wait=False, cancel_futures=True)``: a
thread stuck in a read on a hung filesystem would keep the agent from ever
exiting.  :class:`DaemonExecutor` has the same ``submit``/``shutdown`` contract,
but its threads are daemon threads nobody joins: shutdown never waits for a
call that is running, and the process can exit while one is stuck.

Cost: one queue put and, while fewer than ``max_workers`` threads exist and
none is idle, one thread start per call; nothing at rest (idle threads block on
the queue).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

__all__ = ["DaemonExecutor"]

P = ParamSpec("P")
T = TypeVar("T")

_WorkItem = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonExecutor(Executor):
    """At most ``max_workers`` daemon threads; ``shutdown`` never waits for running calls."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max_workers = max_workers
        self._name = name
        self._queue: queue.SimpleQueue[_WorkItem | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name}: cannot run new calls after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return future

    @property
    def max_workers(self) -> int:
        return self._max_workers

    def running(self) -> int:
        """Calls running now (stuck ones included)."""
        with self._lock:
            return self._running

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; with ``cancel_futures`` cancel the queued ones.

        Never waits for a call that is running, whatever ``wait`` says: a stuck
        call must not keep the agent from stopping.  Idle threads leave at once.
        """
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._running += 1
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller via the future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                finally:
                    with self._lock:
                        self._running -= 1
            del future, fn, args, kwargs
            self._idle.release()
