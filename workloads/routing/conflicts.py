"""Records that no single model could replay: one rendered input, two recorded answers.

The replay engine answers a router or handler stage with the trace's decision, and C1 and
C2 serve that answer to every request that renders the same input (the same reuse name).
That is only sound when the trace itself is a function of the input: two records whose
recorded paths render one input must record one answer there. The router and handler read
the workspace, the functions offered and the conversation (see
:mod:`workloads.routing.template`), which separates almost every BFCL record; what is left
are records whose input BFCL copied unchanged from another task while the ground truth
differs. In bfcl-eval 2026.3.23 (the pinned wheel): ``multi_turn_miss_param_180``, ``_195``
and ``_199`` keep the base task's first turn word for word (the "missing" parameter is still
in it) yet record no call (or another one) where ``multi_turn_base_*`` records the call;
three ``live_irrelevance`` records repeat a ``live_simple``/``live_multiple`` question and
its functions and record that no call is needed. A model that answers one answers the
other the same.

:func:`find_conflicts` traces every record along its recorded path
(:mod:`workloads.analysis.trace`, decisions only) and asks every other record that could
render those inputs to answer them too (on its own recorded path, or off it with a
plausible call); each record that answers one of them otherwise than a record before it
(in :data:`~workloads.routing.categories.CATEGORIES` order) is named. :data:`EXCLUDED` is
its answer on the pinned wheel; the workload leaves those records out of the pool, and a
test re-derives the list from the data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from dynbranch.decode_lengths import RECORDED
from workloads.analysis.trace import trace_request
from workloads.routing.apis import ApiSuite
from workloads.routing.record import Record
from workloads.routing.request import RoutingRequest

EXCLUDED: frozenset[str] = frozenset({
    # the base task's first turn kept word for word, another answer recorded
    "multi_turn_miss_param_180", "multi_turn_miss_param_195", "multi_turn_miss_param_199",
    # live_simple_29-7-2's, live_multiple_262-125-1's, live_simple_176-102-0's question and
    # functions, recorded as needing no call
    "live_irrelevance_118-7-8", "live_irrelevance_565-173-0", "live_irrelevance_567-175-0",
})
"""The records :func:`find_conflicts` names on the pinned bfcl-eval wheel, left out of the pool."""


def _path(record: Record, suite: ApiSuite | None) -> tuple[RoutingRequest, list]:
    """A decisions-only request for ``record`` and (rendered input, recorded answer) along
    its recorded path, for its router and handler stages."""
    request = RoutingRequest(f"conflicts-{record.id}", record, suite, decode=RECORDED)
    rendered = [r for r in trace_request(request).rendered if r.stage in ("router", "handler")]
    return request, [(r, request.replay_text(r)) for r in rendered]


def _clash(request: RoutingRequest, path: list, other: RoutingRequest) -> str | None:
    """The first input of ``path`` that ``other`` answers, and answers otherwise."""
    for rendered, answer in path:
        theirs = other.replay_text(rendered)
        if theirs is not None and theirs != answer:
            return (f"{request.record.id}'s {rendered.stage} input is answered "
                    f"{answer!r} there and {theirs!r} by {other.record.id}")
    return None


def find_conflicts(records: Iterable[Record], suite: ApiSuite | None) -> dict[str, str]:
    """Record id → reason, for every record whose recorded path and an earlier record's
    (in the order given) hold one input that the two answer differently; either path's
    inputs count, each answered by both replays (on its path or off it).

    Only records with the same workspace and first user turn can render each other's
    inputs (every router and handler input holds both), so records are compared within
    those groups.
    """
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in records:
        groups[(record.scenario, record.turns[0] if record.turns else "")].append(record)
    found: dict[str, str] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        kept: list[tuple[RoutingRequest, list]] = []
        for record in group:
            request, path = _path(record, suite)
            for other, other_path in kept:
                why = _clash(request, path, other) or _clash(other, other_path, request)
                if why:
                    found[record.id] = why
                    break
            else:
                kept.append((request, path))
    return found
