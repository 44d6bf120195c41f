"""The baseline systems, re-implemented as arms of our stack (``BASELINES.md``).

Each baseline is a set of small policies over the mechanisms the stack already has, so it
runs on the same engines, driver, workloads and result files as DynBranch itself:

* ``helium`` (:mod:`~dynbranch.baselines.helium`): prefix-affinity placement
  (:class:`PrefixAffinity`) plus C1's store as an exact per-operator result cache without
  read-sets — it may serve stale results, which the splice checker counts.
* ``instcache`` (:mod:`~dynbranch.baselines.instcache`): a whole-request exact cache
  (:class:`RequestCache`) pre-populated offline (:mod:`~dynbranch.baselines.offline`) from
  the workload's train split.

Each module's docstring says what was taken from the system's paper and what was decided
here. The arms come from :func:`helium_arm` and :func:`instcache_arm`; this package never
imports :mod:`dynbranch.arms` at import time, so ``dynbranch.arms`` may list them.
"""

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
from dynbranch.baselines.placement import AffinityConfig, PrefixAffinity

__all__ = [
    "DEFAULT_TRAIN_REQUESTS", "HELIUM_DESCRIPTION", "INSTCACHE_DESCRIPTION", "REQUEST_INPUTS",
    "AffinityConfig", "CachedRequest", "HeliumReuseHook", "InstCacheHook", "OfflineContext",
    "Precomputed", "PrecomputedStage", "PrefixAffinity", "RequestCache", "RequestKey",
    "helium_arm", "helium_reuse", "instcache_arm", "instcache_reuse", "precompute",
    "replay_generate", "request_input", "request_key",
]
