"""Skip-ahead changes how often the sim engine wakes, never what anyone observes.

Every test runs the same workload on engines with ``skip_ahead=True`` and ``False`` and
compares everything a caller sees, exactly: results, every streamed chunk with its arrival
time, load snapshots at timers and at chunk arrivals, and the KV pool left behind.
Workloads mix random arrivals, shared prompt prefixes (prefix caching), long outputs,
``max_tokens`` cuts, priorities, aborts (timed and in reaction to a chunk), calls started
by a chunk (arriving exactly at a step boundary), two engines whose boundaries tie, and
KV pools small enough to preempt.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.engines.profile import Profile, load_profile
from dynbranch.engines.protocol import CANONICAL, SPECULATIVE
from dynbranch.engines.sim import SimEngine
from dynbranch.engines.skip_ahead import Lookahead, Stepper
from tests.sim_workload import (
    PREFIXES,
    Call,
    Observation,
    Workload,
    chunk_times,
    differences,
    observe,
    with_limits,
)

P32 = load_profile("qwen3-32b@h200")
PROPERTY_EXAMPLES = 250


@dataclasses.dataclass(frozen=True)
class Setup:
    """How the engines are built."""

    profile: Profile
    kv_blocks: int | None
    caching: bool

    def engine(self, skip_ahead: bool):  # noqa: ANN201 - a factory for observe()
        def make(clock, engine_id: str) -> SimEngine:
            return SimEngine(
                self.profile,
                clock,
                engine_id,
                kv_blocks=self.kv_blocks,
                prefix_caching=self.caching,
                skip_ahead=skip_ahead,
            )

        return make


def assert_same(setup: Setup, workload: Workload) -> Observation:
    """Both paths observe the same; returns the observation."""
    step = observe(workload, setup.engine(skip_ahead=False))
    skip = observe(workload, setup.engine(skip_ahead=True))
    assert not differences(step, skip), differences(step, skip)[:5]
    assert step == skip
    return step


def with_tie(setup: Setup, workload: Workload, u: float, tie: Workload) -> Workload:
    """``workload`` plus ``tie``'s tie actions at a step boundary of ``workload``'s run."""
    times = chunk_times(observe(workload, setup.engine(skip_ahead=False)))
    if not times:
        return workload
    return dataclasses.replace(
        workload,
        tie_at=times[min(len(times) - 1, int(u * len(times)))],
        tie_calls=tie.tie_calls,
        tie_kill=tie.tie_kill,
    )


# -- strategies -----------------------------------------------------------------------------

# Some arrivals share an instant exactly (twins admitted together decode in lockstep).
times = st.one_of(st.floats(0.0, 1.5, allow_nan=False), st.sampled_from([0.0, 0.25, 0.5]))
calls = st.builds(
    Call,
    at=times,
    engine=st.integers(0, 1),
    prefix=st.integers(0, len(PREFIXES) - 1),
    prompt=st.integers(1, 150),
    output=st.one_of(st.integers(0, 8), st.integers(0, 250)),
    max_tokens=st.one_of(st.just(4096), st.integers(1, 200)),
    priority=st.sampled_from([CANONICAL, SPECULATIVE]),
    salt=st.sampled_from([None, None, "tenant-b"]),
    stream=st.booleans(),
    abort_at=st.one_of(st.none(), st.floats(0.0, 3.0, allow_nan=False)),
    react_at=st.one_of(st.none(), st.integers(0, 60)),
    spawn=st.one_of(st.none(), st.integers(0, 3)),
    kill=st.one_of(st.none(), st.integers(0, 9)),
    follows=st.one_of(st.none(), st.none(), st.integers(0, 9)),
    twin=st.one_of(st.none(), st.none(), st.integers(0, 9)),
)
setups = st.builds(
    Setup,
    profile=st.builds(
        lambda budget, seqs: with_limits(P32, max_num_batched_tokens=budget, max_num_seqs=seqs),
        st.sampled_from([32, 64, 256, 8192]),
        st.sampled_from([2, 4, 256]),
    ),
    kv_blocks=st.sampled_from([12, 24, 40, 80, None]),
    caching=st.booleans(),
)
workloads = st.builds(
    Workload,
    calls=st.lists(calls, min_size=1, max_size=10).map(tuple),
    spawned=st.lists(calls, max_size=4).map(tuple),
    snapshots=st.lists(st.floats(0.0, 4.0, allow_nan=False), max_size=10).map(tuple),
    engines=st.integers(1, 2),
    mirror=st.booleans(),
)
ties = st.builds(
    Workload,
    calls=st.just(()),
    tie_calls=st.lists(calls, max_size=2).map(tuple),
    tie_kill=st.one_of(st.none(), st.integers(0, 9)),
)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(setups, workloads, st.one_of(st.none(), st.tuples(st.floats(0.0, 1.0), ties)))
def test_skip_ahead_observes_exactly_what_stepping_does(
    setup: Setup, workload: Workload, tie: tuple[float, Workload] | None
) -> None:
    if tie is not None:
        workload = with_tie(setup, workload, *tie)
    assert_same(setup, workload)


# -- fixed workloads ------------------------------------------------------------------------


def long_workload(seed: int, n: int = 40, engines: int = 2) -> Workload:
    """Many long decodes with a few short calls, streams, reactions and aborts."""
    rng = random.Random(seed)

    def call(i: int) -> Call:
        return Call(
            at=rng.uniform(0.0, 6.0),
            engine=i % engines,
            prefix=rng.randrange(len(PREFIXES)),
            prompt=rng.randint(1, 400),
            output=rng.choice([rng.randint(300, 900), rng.randint(0, 20)]),
            max_tokens=rng.choice([4096, 4096, rng.randint(100, 600)]),
            priority=rng.choice([CANONICAL, SPECULATIVE]),
            salt=None,
            stream=rng.random() < 0.3,
            abort_at=rng.uniform(0.0, 12.0) if rng.random() < 0.1 else None,
            react_at=rng.randint(0, 400) if rng.random() < 0.3 else None,
            spawn=rng.randint(0, 3),
            kill=rng.randint(0, n - 1) if rng.random() < 0.1 else None,
            follows=rng.randrange(i) if i and rng.random() < 0.2 else None,
            twin=rng.randrange(i) if i and rng.random() < 0.2 else None,
        )

    return Workload(
        tuple(call(i) for i in range(n)),
        tuple(call(i) for i in range(4)),
        tuple(rng.uniform(0.0, 15.0) for _ in range(60)),
        engines=engines,
    )


def test_long_decodes_with_a_pool_that_preempts_are_identical() -> None:
    # 120 blocks x 16 tokens: the long requests overflow it and preempt.
    obs = assert_same(Setup(P32, 120, True), long_workload(seed=1))
    finished = [r for r in obs.outcomes.values() if not isinstance(r, str)]
    assert sum(r.preemptions for r in finished) > 0, "the workload should preempt"
    assert any(r.finish_reason == "abort" for r in finished)
    assert any(r.cached_prompt_tokens > 0 for r in finished)


def test_long_decodes_under_a_tight_batch_limit_are_identical() -> None:
    profile = with_limits(P32, max_num_seqs=6, max_num_batched_tokens=512)
    assert_same(Setup(profile, None, True), long_workload(seed=2))


def test_mirrored_engines_with_tied_boundaries_are_identical() -> None:
    workload = dataclasses.replace(long_workload(seed=3, n=16), mirror=True)
    obs = assert_same(Setup(P32, None, True), workload)
    tied = [r for rid, r in obs.outcomes.items() if rid.endswith("@0")]
    twins = [obs.outcomes[r.request_id[:-1] + "1"] for r in tied if not isinstance(r, str)]
    assert any(
        not isinstance(b, str) and a.finished_at == b.finished_at
        for a, b in zip(tied, twins, strict=False)
    ), "mirrored engines should tie"


class _CountingAlarms:
    """Counts how often an engine's alarm fires (its clock events)."""

    def __init__(self) -> None:
        self.fired = 0

    def factory(self, setup: Setup, skip_ahead: bool):  # noqa: ANN201
        make = setup.engine(skip_ahead)

        def counted(clock, engine_id: str) -> SimEngine:
            engine = make(clock, engine_id)
            on_alarm = engine._on_alarm

            def count() -> None:
                self.fired += 1
                on_alarm()

            engine._on_alarm = count  # type: ignore[method-assign]
            return engine

        return counted


def test_skip_ahead_wakes_far_less_often_on_long_decodes() -> None:
    setup = Setup(P32, None, True)
    rng = random.Random(4)
    calls = tuple(
        Call(rng.uniform(0, 2), 0, 1, 200, rng.randint(500, 1000), 4096, CANONICAL, None, False)
        for _ in range(12)
    )
    workload = Workload(calls)
    counts = []
    for skip_ahead in (False, True):
        counter = _CountingAlarms()
        observe(workload, counter.factory(setup, skip_ahead))
        counts.append(counter.fired)
    steps, skipped = counts
    assert steps > 1000 and skipped * 10 < steps, counts


def test_a_decode_evicting_the_heads_cached_prefix_ends_the_run(monkeypatch) -> None:  # noqa: ANN001
    # Found by a targeted search. Twin requests share a prompt; the first stops early, so
    # the second publishes the later blocks; follow-up turns then wait for memory with a
    # cached prefix made of both. When a decode's new block evicts the first twin's tail
    # block, the head's hits shrink, and with a step budget below its prompt what it
    # needs stays the same while the free hits it no longer claims come back: it fits.
    setup = Setup(with_limits(P32, max_num_batched_tokens=48, max_num_seqs=4), 18, True)
    c, s = CANONICAL, SPECULATIVE
    workload = Workload(
        (
            Call(0.0, 0, 0, 80, 67, 49, c, None, False),
            Call(0.04934840911682021, 0, 0, 80, 0, 4096, s, None, False, twin=0),
            Call(0.086593991314311, 0, 1, 62, 56, 4096, c, None, False),
            Call(0.5613399543985482, 0, 3, 35, 182, 4096, c, None, False),
            Call(0.2329120809246077, 0, 0, 28, 43, 4096, c, None, False, follows=0),
            Call(2.4304922408382166, 0, 0, 4, 39, 4096, s, None, False, follows=0),
        ),
        snapshots=(1.8002144606314707, 2.2636996776115583, 0.6941455781615598),
    )
    assert_same(setup, workload)

    # Without the guard the run plans through the eviction, and callers see it.
    monkeypatch.setattr(Lookahead, "_evicts_head", lambda plan, free, take: False)
    step = observe(workload, setup.engine(skip_ahead=False))
    assert differences(step, observe(workload, setup.engine(skip_ahead=True)))


def test_twins_in_lockstep_publish_their_blocks_in_batch_order(monkeypatch) -> None:  # noqa: ANN001
    # Found by a targeted search. Twins admitted together fill identical blocks in the same
    # steps; the first in batch order holds each key (vLLM: first holder wins). The first
    # twin stops early, so its blocks are freed and evicted first, and the follow-up turns
    # find (or miss) the shared blocks accordingly.
    setup = Setup(P32, 35, True)
    c = CANONICAL
    workload = Workload(
        (
            Call(0.15903871311313933, 0, 0, 32, 113, 43, c, None, False),
            Call(0.15903871311313933, 0, 0, 32, 0, 4096, c, None, False, twin=0),
            Call(1.1639378511535754, 0, 1, 7, 60, 4096, c, None, False),
            Call(0.5576900333434608, 0, 1, 49, 46, 4096, c, None, False),
            Call(0.019671284383353305, 0, 1, 53, 91, 4096, c, None, False),
            Call(0.7309313733667033, 0, 0, 26, 5, 4096, c, None, False, follows=0),
            Call(1.9684006994003194, 0, 0, 15, 9, 4096, c, None, False, follows=0),
        )
    )
    assert_same(setup, workload)

    apply_members = Stepper._apply_members

    def publishing_in_reverse(stepper: Stepper, k: int, t: float) -> None:
        bucket = stepper.lazy.buckets[(k + 1) % stepper.block_size]
        bucket.reverse()
        apply_members(stepper, k, t)
        bucket.reverse()

    monkeypatch.setattr(Stepper, "_apply_members", publishing_in_reverse)
    step = observe(workload, setup.engine(skip_ahead=False))
    assert differences(step, observe(workload, setup.engine(skip_ahead=True)))


def test_a_plan_stops_before_the_step_the_pool_cannot_feed(monkeypatch) -> None:  # noqa: ANN001
    # Decodes outgrow a 27-block pool: the scheduler preempts, the batch shrinks and the
    # steps get cheaper, so a request ends earlier than a plan through that step says.
    setup = Setup(P32, 27, True)
    c, s = CANONICAL, SPECULATIVE
    workload = Workload(
        (
            Call(0.1777922731881497, 0, 0, 53, 209, 4096, s, None, False),
            Call(0.1877160912324162, 0, 0, 36, 330, 4096, c, None, False),
            Call(0.27264552005559745, 0, 0, 140, 152, 4096, c, None, False),
        )
    )
    obs = assert_same(setup, workload)
    assert sum(r.preemptions for r in obs.outcomes.values() if not isinstance(r, str)) > 0

    lookahead = Lookahead.__init__

    def ignoring_the_pool(plan: Lookahead, stepper: Stepper) -> None:
        lookahead(plan, stepper)
        plan.free_left = 10**9

    monkeypatch.setattr(Lookahead, "__init__", ignoring_the_pool)
    step = observe(workload, setup.engine(skip_ahead=False))
    assert differences(step, observe(workload, setup.engine(skip_ahead=True)))
