"""Request streams an experiment shapes itself: a set share of exact repeats (Fig. 10a).

The paper's Fig. 10a raises the *exact-replay share* — the fraction of requests that repeat
an earlier request of the stream byte for byte — from 0.22 to 0.77. :func:`repetition_stream`
builds such a stream from any workload: ``n − r`` distinct requests in the workload's own
seeded order and ``r = round(share · n)`` repeats (at most ``n − 1``), each a fresh instance of an
original drawn at random (seeded, with replacement), placed at a random point after its original,
with its own request id (``<original id>-rep<k>``). A fresh instance has its own tools and
state, so a repeat runs the same program on the same inputs: exactly what C1 can serve.

:class:`ShapedWorkload` hands that stream to everything that draws requests from the
workload — the driver's measured stream, the oracle's offline run, InstCache's
pre-population — so they all see the same requests (:func:`shaped`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

from dynbranch.workload import DataConfig, RequestInstance

Shape = Callable[[Any, DataConfig, int, int, str], Sequence[RequestInstance]]
"""(inner workload, data, n, seed, split) → the stream of n requests."""


def repetition_stream(
    workload: Any, data: DataConfig, n: int, seed: int, split: str, share: float
) -> list[RequestInstance]:
    """``n`` requests of which ``round(share · n)`` (at most ``n − 1``) exactly repeat an
    earlier one."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"exact-replay share must be in [0, 1), got {share}")
    # NOTE: at least one original, so a one-request stream has nothing to repeat
    repeats = min(round(share * n), max(0, n - 1))
    unique = n - repeats
    originals = list(workload.requests(data, unique, seed, split))
    rng = random.Random(f"repetition|{seed}|{share}")
    picks = [rng.randrange(unique) for _ in range(repeats)]
    copies: dict[int, int] = {}
    keyed: list[tuple[float, int, RequestInstance]] = [
        (float(i), 0, r) for i, r in enumerate(originals)
    ]
    fresh: list[list[RequestInstance]] = []  # fresh[k]: the k-th set of fresh copies
    for j in picks:
        k = copies.get(j, 0) + 1
        copies[j] = k
        while len(fresh) < k:
            fresh.append(list(workload.requests(data, unique, seed, split)))
        copy = fresh[k - 1][j]
        copy.request_id = f"{originals[j].request_id}-rep{k}"
        # NOTE: strictly after the original (its position j), anywhere up to the end
        keyed.append((rng.uniform(j + 0.5, unique), k, copy))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


class ShapedWorkload:
    """A workload whose ``requests`` is a shaped stream; everything else is the inner
    workload's (attributes are delegated)."""

    def __init__(self, inner: Any, shape: Shape, label: str) -> None:
        self._inner, self._shape, self.label = inner, shape, label

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def requests(
        self, data: DataConfig, n: int, seed: int, split: str = "test"
    ) -> Sequence[RequestInstance]:
        return self._shape(self._inner, data, n, seed, split)


def shaped(prepared: Any, shape: Shape, label: str) -> Any:
    """``prepared`` (a :class:`~dynbranch.driver.Prepared`) with its workload shaped and its
    instances redrawn from the shaped workload (same count, same seed, same arrivals)."""
    workload = ShapedWorkload(prepared.workload, shape, label)
    cfg = prepared.config
    instances = list(workload.requests(prepared.data, cfg.requests, cfg.seed, cfg.split))
    if len(instances) != len(prepared.arrivals):
        raise ValueError(
            f"shaped stream {label}: {len(instances)} requests for "
            f"{len(prepared.arrivals)} arrivals"
        )
    return dataclasses.replace(prepared, workload=workload, instances=instances)


def repeating(share: float) -> Shape:
    """The :data:`Shape` of a stream with exact-replay share ``share``."""

    def shape(inner: Any, data: DataConfig, n: int, seed: int, split: str) -> list[RequestInstance]:
        return repetition_stream(inner, data, n, seed, split, share)

    return shape


def exact_replay_share(instances: Sequence[RequestInstance]) -> float:
    """The measured share of requests whose id marks them as a repeat of an earlier one."""
    if not instances:
        return 0.0
    return sum("-rep" in r.request_id for r in instances) / len(instances)
