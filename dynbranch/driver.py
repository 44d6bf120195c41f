"""The replay driver: open-loop arrivals of one workload's requests through one arm.

Everything that can be wrong with a run (unknown names, a clock the backend cannot use,
missing or malformed data) is checked by :func:`prepare` before anything starts; then
:func:`run_replay` starts the backend, launches each request at its scheduled arrival
(latency counts from that schedule, whatever the driver's own lag), waits for every
request to complete or fail, and writes the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynbranch.arms.base import Arm
from dynbranch.arms.registry import get_arm
from dynbranch.arrivals import PROCESSES, arrival_times
from dynbranch.backend import BACKENDS, DRAFTER_ROLE, Backend, EngineSpec, LocalBackend
from dynbranch.clock import CLOCKS, Clock, Stopwatch, make_clock
from dynbranch.decode_lengths import MODES as DECODE_MODES
from dynbranch.engines.config import EngineConfig
from dynbranch.engines.network import NETWORKS, with_network
from dynbranch.engines.profile import load_profile
from dynbranch.errors import ConfigError
from dynbranch.launch import Interruption, Launcher, LaunchOutcome
from dynbranch.orchestrator import Orchestrator
from dynbranch.outdir import OutDir
from dynbranch.replay_checks import (
    check_choice,
    check_data_dir,
    check_drafter,
    check_engine,
    check_model,
    check_profile,
    check_values,
)
from dynbranch.resultlog import PARTS, ResultStream, set_aside_stopped_run
from dynbranch.reuse.eviction import POLICIES as EVICTION_POLICIES
from dynbranch.runtime.run import (
    DEFAULT_DEPTH,
    GATE_POLICIES,
    AdmissionOptions,
    FillOptions,
    GateOptions,
    RunContext,
    default_fanout,
)
from dynbranch.runtime.runlog import RequestRecord
from dynbranch.workload import DataConfig, LazyTrace, RequestInstance, Workload


@dataclass(frozen=True)
class ReplayConfig:
    """Every setting of one replay; the CLI maps its flags one to one onto these."""

    workload: str = "routing"
    arm: str = "floor"
    engine: str = "sim"
    profile: str = "qwen3-32b@h200"
    model: str | None = None  # hf | vllm: the model directory or Hugging Face id they serve
    engine_config: EngineConfig | None = None  # hf | vllm: max model length, GPU memory, ...
    backend: str = "ray"
    clock: str = "real"
    rate: float = 1.0
    requests: int = 30
    seed: int = 0
    workers: int = 4
    fanout: int | None = None  # most fills per branch; None: workers - 1 (the paper's K = W - 1)
    arrival: str = "poisson"
    cv: float = 1.0
    split: str = "test"
    tool_time: str = "modelled"
    decode_lengths: str = "modelled"
    categories: tuple[str, ...] | None = None  # routing: BFCL categories (None: its default)
    depth: int | None = None  # stages one fill may run; None: the workload's, else 2
    predictor: str | None = None
    drafter_profile: str = "qwen3-0.6b@h200"  # the sim drafter's profile
    drafter_model: str | None = None  # a real drafter (hf | vllm): its local model directory
    drafter_workers: int = 1  # drafter engines, shared by every worker
    drafter_samples: int = 8  # N: draft calls per branch
    drafter_think_tokens: int = 0  # tokens each draft call reasons before it answers
    gate: str = "priced"
    p_star: float = 0.5
    store_mb: int = 1024
    eviction: str = "lru"
    tenant: str = "default"  # the tenant of every request when ``tenants`` is 1
    tenants: int = 1  # spread the requests over this many tenants (by arrival order)
    max_inflight: int | None = None  # admission: reject arrivals beyond this many in flight
    deadline_s: float | None = None  # cancel a request not done this long after arrival
    out: Path | str = Path("runs/replay")  # a directory or a pyarrow filesystem URI
    data_dir: str | None = None
    address: str | None = None
    gate_lane: bool = False  # ray: the gate's decisions over a compiled graph (a busy core)
    stream_lanes: bool = True  # ray: engine, gate and lookup calls over streams (cluster/stream)
    network: str = "none"  # a modelled driver-to-worker network (dynbranch/engines/network.py)
    progress: bool = True
    workload_options: dict[str, Any] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """The settings as they go into ``summary.json``."""
        d = dataclasses.asdict(self)
        d["out"] = str(self.out)
        d.pop("progress")
        return d


@dataclass(frozen=True)
class RunOptions:
    """The run's typed options, built (and so range-checked) by :func:`prepare`."""

    fill: FillOptions
    gate: GateOptions
    admission: AdmissionOptions


@dataclass
class Prepared:
    """A validated run: its objects built, nothing started."""

    config: ReplayConfig
    workload: Workload
    arm: Arm
    clock: Clock
    instances: Sequence[RequestInstance]
    arrivals: Sequence[float]
    data: DataConfig | None = None  # where the workload reads (InstCache pre-populates from it)
    options: RunOptions | None = None  # set by prepare()
    built: Workload | None = None  # the workload prepare() built from the config (set by it)


def prepare(cfg: ReplayConfig, progress: Callable[[str], None] = print) -> Prepared:
    """Validate ``cfg`` and load its requests; raise a typed error before anything starts.

    Every value is checked here (names, ranges, NaN, combinations, the engine's extra, the
    data directory, that ``out`` is writable), so a bad one stops the run with one line
    before a backend, an engine or a Ray instance exists.
    """
    from dynbranch.datasets import cache_dir, resolve_data_dir
    from workloads import get_workload

    check_choice("backend", cfg.backend, BACKENDS)
    check_choice("clock", cfg.clock, CLOCKS)
    check_choice("arrival process", cfg.arrival, PROCESSES)
    check_choice("split", cfg.split, ("test", "train"))
    check_choice("gate", cfg.gate, GATE_POLICIES)
    check_choice("eviction policy", cfg.eviction, list(EVICTION_POLICIES))
    check_choice("decode lengths", cfg.decode_lengths, DECODE_MODES)
    check_choice("network", cfg.network, list(NETWORKS))
    check_values(cfg)
    check_engine(cfg.engine)
    check_profile(cfg)
    check_model(cfg)
    check_drafter(cfg)
    if cfg.gate_lane and cfg.backend != "ray":
        raise ConfigError("--gate-lane is a channel to the Ray gate actor; the local backend "
                          "asks its gate in process already")
    if cfg.backend == "ray" and cfg.clock == "virtual":
        raise ConfigError("the virtual clock runs in one process only; use --backend local "
                          "with --clock virtual, or --clock real with --backend ray")
    arm = get_arm(cfg.arm)
    if arm.name == "oracle" and cfg.engine not in ("sim", "zero"):
        raise ConfigError("the oracle arm replays the trace's branch outcomes; with a real "
                          f"model (--engine {cfg.engine}) they are not the run's: use sim")
    if arm.name == "instcache" and cfg.split != "test":
        raise ConfigError("the instcache arm pre-populates from the train split; "
                          "measure it on --split test")
    options = dict(cfg.workload_options)
    if cfg.categories is not None:
        if cfg.workload != "routing":
            raise ConfigError(f"--categories selects BFCL categories of the routing workload, "
                              f"not of {cfg.workload!r}")
        options["categories"] = tuple(cfg.categories)
    out = OutDir.parse(cfg.out)  # NOTE: a URI pyarrow cannot open is refused here
    check_data_dir(cfg.data_dir)
    workload = get_workload(cfg.workload, tool_time=cfg.tool_time,
                            decode_lengths=cfg.decode_lengths, **options)
    data = DataConfig(resolve_data_dir(cfg.data_dir), cache_dir())
    workload.fetch_data(data, progress)
    workload.check_data(data)
    if cfg.depth is None:
        cfg = dataclasses.replace(cfg, depth=workload.fill_depth or DEFAULT_DEPTH)
    if cfg.fanout is None:
        cfg = dataclasses.replace(cfg, fanout=default_fanout(cfg.workers))
    instances = workload.requests(data, cfg.requests, cfg.seed, cfg.split)
    arrivals = arrival_times(cfg.requests, cfg.rate, cfg.seed, cfg.arrival, cfg.cv)
    # NOTE: plain floats: numpy scalars would leak into the loop's clock and every timestamp.
    arrivals = [float(a) for a in arrivals]
    options = run_options(cfg, workload.predictor)
    out.check()  # last: a refused run leaves no directory behind
    with out.claimed():
        pass  # NOTE: refused now if another run holds it, not after the setup; held by run_replay
    return Prepared(cfg, workload, arm, make_clock(cfg.clock), instances, arrivals, data,
                    options, built=workload)


def run_options(cfg: ReplayConfig, default_predictor: str) -> RunOptions:
    """The run's typed options from ``cfg`` (each checks its own ranges: a typed error);
    ``default_predictor`` is the workload's, used unless ``cfg`` names one."""
    predictor_options = ({"samples": cfg.drafter_samples, "seed": cfg.seed,
                          "think_tokens": cfg.drafter_think_tokens}
                         if cfg.predictor == "drafter" else {})
    try:
        return RunOptions(
            fill=FillOptions(fanout=cfg.fanout, depth=cfg.depth,
                             predictor=cfg.predictor or default_predictor,
                             predictor_options=predictor_options),
            gate=GateOptions(policy=cfg.gate, p_star=cfg.p_star, profile=cfg.profile,
                             engines=cfg.workers, seed=cfg.seed),
            admission=AdmissionOptions(max_inflight=cfg.max_inflight,
                                       deadline_s=cfg.deadline_s, tenants=cfg.tenants))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def drafter_spec(cfg: ReplayConfig) -> EngineSpec:
    """The ``drafter`` role: ``drafter_workers`` sim engines of ``drafter_profile`` (their
    calls replay the drafter's sampled candidates, timed by the profile), or a real model
    (``drafter_model``) of the run's real engine kind (``hf`` when the run simulates).

    NOTE: one shared engine by default. A 0.6B drafter's step is bound by its fixed host
    overhead (~2 ms), so the N samples of every open branch batch on one engine at little
    extra cost; ``drafter_workers`` adds engines (and, on Ray, placement bundles).
    """
    from dynbranch.engines import MODEL_ENGINES

    if cfg.drafter_model is not None:
        kind = cfg.engine if cfg.engine in MODEL_ENGINES else "hf"
        return EngineSpec(kind, cfg.drafter_model, cfg.drafter_workers,
                          model_path=cfg.drafter_model)
    return EngineSpec("sim", cfg.drafter_profile, cfg.drafter_workers)


def make_backend(cfg: ReplayConfig, clock: Clock) -> Backend:
    """The backend ``cfg`` names, with one ``target`` engine per worker and, when the
    predictor drafts, the ``drafter`` engines (:func:`drafter_spec`)."""
    roles = {"target": EngineSpec(cfg.engine, cfg.profile, cfg.workers, model_path=cfg.model,
                                  config=cfg.engine_config)}
    if cfg.predictor == "drafter":
        roles[DRAFTER_ROLE] = drafter_spec(cfg)
    if cfg.backend == "local":
        return LocalBackend(clock, roles)
    from dynbranch.cluster import RayBackend  # the only place Ray enters

    return RayBackend(clock, roles, address=cfg.address, gate_lane=cfg.gate_lane,
                      stream_lanes=cfg.stream_lanes)


@dataclass
class ReplayResult:
    """What a finished replay returns (and has written to ``config.out``)."""

    summary: dict[str, Any]
    requests: list[RequestRecord]
    orchestrator: Orchestrator


def run_replay(prepared: Prepared, backend: Backend | None = None, *,
               keep_log: bool = True,
               on_finished: Callable[[RequestRecord], None] | None = None) -> ReplayResult:
    """Run a prepared replay to the end (or to an interrupt) and write its results.

    Rows stream to ``out/parts/`` while it runs (:mod:`dynbranch.resultlog`); at the end the
    final files replace them. SIGINT or SIGTERM stop the launch: the requests in flight are
    cancelled into ``interrupted`` records and the results are written, with ``interrupted``
    set in the summary. A backend that fails to shut down is reported, never lets the results
    go unwritten. Unless ``keep_log``, stage and branch records leave memory once streamed
    (the returned orchestrator's log then holds none) and the launcher takes the request
    instances over, letting each go when its request ends (``prepared.instances`` is empty
    afterwards): a long run keeps nothing per finished request but its request row.
    ``on_finished`` is called with each request's record as the request ends (after its row
    is streamed), on the run's event loop: what a benchmark reads while the run goes on.
    """
    from dynbranch.results import report, summarize

    cfg, clock = prepared.config, prepared.clock
    out = OutDir.parse(cfg.out)
    with out.claimed():
        aside = set_aside_stopped_run(out)
        if aside is not None:
            print(f"dynbranch: {out} held the result shards of a run that stopped before "
                  f"writing its files; moved them to {out.child(aside)}/{PARTS} (read them "
                  f"with dynbranch.resultlog.read_partial)", file=sys.stderr)
        backend = backend or make_backend(cfg, clock)
        state = _RunState(keep_log=keep_log, on_finished=on_finished)
        # NOTE: writing the results stays inside the tuned collector: out of it, the first
        # allocations of the frames and files collected the whole heap the run had grown.
        with collector_for_replay():
            with Stopwatch() as wall:
                clock.run(_replay(prepared, backend, state))
            if state.orch is None or state.stream is None:
                raise KeyboardInterrupt  # interrupted before any request could start
            orch = state.orch
            run = {**cfg.settings(), "wall_s": wall.elapsed_s, "backend": backend.name,
                   **state.fields()}
            state.stream.flush(every_branch=True)
            summary = summarize(run, state.records, state.stream.tally,
                                fills=orch.fills.stats(), mechanisms=orch.mechanism_stats)
            state.stream.close(summary, state.records)
    if cfg.progress:
        print(report(summary))
    return ReplayResult(summary, state.records, orch)


GC_THRESHOLD = (20_000, 50, 1_000)
"""The cyclic collector's thresholds while a replay runs (Python's defaults: 700, 10, 10)."""


@contextlib.contextmanager
def collector_for_replay():
    """Freeze what exists before the run and collect cycles less often while it runs and
    while its results are written (also what a benchmark standing in for a replay's driver
    runs under: ``scripts/bench_overhead.py``'s floors).

    NOTE: a replay allocates millions of short-lived acyclic objects (events, token lists,
    scores); at the default thresholds the cyclic collector ran 1,539 young and 12 full
    collections in a 1,000-request Routing ``full`` replay (4 req/s), each full one walking
    the prepared train split and the predictors' weights again: 4.1-4.5 s of a 28-30 s run.
    Frozen and at these thresholds, 375 young and 3 full collections took 0.9-1.0 s and the
    run 26.2-26.5 s, with identical results. Cycles still get collected, at most 20,000
    allocations late. The thresholds and the frozen set are restored afterwards. Writing a
    3,000-request run's results took 2.3-2.8 s outside and 1.35-1.42 s inside.
    """
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


@dataclass
class _RunState:
    """What a run leaves behind, however it ended."""

    keep_log: bool = True
    on_finished: Callable[[RequestRecord], None] | None = None
    orch: Orchestrator | None = None
    stream: ResultStream | None = None
    records: list[RequestRecord] = field(default_factory=list)
    not_started: int = 0
    interrupted_by: str | None = None
    launch: dict[str, int] = field(default_factory=dict)
    engines: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The summary fields of how the run ended."""
        orch = self.orch
        return {"interrupted": self.interrupted_by is not None,
                "interrupted_by": self.interrupted_by, "not_started": self.not_started,
                "cleanup_errors": orch.cleanup_errors if orch else 0,
                "launch": self.launch, "engines": self.engines, **self.problems}


async def _replay(prepared: Prepared, backend: Backend, state: _RunState) -> None:
    interruption = Interruption()
    with interruption.installed(asyncio.current_task()):
        try:
            await _serve(prepared, backend, state, interruption)
        except asyncio.CancelledError:
            if interruption.signal_name is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        state.interrupted_by = interruption.signal_name


async def _serve(prepared: Prepared, backend: Backend, state: _RunState,
                 interruption: Interruption) -> None:
    cfg = prepared.config
    state.not_started = len(prepared.instances)
    try:
        await backend.start()
        run = run_context(prepared, backend)
        clients = with_network(backend.clients(), cfg.network, prepared.clock)
        orch = Orchestrator(prepared.clock, clients, prepared.arm, run=run)
        state.orch = orch
        state.stream = ResultStream(cfg.out, orch.log.stages, prepared.clock.now,
                                    branches=orch.log.branches, keep=state.keep_log)
        # NOTE: before the clock starts (InstCache's predicted requests, the oracle's branch
        # outcomes; the other arms do nothing)
        await orch.reuse.prepopulate(prepared.workload, prepared.data, cfg.seed,
                                     measured_split=cfg.split)
        await orch.branch_hook.prepopulate(prepared.workload, prepared.data, cfg.seed,
                                           split=cfg.split, requests=cfg.requests)
        outcome = await _launch(prepared, orch, state.stream, interruption, state.on_finished)
        interruption.disarm()
        state.records, state.not_started = outcome.records, outcome.not_started
        state.launch = outcome.counts
        try:
            await orch.finish_run()
        except Exception as e:  # NOTE: the counters are lost, not the results
            state.problems["finish_error"] = f"{type(e).__name__}: {e}"
        await orch.pool.close()
        lanes = backend.lane_counts()
        state.engines = {**orch.pool.counts, "down_at_end": orch.pool.down(),
                         **({"lanes": lanes} if lanes else {})}
    finally:
        interruption.disarm()
        try:
            await backend.shutdown()
        except Exception as e:
            state.problems["shutdown_error"] = f"{type(e).__name__}: {e}"


def run_context(prepared: Prepared, backend: Backend) -> RunContext:
    """The run's context: its typed options from the config, its store and gate from the
    backend (Ray: one central gate actor and sharded store actors)."""
    cfg = prepared.config
    return RunContext(
        clock=prepared.clock, arm=prepared.arm.name, tenant=cfg.tenant,
        models=backend.models(), fill=prepared.options.fill, gate=prepared.options.gate,
        replay=cfg.engine in ("sim", "zero"),
        replay_context=(load_profile(cfg.profile).model.max_model_len if cfg.engine == "sim"
                        else None),
        make_store=lambda: backend.make_store(cfg.store_mb << 20, cfg.eviction),
        make_gate=backend.make_gate, workload_key=workload_key(prepared))


def workload_key(prepared: Prepared) -> tuple[Any, ...] | None:
    """What decides the requests :func:`prepare`'s workload generates: its name and
    settings and the data it reads (two runs with equal keys draw the same train split).

    ``None`` once the workload was replaced after :func:`prepare` (an experiment's shaped
    stream): the config no longer says what it generates.
    """
    if prepared.workload is not prepared.built:
        return None
    cfg = prepared.config
    return (cfg.workload, cfg.tool_time, cfg.decode_lengths, cfg.categories,
            repr(sorted(cfg.workload_options.items())),
            str(prepared.data.data_dir) if prepared.data else None,
            str(prepared.data.cache_dir) if prepared.data else None)


async def _launch(prepared: Prepared, orch: Orchestrator, stream: ResultStream,
                  interruption: Interruption,
                  on_finished: Callable[[RequestRecord], None] | None = None) -> LaunchOutcome:
    cfg = prepared.config
    bar = _progress_bar(len(prepared.instances), cfg)
    failed = 0

    def finished(record: RequestRecord) -> None:
        nonlocal failed
        stream.finished(record)
        if record.status != "completed":
            failed += 1
            bar.set_postfix(failed=failed, refresh=False)
        bar.update(1)
        if on_finished is not None:
            on_finished(record)

    instances, release = prepared.instances, not stream.keep
    if release:  # NOTE: handed over, so a finished request's instance can be let go
        # NOTE: a lazy trace is handed over as it is: listing it would make every request
        # before the first arrives
        owned = instances if isinstance(instances, LazyTrace) else list(instances)
        instances, prepared.instances = owned, ()
    launcher = Launcher(orch, prepared.clock, instances, prepared.arrivals,
                        prepared.options.admission, default_tenant=cfg.tenant,
                        finished=finished, interruption=interruption, release=release)
    try:
        return await launcher.run()
    finally:
        stream.flush()
        bar.close()


def _progress_bar(total: int, cfg: ReplayConfig):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{cfg.workload}/{cfg.arm}", unit="req",
                disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
