"""The baseline systems, re-implemented as arms of our stack (``BASELINES.md``).

Each baseline is a set of small policies over the mechanisms the stack already has, so it
runs on the same engines, driver, workloads and result files as DynBranch itself:

* ``helium`` (:mod:`~dynbranch.baselines.helium`): prefix-affinity placement
  (:class:`PrefixAffinity`) plus C1's store as an exact per-operator result cache without
  read-sets — it may serve stale results, which the splice checker counts.
* ``instcache`` (:mod:`~dynbranch.baselines.instcache`): a whole-request exact cache
  (:class:`RequestCache`) pre-populated offline (:mod:`~dynbranch.baselines.offline`) from
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
:func:`dsp_arm` and :func:`spagent_arm`; this package never
imports :mod:`dynbranch.arms` at import time, so ``dynbranch.arms`` may list them.
"""

from dynbranch.baselines.dsp import (
    DSP_DESCRIPTION,
    DepthLearner,
    DepthOutcome,
    DSPConfig,
    DSPPolicy,
    DSPReuseHook,
    DSPSpeculator,
    dsp_arm,
    dsp_branch,
    dsp_reuse,
)
from dynbranch.baselines.helium import (
    HELIUM_DESCRIPTION,
    HeliumReuseHook,
    helium_arm,
    helium_reuse,
)
from dynbranch.baselines.instcache import (
    DEFAULT_TRAIN_REQUESTS,
    INSTCACHE_DESCRIPTION,
    REQUEST_INPUTS,
    CachedRequest,
    InstCacheHook,
    RequestCache,
    RequestKey,
    instcache_arm,
    instcache_reuse,
    request_input,
    request_key,
)
from dynbranch.baselines.offline import (
    OfflineContext,
    Precomputed,
    PrecomputedStage,
    precompute,
    replay_generate,
)
from dynbranch.baselines.parrot import (
    PARROT_DESCRIPTION,
    ParrotConfig,
    ParrotPlacement,
    PrefixMatcher,
    parrot_arm,
)
from dynbranch.baselines.placement import AffinityConfig, PrefixAffinity
from dynbranch.baselines.spagent import (
    SPAGENT_DESCRIPTION,
    LoadThrottle,
    SPAgentConfig,
    SPAgentPolicy,
    SPAgentReuseHook,
    SPAgentSpeculator,
    spagent_arm,
    spagent_branch,
    spagent_reuse,
)

__all__ = [
    "DEFAULT_TRAIN_REQUESTS", "DSP_DESCRIPTION", "HELIUM_DESCRIPTION", "INSTCACHE_DESCRIPTION",
    "PARROT_DESCRIPTION", "REQUEST_INPUTS", "SPAGENT_DESCRIPTION", "AffinityConfig",
    "CachedRequest", "DSPConfig", "DSPPolicy", "DSPReuseHook", "DSPSpeculator", "DepthLearner",
    "DepthOutcome", "HeliumReuseHook", "InstCacheHook", "LoadThrottle", "OfflineContext",
    "ParrotConfig", "ParrotPlacement", "Precomputed", "PrecomputedStage", "PrefixAffinity",
    "PrefixMatcher", "RequestCache", "RequestKey", "SPAgentConfig", "SPAgentPolicy",
    "SPAgentReuseHook", "SPAgentSpeculator", "dsp_arm", "dsp_branch", "dsp_reuse", "helium_arm",
    "helium_reuse", "instcache_arm", "instcache_reuse", "parrot_arm", "precompute",
    "replay_generate", "request_input", "request_key", "spagent_arm", "spagent_branch",
    "spagent_reuse",
]
