"""The ``helium`` arm: Helium⁺, cache-aware scheduling plus an exact per-operator result cache.

**Taken from Helium** (Wadlom et al., 2026, arXiv 2603.16104), as the paper's Helium⁺ runs
it: a workflow is a query plan whose LLM calls are first-class operators; the scheduler
places each operator on the worker that holds its prompt prefix (Helium's templated radix
tree, here :class:`~dynbranch.runtime.affinity.PrefixAffinity`), on the concurrent
dispatch path the other arms use; and a global cache answers an operator whose own input
equals one already computed, so it is never executed twice (Helium's prompt cache). Its
common-subgraph elimination merges equal operators of concurrent queries, so an operator
equal to one *in flight* waits for it and is served its result (``join``).

**Decided here.**

* The result cache is C1's store and hook with read-set tracking off
  (:class:`~dynbranch.reuse.store_hook.StoreReuseHook` with ``track_reads=False``): the key is
  the operator's own input as C1 names it (fingerprint, complete rendered input, model
  and revision, sampling parameters, tool schema version, tenant), records carry no
  read-set and no provenance, and writes are ignored, so nothing is ever invalidated.
  After a write, an operator whose input did not change is served its pre-write result —
  Helium has no notion of external state, and the stale results it serves are counted by
  the independent splice checker (:mod:`dynbranch.audit`), never hidden.
* "Operators" include tool calls a tool declares read-only, as C1's do: the comparison with
  C1 then differs only in freshness, which is the point of the baseline. LLM operators
  alone could never be stale (their rendered input is their whole dependency closure); a
  read-only tool call keyed on its input can.
* The templated radix tree becomes per-engine LRU sets of chained prefix-block hashes,
  and its cost model a match-fraction threshold plus a load guard (settings and reasons in
  :class:`~dynbranch.runtime.affinity.AffinityConfig`).
* No speculation and no fills, so no shadows exist; the store, the capacity and the
  eviction policy are the run's (``--store-mb``, ``--eviction``), as for ``c1``.
* Helium's proactive KV pre-warming of static prompt prefixes is left to the engines'
  own prefix caching, which every arm has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynbranch.arms.base import Arm
from dynbranch.fill import NoSpeculation
from dynbranch.reuse.names import HashFn, sha256hex
from dynbranch.reuse.store_hook import StoreReuseHook
from dynbranch.runtime.affinity import PrefixAffinity
from dynbranch.runtime.run import RunContext

HELIUM_DESCRIPTION = ("Helium+: prefix-affinity placement plus an exact per-operator result "
                      "cache with no read-set tracking (may serve stale results), no fills")


class HeliumReuseHook(StoreReuseHook):
    """C1's hook without freshness: serves equal operators, never invalidates, counts writes
    it ignored (``writes_ignored``) so a report can set them beside the stale splices."""

    name = "helium"

    def __init__(self, store, run: RunContext, *, hash_fn: HashFn = sha256hex) -> None:
        super().__init__(store, run, track_reads=False, hash_fn=hash_fn)
        self.counts["writes_ignored"] = 0

    async def writes(self, request_id: str, writes: Mapping[str, str]) -> None:
        self.counts["writes_ignored"] += len(writes)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "track_reads": False}


def helium_reuse(run: RunContext) -> HeliumReuseHook:
    """The ``helium`` arm's reuse hook over the run's store."""
    if run.make_store is None:
        raise ValueError(f"the {run.arm} arm needs a store; the backend provides none")
    return HeliumReuseHook(run.make_store(), run)


def helium_arm() -> Arm:
    """The ``helium`` arm."""
    return Arm("helium", HELIUM_DESCRIPTION, helium_reuse, NoSpeculation, PrefixAffinity)
