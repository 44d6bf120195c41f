"""Table 1's partial-overlap request mix for reuse alone (C2 off).

The paper's reuse-only run "mixes exact repeats, shared sub-DAGs, and fresh negative
controls" over the Sub-Agent entity distribution. We build it from the split's questions:

* ``popular`` — questions from the **train** split asked again in the measured stream: what a
  deployment's history makes predictable (InstCache pre-populates exactly these);
* ``repeat`` — a question of the stream asked a second time, later (an exact repeat);
* ``shared`` — test questions that share at least one research sub-topic (same entity, same
  ask) with another question of the stream: their sub-agents' sub-DAGs recur while the
  questions differ;
* ``fresh`` — test questions none of whose sub-topics occurs in any other test question:
  negative controls that no reuse can help.

Shares default to 6 / 24 / 45 / 25 % (our choice; the paper gives none). NOTE: InstCache's
gain is set almost entirely by the ``popular`` share, so it is kept small, as the paper's
7 % for InstCache suggests few requests were predictable. Every repeat comes
after its original. The category is part of the request id
(``subagent-{i:05d}-{category}-{question id}``) so results can be read per category.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

from workloads.musique import MusiqueRecord

SHARES: Mapping[str, float] = {"popular": 0.06, "repeat": 0.24, "shared": 0.45, "fresh": 0.25}
CATEGORIES = tuple(SHARES)


def partial_overlap_mix(
    test: Sequence[MusiqueRecord],
    train: Sequence[MusiqueRecord],
    n: int,
    seed: int,
    shares: Mapping[str, float] = SHARES,
) -> list[tuple[MusiqueRecord, str]]:
    """``n`` (record, category) pairs in arrival order (see the module docstring)."""
    rng = random.Random(seed)
    counts = _counts(n, shares)
    uses = Counter(s.subtopic for r in test for s in r.steps)
    shared = _shared(test, uses, counts["shared"], rng)
    fresh_pool = [r for r in test if all(uses[s.subtopic] == 1 for s in r.steps)]
    fresh = rng.sample(fresh_pool, min(counts["fresh"], len(fresh_pool)))
    popular = rng.sample(list(train), min(counts["popular"], len(train)))
    stream = (
        [(r, "shared") for r in shared]
        + [(r, "fresh") for r in fresh]
        + [(r, "popular") for r in popular]
    )
    rng.shuffle(stream)
    for original in rng.sample(range(len(stream)), min(counts["repeat"], len(stream))):
        record = stream[original][0]
        at = rng.randint(_position(stream, record) + 1, len(stream))
        stream.insert(at, (record, "repeat"))
    return stream[:n]


def _counts(n: int, shares: Mapping[str, float]) -> dict[str, int]:
    total = sum(shares.values())
    counts = {k: int(n * v / total) for k, v in shares.items()}
    counts["shared"] += n - sum(counts.values())
    return counts


def _shared(
    test: Sequence[MusiqueRecord], uses: Counter, k: int, rng: random.Random
) -> list[MusiqueRecord]:
    """``k`` test questions in groups that share a sub-topic, so each shares with another."""
    by_topic: dict[str, list[MusiqueRecord]] = {}
    for r in test:
        for s in r.steps:
            if uses[s.subtopic] >= 2:
                by_topic.setdefault(s.subtopic, []).append(r)
    topics = sorted(by_topic)
    rng.shuffle(topics)
    chosen: dict[str, MusiqueRecord] = {}
    for topic in topics:
        group = [r for r in by_topic[topic] if r.id not in chosen]
        if len(group) < 2 and not any(r.id in chosen for r in by_topic[topic]):
            continue
        for r in group[: max(0, k - len(chosen))]:
            chosen[r.id] = r
        if len(chosen) >= k:
            break
    return list(chosen.values())


def _position(stream: list[tuple[MusiqueRecord, str]], record: MusiqueRecord) -> int:
    return next(i for i, (r, _) in enumerate(stream) if r.id == record.id)
