"""Run a coroutine eagerly: to its end at once if it never has to wait, else on from
where it stopped, in a task.

This is what Python 3.12's eager tasks do (``asyncio.eager_task_factory``), for the
one place that needs it on 3.11: a review is one coroutine, and the HTTP edge runs it
the moment a whole request has arrived. A cache hit finishes without ever waiting, so it
is answered without a task, a timer or a turn of the loop; a miss has computed its
parse, route, cache key and local lookup by then, and carries on from there. Neither
keeps a second copy of the review path for speed.

Before its first wait, the coroutine runs outside any task. Code that needs one (an
``asyncio.timeout``, a library's I/O) must come after :func:`in_a_task`, which the
layers await where a review stops being answerable at once: the cache layer on a local
miss, the deadline layer before a call. Under a task, ``in_a_task`` costs one check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Detach:
    """What the coroutine yields to ask to continue in a task (never seen by a Task)."""


_DETACH = _Detach()


class _InATask:
    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        if asyncio.current_task() is None:
            yield _DETACH
        return None


#: ``await in_a_task()``: from here on the coroutine runs in a task (see the module).
def in_a_task() -> _InATask:
    return _IN_A_TASK


_IN_A_TASK = _InATask()


@dataclass(slots=True)
class Suspended(Generic[T]):
    """The coroutine stopped at its first wait; :meth:`resume` (in a task) finishes it."""

    coro: Coroutine[Any, Any, T]
    waiting_for: Any

    async def resume(self) -> T:
        """Drive the coroutine on from where it stopped, in the calling task: each future
        it waits for is awaited here, and what that gives (or raises, cancellation
        included) is handed back to it, as a Task would."""
        coro, waiting_for = self.coro, self.waiting_for
        while True:
            try:
                if waiting_for is None or waiting_for is _DETACH:
                    if waiting_for is None:
                        await asyncio.sleep(0)  # a bare yield: one turn of the loop
                    result = None
                else:
                    # Taken over from the coroutine as a Task takes it: its own await
                    # marked the future blocking, and a second await refuses one so marked.
                    waiting_for._asyncio_future_blocking = False
                    result = await waiting_for
            except BaseException as exc:  # handed to the coroutine, as a Task would
                try:
                    waiting_for = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                continue
            try:
                waiting_for = coro.send(result)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """It will never be resumed (the connection went away first)."""
        self.coro.close()


def run_eagerly(coro: Coroutine[Any, Any, T]) -> T | Suspended[T]:
    """Run ``coro`` until it finishes or first waits: its value if it finished (nothing
    else is allocated on the cache-hit path), else a :class:`Suspended` to resume. Its
    exception, if it raises before waiting, propagates from here. A coroutine that may
    run eagerly never returns a :class:`Suspended` itself."""
    try:
        waiting_for = coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return Suspended(coro, waiting_for)
