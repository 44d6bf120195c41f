"""Actors whose async methods never suspend, run by Ray as plain (threaded) actors.

The gate actor and the store shards are written as async classes whose methods never
``await`` anything that suspends: each runs to completion, one at a time, which is what
makes their journal order and the store's one-operation-at-a-time contract hold (and what
the tests drive directly, as plain objects). Ray would run them as *async actors*, handing
every call from the worker's receiving thread to an event-loop thread and the reply back,
a hop that is a measurable part of each round trip on a small machine (``README``, Ray
control plane). :func:`threaded` makes the class Ray runs
instead: each coroutine method becomes a plain method that runs the coroutine to completion
on the calling thread, and Ray's default of one call at a time for a plain actor keeps the
run-to-completion order.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class SuspendedError(TypeError):
    """A method of a :func:`threaded` actor awaited something that suspends."""


def threaded(cls: type[T]) -> type[T]:
    """A subclass of ``cls`` whose every coroutine method is a plain method that runs it to
    completion (:class:`SuspendedError` if it suspends); plain methods stay as they are.

    NOTE: every coroutine method is converted, private ones too (Ray makes an actor async
    if any method is a coroutine function), so one must not await another of its class's
    methods; a shared body goes in a plain helper. The subclass is made here, not importable by name, so Ray ships it by value with
    ``cls`` (importable) by reference: workers run this tree's ``cls``.

    An instance with a ``_call_lock`` (a ``threading.RLock``) runs each converted method
    under it: for an actor that also serves calls on a thread of its own (a stream lane,
    :func:`~dynbranch.cluster.stream.serve_in_thread`), so that they still run one at a time.
    """
    methods = {
        name: _completed(attr)
        for name, attr in inspect.getmembers(cls, inspect.iscoroutinefunction)
    }
    return type(f"Threaded{cls.__name__}", (cls,), {**methods, "__doc__": cls.__doc__})


def _completed(method: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        lock = getattr(self, "_call_lock", None)
        if lock is None:
            return _run(self, method, args, kwargs)
        with lock:
            return _run(self, method, args, kwargs)

    call.__name__, call.__qualname__, call.__doc__ = (
        method.__name__,
        method.__qualname__,
        method.__doc__,
    )
    return call


def _run(self: Any, method: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    coroutine = method(self, *args, **kwargs)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise SuspendedError(
        f"{type(self).__name__}.{method.__name__} suspended; a threaded actor's methods "
        f"must run to completion"
    )

