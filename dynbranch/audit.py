"""The splice checker: written apart from the code that splices, reading only what it records.

A stage served from a record (``served_from`` other than ``exec``) is an **unsafe splice**
when either

* its value differs from what canonical execution of that stage, on its recorded input,
  returns at the moment it is served (the orchestrator re-executes every served stage out
  of band: the replay oracle for LLM stages, the tool itself on the request's state as it
  is now for tool stages), or
* it is **stale**: no execution of that tool call that produced the served value read
  versions still current when the stage was looked up, by the checker's own write
  timeline; or the re-execution now reads other versions than that execution read.

:class:`SpliceAudit` keeps that timeline. The stage executor reports every tool call to it
the moment the call returns, with the reads and writes the tool itself reported: that is
when a write takes effect for everyone else (tools run synchronously on the event loop, so
nothing can observe an effect earlier), before C1 hears of it and whatever C1 makes of it.
A call that raised counts as having written what it declared. The checker never reads the
store, the reuse hook or a served record's read-set, so a bug in any of them cannot hide
from it.

Its verdict on each served stage goes on the stage's row (``audit_verdict``, with the
evidence in ``audit_note``): ``safe``, ``unsafe``, or ``unverified`` when the audit's own
re-execution raised, so the value could not be checked (and the timeline found it fresh):
counted apart, never as unsafe. :func:`unsafe_splices` and :func:`unverified_splices`
count them over the stage log.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dynbranch.canonical import value_digest
from dynbranch.runtime.runlog import StageRecord
from dynbranch.runtime.stage import StageCall
from dynbranch.workload import ToolResult, WriteSet

SAFE, UNSAFE, UNVERIFIED = "safe", "unsafe", "unverified"
"""Verdicts on a served stage (``""``: not audited, e.g. a real engine's LLM stage)."""

ANY_RESOURCE = "*"
"""The timeline's name for a write that may have changed any resource."""


@dataclass(frozen=True, slots=True)
class Rerun:
    """What the audit's out-of-band re-execution of a served stage returned now.

    ``digest`` of its value (``""``: not re-executed); ``reads``: the reads a tool stage
    made now, as its tool reported them; ``error``: it raised (nothing could be checked).
    """

    digest: str = ""
    reads: Mapping[str, str] | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The checker's verdict on one served stage, and the evidence for it."""

    verdict: str = ""  # SAFE | UNSAFE | UNVERIFIED | "" (not audited)
    note: str = ""


@dataclass(frozen=True, slots=True)
class _Call:
    """One tool call the checker witnessed: when, by whom, what it read and returned."""

    seq: int
    at: float
    request_id: str
    digest: str
    reads: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Effects:
    """The witnessed writes of one resource, in order (parallel lists, for bisection)."""

    seqs: list[int] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)


class SpliceAudit:
    """The splice checker's witness of every tool call, and its verdicts on served stages.

    Sequence numbers, not clock times, order what it saw: on the virtual clock a write and
    a lookup often share one instant.
    """

    def __init__(self) -> None:
        self._seq = 0
        self._effects: dict[str, _Effects] = defaultdict(_Effects)
        self._productions: dict[tuple[str, str], list[_Call]] = defaultdict(list)
        self._digests: dict[str, str] = {}  # value digests seen, each kept once
        self._reads: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}  # read-sets, once

    def mark(self) -> int:
        """A point in the witnessed order: everything seen so far is at or before it."""
        return self._seq

    # -- the witness (fed by the stage executor) --------------------------------------------

    def called(self, call: StageCall, result: ToolResult, at: float) -> None:
        """A tool call returned at ``at`` (seconds since the run's start): its writes took
        effect now, and its value was produced from its reads."""
        seen = self._next(call, at, value_digest(result.value), result.reads)
        self._productions[_key(call)].append(seen)
        for resource, version in result.writes.items():
            self._wrote(resource, seen, version)

    def raised(self, call: StageCall, write_set: WriteSet, at: float) -> None:
        """A tool call raised at ``at``: it may have written what it declared before."""
        seen = self._next(call, at, "", {})
        for resource in [ANY_RESOURCE] if write_set.unbounded else sorted(write_set.resources):
            self._wrote(resource, seen, None)

    # -- verdicts --------------------------------------------------------------------------

    def check(self, call: StageCall, served_digest: str, issued: int, rerun: Rerun) -> Verdict:
        """The verdict on ``call`` served a value of digest ``served_digest`` by a lookup
        issued at mark ``issued``, given what the audit's re-execution returned now."""
        if call.stage.kind != "tool":
            return _by_value(served_digest, rerun)
        producers = [p for p in self._productions.get(_key(call), ()) if p.digest == served_digest]
        if not producers:
            return Verdict(UNSAFE, "no witnessed execution of this call produced the value")
        fresh = [p for p in reversed(producers) if not self._overwritten(p, issued)]
        if not fresh:
            return Verdict(UNSAFE, self._stale_note(producers[-1], issued))
        by_value = _by_value(served_digest, rerun)
        if by_value.verdict != SAFE:
            return by_value
        agreeing = self._agreeing(fresh, issued, rerun)
        if agreeing is None:
            return Verdict(
                UNSAFE,
                f"stale: re-execution now reads {dict(rerun.reads or {})}; the executions "
                f"that produced the value read {[dict(p.reads) for p in fresh[:3]]}",
            )
        return Verdict(SAFE, f"produced by {agreeing.request_id} at t={agreeing.at:.6f}")

    # -- internals -------------------------------------------------------------------------

    def _next(self, call: StageCall, at: float, digest: str, reads: Mapping[str, str]) -> _Call:
        self._seq += 1
        # NOTE: the witness keeps every call it saw, and most calls repeat an earlier one's
        # value and reads (a request repeated, a read-only turn): those share one string and
        # one mapping, so what the witness holds per call is the call's own seq and time.
        digest = self._digests.setdefault(digest, digest)
        items = tuple(reads.items())
        try:
            kept = self._reads.get(items)
            if kept is None:
                kept = self._reads[items] = dict(reads)
        except TypeError:  # NOTE: an unhashable version: kept as its own copy
            kept = dict(reads)
        return _Call(self._seq, at, call.request_id, digest, kept)

    def _wrote(self, resource: str, seen: _Call, version: str | None) -> None:
        effects = self._effects[resource]
        effects.seqs.append(seen.seq)
        effects.calls.append(seen)
        effects.versions.append(version)

    def _writes_between(
        self, resources: Iterable[str], after: int, upto: int | None
    ) -> tuple[str, _Call, str | None] | None:
        """The first witnessed write of one of ``resources`` (or of any resource) with a
        sequence number in ``(after, upto]`` (``upto=None``: up to now)."""
        for resource in (*resources, ANY_RESOURCE):
            effects = self._effects.get(resource)
            if effects is None:
                continue
            i = bisect.bisect_right(effects.seqs, after)
            if i < len(effects.seqs) and (upto is None or effects.seqs[i] <= upto):
                return resource, effects.calls[i], effects.versions[i]
        return None

    def _overwritten(self, p: _Call, issued: int) -> tuple[str, _Call, str | None] | None:
        """A write of what ``p`` read that took effect after ``p`` read it and before the
        lookup was issued. NOTE: a lookup served an execution that ran while it waited (a
        join) was served a value current within its own span: such a ``p`` is fresh."""
        if p.seq >= issued:
            return None
        return self._writes_between(p.reads, p.seq, issued)

    def _agreeing(self, fresh: list[_Call], issued: int, rerun: Rerun) -> _Call | None:
        """A fresh producer whose reads agree with the re-execution's on every resource both
        read (another request's call may read other resources: only the value compares).

        NOTE: a write witnessed since the lookup explains any disagreement (the stage may
        have been served just before it took effect), so then the first fresh one agrees.
        """
        if rerun.reads is None or any(
            self._writes_between(p.reads, max(issued, p.seq), None) for p in fresh
        ):
            return fresh[0]
        now = rerun.reads
        for p in fresh:
            if all(now[r] == v for r, v in p.reads.items() if r in now):
                return p
        return None

    def _stale_note(self, p: _Call, issued: int) -> str:
        resource, writer, version = self._overwritten(p, issued)
        return (
            f"stale: {resource} read at version {p.reads.get(resource)!r} by "
            f"{p.request_id} at t={p.at:.6f}, then written (version {version!r}) by "
            f"{writer.request_id} at t={writer.at:.6f}, before the lookup"
        )


def _key(call: StageCall) -> tuple[str, str]:
    """Executions of one call: the same stage (fingerprint) on the same rendered input."""
    return call.fingerprint, call.rendered.input_digest


def _by_value(served_digest: str, rerun: Rerun) -> Verdict:
    if rerun.error:
        return Verdict(UNVERIFIED, f"audit could not re-execute: {rerun.error}")
    if not rerun.digest:
        return Verdict()
    if rerun.digest != served_digest:
        return Verdict(UNSAFE, "value differs from canonical execution now")
    return Verdict(SAFE)


# -- counting over the stage log -------------------------------------------------------------


def unsafe_splices(stages: Iterable[StageRecord]) -> list[StageRecord]:
    """The served stages that are unsafe (see the module docstring).

    A served row without a verdict (a whole request served by a request cache) is unsafe
    when its ``audit_digest`` differs from its value.
    """
    return [
        s
        for s in stages
        if s.served_from != "exec"
        and (
            s.audit_verdict == UNSAFE
            or (not s.audit_verdict and bool(s.audit_digest) and s.audit_digest != s.output_digest)
        )
    ]


def unverified_splices(stages: Iterable[StageRecord]) -> list[StageRecord]:
    """The served stages the audit could not re-execute (not counted as unsafe)."""
    return [s for s in stages if s.served_from != "exec" and s.audit_verdict == UNVERIFIED]
