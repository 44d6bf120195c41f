"""The baseline systems, re-implemented as arms of our stack (``BASELINES.md``).

Each baseline is a set of small policies over the mechanisms the stack already has, so it
runs on the same engines, driver, workloads and result files as DynBranch itself:

* ``helium`` (:mod:`~dynbranch.baselines.helium`): prefix-affinity placement
  (:class:`PrefixAffinity`) plus C1's store as an exact per-operator result cache without
  read-sets — it may serve stale results, which the splice checker counts.
* ``instcache`` (:mod:`~dynbranch.baselines.instcache`): a whole-request exact cache
  (:class:`RequestCache`) pre-populated offline (:mod:`~dynbranch.runtime.offline`) from
  the workload's train split.
* ``parrot`` (:mod:`~dynbranch.baselines.parrot`): the floor's hooks with prefix-context
  placement under a latency task cap (:class:`ParrotPlacement`); no reuse, no fills.
* ``dsp`` (:mod:`~dynbranch.baselines.dsp`): the top-1 predicted path filled ``k`` stages
  ahead, ``k`` learned online per branch stage (:class:`DepthLearner`); request-scoped
  shadows, no load pricing.
* ``spagent`` (:mod:`~dynbranch.baselines.spagent`): the top-1 predicted next action
  filled into a request-scoped buffer when engine load is under a threshold
  (:class:`LoadThrottle`).

Each module's docstring says what was taken from the system's paper and what was decided
here. The arms come from :func:`helium_arm`, :func:`instcache_arm`, :func:`parrot_arm`,
:func:`dsp_arm` and :func:`spagent_arm`; each builds on :mod:`dynbranch.arms.base`, and
:mod:`dynbranch.arms.registry` lists them.
"""

from dynbranch.baselines.dsp import (
    DSP_DESCRIPTION,
    DepthLearner,
    DepthOutcome,
    DSPConfig,
    DSPDepth,
    DSPPolicy,
    dsp_arm,
)
from dynbranch.baselines.helium import HELIUM_DESCRIPTION, HeliumReuseHook, helium_arm
from dynbranch.baselines.instcache import (
    INSTCACHE_DESCRIPTION,
    CachedRequest,
    InstCacheConfig,
    InstCacheHook,
    RequestCache,
    instcache_arm,
)
from dynbranch.baselines.parrot import PARROT_DESCRIPTION, ParrotConfig, ParrotPlacement, parrot_arm
from dynbranch.baselines.spagent import (
    SPAGENT_DESCRIPTION,
    LoadThrottle,
    SPAgentConfig,
    SPAgentPolicy,
    StopAfterSearch,
    spagent_arm,
)
from dynbranch.runtime.affinity import AffinityConfig, PrefixAffinity

__all__ = [
    "DSP_DESCRIPTION", "HELIUM_DESCRIPTION", "INSTCACHE_DESCRIPTION", "PARROT_DESCRIPTION",
    "SPAGENT_DESCRIPTION", "AffinityConfig", "CachedRequest", "DSPConfig", "DSPDepth",
    "DSPPolicy", "DepthLearner", "DepthOutcome", "HeliumReuseHook", "InstCacheConfig",
    "InstCacheHook", "LoadThrottle", "ParrotConfig", "ParrotPlacement", "PrefixAffinity",
    "RequestCache", "SPAgentConfig", "SPAgentPolicy", "StopAfterSearch", "dsp_arm",
    "helium_arm", "instcache_arm", "parrot_arm", "spagent_arm",
]
