"""The ``parrot`` arm: Parrot, dataflow-aware serving with prefix-sharing placement, no reuse.

**Taken from Parrot** (Lin et al., OSDI 2024; github.com/microsoft/ParrotServe): an
application declares its LLM calls with *semantic variables*, which expose each request's
dataflow to the service. The service then (1) runs dependent calls as a DAG, issuing a
call the moment the variables it reads are ready, with no client round trip in between;
(2) deduces each call's performance objective from the DAG — a call whose output feeds an
end-to-end latency-critical result is latency-critical too — and lowers it to a
scheduling annotation (ParrotServe's ``TaskCreator``: latency ⇒ at most 4 tasks on the
engine it is dispatched to); (3) finds prompt prefixes shared across calls — a call's
parent context in its own chain, and *global* prefixes its ``PrefixMatcher`` detects when
more than 3 prompts share one (beyond the first 40 characters) — and dispatches a call
to an engine already holding its prefix context, so calls sharing a prefix are
co-located and batched (``GlobalScheduler._find_engine``: among engines that satisfy the
annotation, context-holding engines first). There is no result reuse and no speculation:
every call executes.

**How it maps onto the stack, and what is missing.**

* *DAG with asynchronous pipelining* is what the orchestrator already does for every arm:
  a request is one asyncio task that issues each stage as soon as its rendered input is
  ready, and a workflow's independent stages run concurrently (Routing's parallel
  handlers and Sub-Agent's sub-agents through ``asyncio.gather``); nothing round-trips to
  a client. Parrot adds nothing here, and nothing here is taken away from it.
* *Objective deduction* gives every call of our workloads the same objective: each
  request's latency is measured end to end, so every call is upstream of a
  latency-critical output. Its lowering — at most ``latency_task_cap = 4`` open calls on
  the engine a call goes to — is the load rule of :class:`ParrotPlacement`.
* *Prefix contexts* (:class:`ParrotPlacement`): a call's own chain context is its
  request's (the session's) last engine; global prefixes come from
  :class:`PrefixMatcher`, which follows ParrotServe's heuristic (bucket by the first 40
  characters, shrink to the common prefix, global once shared by more than 3 prompts),
  each remembering the engines it was dispatched to. A call goes to the least loaded
  engine under the cap that holds its session context, else one holding its global
  prefix, else any under the cap; with every engine at the cap, the least loaded.
* *Missing, by construction of the seam.* ``PlacementPolicy.choose`` returns an engine
  index and ``GenerateRequest`` is built by the orchestrator, so (a) a placement cannot
  hold a call back — Parrot keeps a call in its global queue while every engine is over
  the annotation; here the least loaded engine's own queue holds it; (b) no per-call
  priority can be set from the DAG (e.g. favouring calls of requests whose remaining
  dependent chain is longest) — every canonical call has the same priority. Both need a
  core change (a placement that returns ``(engine, priority)`` or may defer), which no
  arm has today. Parrot's shared-prefix attention kernel is an engine feature; the
  engines' prefix caching, which every arm has, stands in for its compute saving.

**Difference from Helium's** :class:`~dynbranch.runtime.affinity.PrefixAffinity`.
Helium models what each engine's KV cache *holds* — an LRU of chained prompt-block hashes
— and sends a call to the engine with the longest block match if it covers at least half
the prompt, within an imbalance guard. Parrot routes on *context identity* exposed by the
program: the call's own chain context and detected global prefixes, with no
match-fraction threshold, and its load rule is the absolute per-engine cap that its
latency objective lowers to, not an imbalance between engines.

**Decided here.** ParrotServe picks, among engines without a context, the one with the
*least* remaining token capacity, while its comment says "select the engine with the
most capacity"; we follow the stated intent (fewest open calls). ParrotServe also refuses
an engine whose configured token capacity (its KV budget) the call would exceed; a
placement sees no token counts, and at our profiles' KV pools (255k tokens on
``qwen3-32b@h200``) that check binds only far beyond 4 open calls, so the cap counts calls
only. Sessions and prefix buckets are remembered in bounded LRUs (``max_sessions``,
``max_prefix_buckets``).

NOTE: preferring context holders concentrates calls. When the only global prefix of a
workload is its template's static head, new requests go to the engines that first served
it, up to the cap, while others idle — ParrotServe's preference, kept as it is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

from dynbranch.arms.base import Arm
from dynbranch.engines.protocol import CANONICAL, GenerateRequest
from dynbranch.fill import NoSpeculation
from dynbranch.reuse.hook import NoReuse
from dynbranch.runtime.placement import Noting, NotingPlacement

PARROT_DESCRIPTION = ("Parrot: prefix-context placement (session chain and detected global "
                      "prefixes) under a latency task cap; no reuse, no fills")


@dataclass(frozen=True)
class ParrotConfig:
    """Settings of :class:`ParrotPlacement`; each is checked when the config is made.

    ``latency_task_cap`` (>= 1): open calls an engine may have for a latency-critical
    call to be sent there (ParrotServe lowers a latency objective to 4).
    ``min_prefix_chars`` (>= 1): characters a prompt must exceed to take part in global
    prefix detection, and the bucket key length (ParrotServe: 40). ``global_prefix_count``
    (>= 2): prompts that must share a prefix for it to become global (ParrotServe: more
    than 3). ``max_sessions``, ``max_prefix_buckets`` (>= 1): LRU bounds.
    """

    latency_task_cap: int = 4
    min_prefix_chars: int = 40
    global_prefix_count: int = 4
    max_sessions: int = 65_536
    max_prefix_buckets: int = 4_096

    def __post_init__(self) -> None:
        for name in ("latency_task_cap", "min_prefix_chars", "max_sessions",
                     "max_prefix_buckets"):
            if getattr(self, name) < 1:
                raise ValueError(f"ParrotConfig.{name}={getattr(self, name)} must be >= 1")
        if self.global_prefix_count < 2:
            raise ValueError(
                f"ParrotConfig.global_prefix_count={self.global_prefix_count} must be >= 2")


@dataclass
class PrefixEntry:
    """A candidate global prefix: how many prompts shared it, which engines were sent one."""

    count: int
    engines: set[int] = field(default_factory=set)


class PrefixMatcher:
    """Global prefix detection in ParrotServe's manner: prompts are bucketed by their first
    ``min_prefix_chars`` characters; a prompt that continues an entry's prefix with the same
    next character shrinks that entry to their common prefix and counts it; an entry
    shared by ``global_prefix_count`` prompts is a global prefix."""

    def __init__(self, config: ParrotConfig) -> None:
        self.config = config
        self._buckets: OrderedDict[str, dict[str, PrefixEntry]] = OrderedDict()

    def add(self, prompt: str) -> PrefixEntry | None:
        """Count ``prompt``; the entry that now covers it (``None`` if it is too short)."""
        lead = self.config.min_prefix_chars
        if len(prompt) <= lead:
            return None
        bucket = self._bucket(prompt[:lead])
        for prefix, entry in list(bucket.items()):
            if prefix[lead] != prompt[lead]:
                continue
            common = _common_prefix(prefix, prompt)
            entry.count += 1
            if common != prefix:  # the shared part is shorter: the entry shrinks to it
                del bucket[prefix]
                bucket[common] = entry
            return entry
        entry = bucket[prompt] = PrefixEntry(1)
        return entry

    def query(self, prompt: str) -> tuple[str, PrefixEntry] | None:
        """The global prefix ``prompt`` starts with, and its entry; ``None`` if none."""
        lead = self.config.min_prefix_chars
        bucket = self._buckets.get(prompt[:lead]) if len(prompt) > lead else None
        for prefix, entry in (bucket or {}).items():
            if entry.count >= self.config.global_prefix_count and prompt.startswith(prefix):
                return prefix, entry
        return None

    def _bucket(self, lead: str) -> dict[str, PrefixEntry]:
        bucket = self._buckets.get(lead)
        if bucket is None:
            bucket = self._buckets[lead] = {}
            while len(self._buckets) > self.config.max_prefix_buckets:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(lead)
        return bucket

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())


def _common_prefix(a: str, b: str) -> str:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return a[:i]


class ParrotPlacement(NotingPlacement):
    """Send a call to an engine under the latency cap that holds its prefix context: its
    session's chain context first, then its global prefix, else the least loaded."""

    name = "parrot"

    def __init__(self, config: ParrotConfig | None = None) -> None:
        self.config = config or ParrotConfig()
        self.prefixes = PrefixMatcher(self.config)
        self._home: OrderedDict[str, int] = OrderedDict()
        self.counts = {"session_context": 0, "global_prefix": 0, "no_context": 0,
                       "over_cap": 0, "speculative": 0}

    def place(self, outstanding: Sequence[float],
              request: GenerateRequest) -> tuple[int, Noting | None]:
        n = len(outstanding)
        if request.priority > CANONICAL:  # never issued by this arm; placed plainly
            self.counts["speculative"] += 1
            return _least(range(n), outstanding), None
        pool = [i for i in range(n) if outstanding[i] < self.config.latency_task_cap]
        if not pool:  # NOTE: Parrot would hold the call in its queue; see module docstring
            self.counts["over_cap"] += 1
            pool = list(range(n))
        return self._with_context(pool, outstanding, request), partial(self._remember, request)

    def _with_context(self, pool: list[int], outstanding: Sequence[float],
                      request: GenerateRequest) -> int:
        home = self._home.get(request.session) if request.session else None
        if home is not None and home in pool:
            self.counts["session_context"] += 1
            return home
        found = self.prefixes.query(request.prompt)
        holders = [i for i in pool if found is not None and i in found[1].engines]
        if holders:
            self.counts["global_prefix"] += 1
            return _least(holders, outstanding)
        self.counts["no_context"] += 1
        return _least(pool, outstanding)

    def _remember(self, request: GenerateRequest, engine: int) -> None:
        """Note that ``request`` was sent to ``engine``: its session's context and its prompt's
        prefix are held there now."""
        if request.session:
            self._home[request.session] = engine
            self._home.move_to_end(request.session)
            if len(self._home) > self.config.max_sessions:
                self._home.popitem(last=False)
        entry = self.prefixes.add(request.prompt)
        if entry is not None:
            entry.engines.add(engine)

    def stats(self) -> dict[str, int]:
        """How many calls went by session context, by global prefix, by load alone."""
        return dict(self.counts)


def _least(candidates: Iterable[int], outstanding: Sequence[float]) -> int:
    return min(candidates, key=lambda i: (outstanding[i], i))


def parrot_arm(config: ParrotConfig | None = None) -> Arm:
    """The ``parrot`` arm: the floor's hooks (no reuse, no fills) with Parrot's placement."""
    return Arm("parrot", PARROT_DESCRIPTION, NoReuse, NoSpeculation,
               lambda: ParrotPlacement(config))
