"""The ``instcache`` arm: InstCache, a whole-request exact cache pre-populated from predictions.

**Taken from InstCache** (Zou et al., 2024, arXiv 2411.13820): an exact-match cache, a hash
table in front of the serving engines, keyed on the complete instruction. A hit returns the
stored response and touches no engine; a miss goes to the engines unchanged. The cache is
*pre-populated* offline: an instruction-aligned model enumerates likely instructions, their
responses are computed ahead of time, and a likelihood threshold sets how many are kept.
There is no reuse below the instruction, no freshness check and no early fill.

**Decided here.**

* *Predicted requests* are the workload's ``train`` split (``Workload.requests(...,
  split="train")``), never the evaluated requests: the split is our instruction model's
  enumeration. The cache size, InstCache's likelihood threshold, is the number of train
  requests drawn (``train_requests``, from :class:`InstCacheConfig` in the run's
  ``RunContext.arm_config``). Draws past
  the split's pool repeat and are counted as ``duplicates``.
* An agentic request's *response* is its whole run: its outcome and every stage's output,
  computed by :func:`~dynbranch.runtime.offline.precompute` (the text a replay engine
  emits, tools on the train request's own state), charging no time on the run's clock.
* Its *entire input* is :func:`request_input`: the instance's ``request_input()`` when it
  has one (a method we propose for :class:`~dynbranch.workload.RequestInstance`, ``None``
  meaning "not cacheable"), else an adapter for its template (:data:`REQUEST_INPUTS`). The
  key is the canonical encoding of that input with the template's identity (name, version,
  every stage's fingerprint); its SHA-256 finds an entry, and the full key bytes are
  compared on every hit, so a digest collision reads as a miss.
* Nothing is added at run time: a miss executes as on the floor and is not kept.
* A program that waits on a person (a human stage) is not pre-populated: its input is not
  complete until the person acts. On HCI the arm therefore runs as the floor — the nearest
  meaningful behaviour, to be said so in reports.
* A request whose precomputed run made a call with external effects is cached and served
  like any other (InstCache knows no effects; a hit skips those calls), and counted
  (``effectful_entries``, ``hits_effectful``) so a report can say how often.
* A served request's stages are logged as ``cache`` rows of zero duration, each with the
  splice checker's audit digest where canonical execution can be reproduced out of band:
  an LLM stage's from the served request's replay oracle on the cached input; a tool
  stage's by calling it again on the served request's state as it is now — but only when
  the cached run made no write, since otherwise the state it read was built by the
  request's own earlier calls, which a hit never makes (such hits are ``hits_effectful``).
  So a whole request served stale after another request's write is counted as unsafe.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dynbranch.arms.base import Arm
from dynbranch.canonical import canonical_bytes, value_digest
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.engines.scheduler import replayed_text
from dynbranch.errors import ConfigError
from dynbranch.fill import NoSpeculation
from dynbranch.reuse.hook import ReuseHook, WholeRequest
from dynbranch.runtime.offline import (
    Generate,
    Precomputed,
    PrecomputedStage,
    precompute,
    replay_generate,
)
from dynbranch.runtime.placement import PlacementPolicy
from dynbranch.runtime.run import RunContext
from dynbranch.runtime.runlog import StageRecord
from dynbranch.workload import DataConfig, RequestInstance, Workload

INSTCACHE_DESCRIPTION = ("InstCache: whole-request exact cache pre-populated from the train "
                         "split; no sub-request reuse, no freshness, no fills")
DEFAULT_TRAIN_REQUESTS = 1024
"""Train requests drawn to pre-populate: the cache size when the run sets none."""
KEY_SCHEMA = 1


# -- the entire input of a request ------------------------------------------------------------


def _routing_input(instance: Any) -> dict[str, Any]:
    """Routing: the BFCL record's user turns, function docs, API classes and initial config."""
    record = instance.record
    return {"turns": list(record.turns), "functions": [dict(f) for f in record.functions],
            "classes": list(record.classes), "initial_config": dict(record.initial_config)}


def _question_input(instance: Any) -> dict[str, Any]:
    """ReAct and Sub-Agent: the MuSiQue question (the corpus is the workload's, fixed)."""
    return {"question": instance.record.question}


REQUEST_INPUTS: dict[str, Callable[[Any], Any]] = {
    "routing": _routing_input, "react": _question_input, "subagent": _question_input}
"""Adapters by template name, for workloads whose instances lack ``request_input()``.

NOTE: a stopgap read from the instances' public attributes (the core imports no workload);
once ``RequestInstance.request_input()`` exists, each workload answers for itself. HCI has
none on purpose: its requests wait on a person (see the module docstring).
"""


def request_input(instance: RequestInstance) -> Any | None:
    """The request's entire input as its workload defines it, or ``None`` if not cacheable.

    The instance's own ``request_input()`` answers first; the template's adapter only where
    that is missing or says ``None`` (so adding the method to the base class with a
    ``None`` default keeps the adapters working until each workload has its own).
    """
    method = getattr(instance, "request_input", None)
    value = method() if callable(method) else None
    if value is None and (adapter := REQUEST_INPUTS.get(instance.template.name)) is not None:
        value = adapter(instance)
    return value


@dataclass(frozen=True)
class RequestKey:
    """A request's identity in the cache: the digest that finds it, the bytes that prove it."""

    name: str
    key_bytes: bytes


def request_key(instance: RequestInstance) -> RequestKey | None:
    """The cache key of ``instance``, or ``None`` when its input has no canonical encoding."""
    value = request_input(instance)
    if value is None:
        return None
    template = instance.template
    identity = {"schema": KEY_SCHEMA, "template": template.name, "version": template.version,
                "stages": {s: template.fingerprint(s) for s in template.stages}, "input": value}
    try:
        kb = canonical_bytes(identity)
    except TypeError:
        return None
    return RequestKey("instcache:" + hashlib.sha256(kb).hexdigest(), kb)


# -- the cache ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CachedRequest:
    """One pre-populated request: its key and its precomputed run."""

    key: RequestKey
    run: Precomputed

    def outcome(self) -> Any:
        """A private copy of the outcome (a scorer may not alter what the next hit gets)."""
        return copy.deepcopy(self.run.outcome)

    def stage_records(self, instance: RequestInstance, at: float, *, audit: bool = True,
                      context_limit: int | None = None) -> list[StageRecord]:
        """One ``cache`` row per cached stage, served to ``instance`` at ``at`` in no time."""
        rows = []
        for seq, s in enumerate(self.run.stages):
            rows.append(StageRecord(
                request_id=instance.request_id, stage=s.stage, kind=s.kind, seq=seq,
                coordinate=s.coordinate, start=at, end=at, served_from="cache",
                reuse_name=self.key.name, fingerprint=s.fingerprint,
                input_digest=s.rendered.input_digest,
                output_digest=value_digest(s.output) if s.output is not None else "",
                audit_digest=self._audit(instance, s, context_limit) if audit else ""))
        return rows

    def _audit(self, instance: RequestInstance, stage: PrecomputedStage,
               context_limit: int | None) -> str:
        """What canonical execution of ``stage`` for ``instance`` would return now (the
        splice checker's reference; see the module docstring for when there is none): an
        LLM stage's replayed text cut as the replaying engine cuts it, at ``max_tokens`` and
        at the context (``context_limit``) left after the prompt."""
        if stage.kind == "llm":
            text = instance.replay_text(stage.rendered)
            if text is None:
                return ""
            max_tokens = instance.template.stage(stage.stage).sampling.max_tokens
            return value_digest(replayed_text(stage.rendered.text, text, max_tokens,
                                              context_limit))
        if stage.kind != "tool" or self.run.effectful:
            return ""
        try:
            value = instance.tool(stage.tool).call(stage.rendered.fields).value
        except Exception as e:
            return value_digest(f"audit raised {type(e).__name__}: {e}")
        return value_digest(value)


class RequestCache:
    """Whole requests by their entire input, filled once by :meth:`prepopulate`."""

    def __init__(self) -> None:
        self._entries: dict[str, CachedRequest] = {}
        self.counts = {"prepopulated": 0, "duplicates": 0, "uncacheable": 0, "interactive": 0,
                       "failed": 0, "effectful_entries": 0, "collisions": 0, "hits": 0,
                       "misses": 0, "uncacheable_lookups": 0, "hits_effectful": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> tuple[CachedRequest, ...]:
        """Every entry, in the order it was pre-populated."""
        return tuple(self._entries.values())

    async def prepopulate(self, instances: Iterable[RequestInstance],
                          generate: Generate = replay_generate, *,
                          tenant: str = "default") -> None:
        """Precompute and keep each request whose input is cacheable (see module docstring)."""
        for instance in instances:
            key = request_key(instance)
            if key is None:
                self.counts["uncacheable"] += 1
                continue
            held = self._entries.get(key.name)
            if held is not None:
                self.counts["duplicates" if held.key == key else "collisions"] += 1
                continue
            try:
                run = await precompute(instance, generate, tenant=tenant)
            except Exception:  # NOTE: a train request that cannot run is simply not predicted
                self.counts["failed"] += 1
                continue
            if run.interactive:
                self.counts["interactive"] += 1
                continue
            self._entries[key.name] = CachedRequest(key, run)
            self.counts["prepopulated"] += 1
            self.counts["effectful_entries"] += run.effectful

    def lookup(self, instance: RequestInstance) -> CachedRequest | None:
        """The entry whose entire input equals ``instance``'s, or ``None``."""
        key = request_key(instance)
        if key is None:
            self.counts["uncacheable_lookups"] += 1
            return None
        entry = self._entries.get(key.name)
        if entry is None or entry.key.key_bytes != key.key_bytes:
            self.counts["collisions"] += entry is not None
            self.counts["misses"] += 1
            return None
        self.counts["hits"] += 1
        self.counts["hits_effectful"] += entry.run.effectful
        return entry

    def stats(self) -> dict[str, int]:
        return {**self.counts, "entries": len(self._entries)}


# -- the arm ------------------------------------------------------------------------------------


class InstCacheHook(ReuseHook):
    """The arm's reuse hook: no stage is ever served (no sub-request reuse); the whole-request
    cache rides on it, so it lives exactly as long as the run and reports with it."""

    name = "instcache"

    def __init__(self, run: RunContext, *, train_requests: int = DEFAULT_TRAIN_REQUESTS,
                 cache: RequestCache | None = None) -> None:
        if train_requests < 0:
            raise ConfigError(f"instcache: train_requests={train_requests} must be >= 0")
        self.run, self.train_requests = run, train_requests
        self.cache = cache or RequestCache()

    def serve_request(self, instance: RequestInstance, at: float, *,
                      audit: bool) -> WholeRequest | None:
        """The whole request from the cache (one ``cache`` row per cached stage, served at
        ``at`` in no time), or ``None`` to run it."""
        entry = self.cache.lookup(instance)
        if entry is None:
            return None
        rows = entry.stage_records(instance, at, audit=audit,
                                   context_limit=self.run.replay_context)
        return WholeRequest(rows, entry.outcome())

    async def prepopulate(self, workload: Workload, data: DataConfig | None, seed: int, *,
                          measured_split: str = "test",
                          generate: Generate | None = None) -> None:
        """Fill the cache from ``train_requests`` requests of ``workload``'s train split
        (``generate``: by default what the run's replaying engine returns, its text cut at
        ``max_tokens`` and at the context left after the prompt)."""
        if measured_split == "train":
            raise ConfigError("instcache pre-populates from the train split; "
                              "measure it on the test split")
        instances = workload.requests(data, self.train_requests, seed, split="train")
        await self.cache.prepopulate(instances, generate or self._replayed,
                                     tenant=self.run.tenant)

    async def _replayed(self, request: GenerateRequest) -> str:
        if request.replay_text is None:
            return await replay_generate(request)  # NOTE: raises the engine's error
        return replayed_text(request.prompt, request.replay_text, request.max_tokens,
                             self.run.replay_context)

    def stats(self) -> dict[str, Any]:
        return {**self.cache.stats(), "train_requests": self.train_requests}


@dataclass(frozen=True)
class InstCacheConfig:
    """Settings of the ``instcache`` arm: how many train-split requests it pre-populates."""

    train_requests: int = DEFAULT_TRAIN_REQUESTS


def instcache_reuse(run: RunContext) -> InstCacheHook:
    """The ``instcache`` arm's hook, sized by the run's :class:`InstCacheConfig`."""
    config = run.arm_config if isinstance(run.arm_config, InstCacheConfig) else InstCacheConfig()
    return InstCacheHook(run, train_requests=config.train_requests)


def instcache_arm(make_placement: Callable[[], PlacementPolicy]) -> Arm:
    """The ``instcache`` arm, placing calls with ``make_placement``: pass the floor's policy,
    since InstCache sits in front of the same engines and changes nothing behind a miss."""
    return Arm("instcache", INSTCACHE_DESCRIPTION, instcache_reuse, NoSpeculation,
               make_placement)
