"""An arm: a named configuration of the stack, as factories of its hooks and placement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dynbranch.fill.hook import BranchHook
from dynbranch.reuse.hook import ReuseHook
from dynbranch.reuse.store_hook import StoreReuseHook
from dynbranch.runtime.placement import PlacementPolicy
from dynbranch.runtime.run import RunContext


@dataclass(frozen=True)
class Arm:
    """A named configuration of the stack: factories of its hooks and placement policy."""

    name: str
    description: str
    make_reuse: Callable[[RunContext], ReuseHook]
    make_branch: Callable[[RunContext, ReuseHook], BranchHook]
    make_placement: Callable[[], PlacementPolicy]


def store_hook(run: RunContext, **options) -> StoreReuseHook:
    """A :class:`~dynbranch.reuse.store_hook.StoreReuseHook` over the run's store
    (``options``: ``track_reads``, ``cross_request``, ``name``)."""
    if run.make_store is None:
        raise ValueError(f"the {run.arm} arm needs a store; the backend provides none")
    return StoreReuseHook(run.make_store(), run, **options)
