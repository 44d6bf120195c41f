"""Every arm by name: DynBranch's own and the baselines'."""

from __future__ import annotations

from dynbranch.arms.base import Arm
from dynbranch.arms.dynbranch_arms import C1, C2, FLOOR, FULL
from dynbranch.arms.oracle import ORACLE
from dynbranch.baselines import dsp_arm, helium_arm, instcache_arm, parrot_arm, spagent_arm
from dynbranch.errors import NotBuiltError, UnknownNameError
from dynbranch.runtime.affinity import AffinityPlacement

BUILT: dict[str, Arm] = {
    "floor": FLOOR,
    "c1": C1,
    "c2": C2,
    "full": FULL,
    "instcache": instcache_arm(AffinityPlacement),  # the floor's placement: only hits change
    "helium": helium_arm(),
    "parrot": parrot_arm(),
    "dsp": dsp_arm(),
    "spagent": spagent_arm(),
    "oracle": ORACLE,  # a bound (the trace's future), not a system
}

PLANNED: tuple[str, ...] = ()


def get_arm(name: str) -> Arm:
    """The arm called ``name``; a typed error naming what exists otherwise."""
    if name in BUILT:
        return BUILT[name]
    if name in PLANNED:
        raise NotBuiltError("arm", name, list(BUILT))
    raise UnknownNameError("arm", name, [*BUILT, *PLANNED])
