"""Arms: one flag that sets which mechanisms and baselines a run uses.

An arm is a small named object that builds the hooks and the placement policy for a run.
``floor`` is the reference of every measurement: the same stack with cross-request reuse
and speculation off (engines keep their own prefix caching).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dynbranch.errors import NotBuiltError, UnknownNameError
from dynbranch.hooks import BranchHook, NoReuse, NoSpeculation, ReuseHook
from dynbranch.placement import LeastOutstanding, PlacementPolicy


@dataclass(frozen=True)
class Arm:
    """A named configuration of the stack."""

    name: str
    description: str
    make_reuse: Callable[[], ReuseHook]
    make_branch: Callable[[], BranchHook]
    make_placement: Callable[[], PlacementPolicy]


BUILT: dict[str, Arm] = {
    "floor": Arm("floor", "no cross-request reuse, no speculation (the reference)",
                 NoReuse, NoSpeculation, LeastOutstanding),
}

PLANNED = ("c1", "c2", "full", "instcache", "helium", "parrot", "dsp", "spagent")


def get_arm(name: str) -> Arm:
    """The arm called ``name``; a typed error naming what exists otherwise."""
    if name in BUILT:
        return BUILT[name]
    if name in PLANNED:
        raise NotBuiltError("arm", name, list(BUILT))
    raise UnknownNameError("arm", name, [*BUILT, *PLANNED])
