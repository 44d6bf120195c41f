"""``dynbranch``: replay a workload, read its stage log, fetch or check data, run an experiment,
make a model.

Errors DynBranch raises on purpose (unknown names, missing or malformed data, settings that
cannot run) print one line naming the problem and exit with status 2 before anything starts.
A replay that runs to its end exits 0 even when some of its requests failed: their typed
errors are counted in ``summary.json`` and listed in ``requests.parquet``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dynbranch.errors import ConfigError, DynBranchError
from dynbranch.runtime.run import DEFAULT_DEPTH


def _replay_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a workload open-loop through one arm",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workload", default="routing", help="routing | react | subagent | hci")
    p.add_argument("--arm", default="floor",
                   help="floor | c1 | c2 | full | instcache | helium | parrot | dsp | spagent "
                        "| oracle (a bound, not a system)")
    p.add_argument("--engine", default="sim", help="sim | zero | hf | vllm")
    p.add_argument("--profile", default="qwen3-32b@h200", help="sim engine profile")
    p.add_argument("--model", default=None,
                   help="hf | vllm: a local model directory or a Hugging Face id (fetched once "
                        "per node into its HF cache); LLM outputs are then generated, not "
                        "replayed (`dynbranch model make-tiny DIR` writes a tiny one)")
    _engine_flags(p)
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--clock", default="real", choices=["real", "virtual"])
    p.add_argument("--address", default=None,
                   help="join a running Ray cluster (else RAY_ADDRESS, else start a local one)")
    p.add_argument("--rate", type=float, default=1.0, help="mean arrivals per second")
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=4, help="engines (one per GPU)")
    p.add_argument("--fanout", type=int, default=None,
                   help="max fills per branch (C2 arms; default: --workers - 1)")
    p.add_argument("--depth", type=int, default=None,
                   help=f"stages one fill may run (C2 arms; default: the workload's, else "
                        f"{DEFAULT_DEPTH})")
    p.add_argument("--gate", default="priced",
                   choices=["priced", "topk", "fixed-threshold", "priced-a1-only",
                            "priced-a0-fixed"],
                   help="C2 fill policy: C3's priced gate, no gate, or an attribution variant")
    p.add_argument("--p-star", type=float, default=0.5,
                   help="fixed threshold p* of the fixed-threshold gate variants")
    p.add_argument("--store-mb", type=int, default=1024, help="C1 store capacity (MiB)")
    p.add_argument("--eviction", default="lru", choices=["lru", "cost"],
                   help="C1 store eviction policy")
    p.add_argument("--predictor", default=None,
                   help="frequency | logit | entity | subtopic | recall | drafter (default: the workload's)")
    p.add_argument("--drafter-profile", default="qwen3-0.6b@h200",
                   help="--predictor drafter: the sim drafter engine's profile")
    p.add_argument("--drafter-model", default=None,
                   help="--predictor drafter: a real drafter model directory (hf | vllm)")
    p.add_argument("--drafter-workers", type=int, default=1,
                   help="--predictor drafter: drafter engines, shared by all workers")
    p.add_argument("--drafter-samples", type=int, default=8,
                   help="--predictor drafter: draft calls per branch (N)")
    p.add_argument("--drafter-think-tokens", type=int, default=0,
                   help="--predictor drafter: tokens each draft call reasons before it "
                        "answers (0: a drafter that answers at once)")
    p.add_argument("--arrival", default="poisson", choices=["poisson", "gamma"])
    p.add_argument("--cv", type=float, default=1.0,
                   help="coefficient of variation of gamma inter-arrival gaps")
    p.add_argument("--split", default="test", choices=["test", "train"])
    p.add_argument("--tool-time", default="modelled", choices=["modelled", "measured"],
                   help="charge tool stages a modelled latency or their measured time")
    p.add_argument("--decode-lengths", default="modelled", choices=["modelled", "recorded"],
                   help="replayed LLM stages decode modelled reasoning around the trace's "
                        "decision, or the recorded decision alone (real engines generate)")
    p.add_argument("--categories", default=None,
                   help="routing: BFCL categories or collections, comma-separated (default: "
                        "every category the workload scores, as BFCL's own default 'all')")
    p.add_argument("--plan", default=None, choices=["references", "resolved"],
                   help="subagent: the planner writes a bridge entity as #k, the k-th "
                        "sub-topic's finding (references: the chain is researched in order), "
                        "or as the answer it stands for (resolved: every sub-agent starts at "
                        "once, the planner handed the trace's answers); default: references")
    p.add_argument("--split-by", default=None, choices=["question", "step"],
                   help="react, subagent: split MuSiQue question by question (the default: "
                        "a test question may meet a single-hop step a train question asked, "
                        "the recurrence the paper measures), or keep questions that share a "
                        "step on one side (no test question meets a step of the history)")
    p.add_argument("--data-dir", default=None,
                   help="data directory (else $DYNBRANCH_DATA, else ../shared/data beside "
                        "the checkout or the working directory, else the per-user cache)")
    p.add_argument("--max-inflight", type=int, default=None,
                   help="admission control: reject a request arriving while this many are in "
                        "flight (a typed 'rejected' outcome); default: unbounded")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="cancel a request not done this many seconds after its scheduled "
                        "arrival (a typed 'deadline' outcome); default: none")
    p.add_argument("--tenants", type=int, default=1,
                   help="spread the requests over this many tenants (set by the serving side, "
                        "by arrival order): reuse never crosses tenants")
    p.add_argument("--gate-lane", action="store_true",
                   help="ray: send C3's gate calls over a Ray Compiled Graph channel (a decision's "
                        "p99 under 1 ms, not an actor call's several; the gate actor keeps "
                        "one CPU core busy while it is open)")
    p.add_argument("--no-stream-lanes", dest="stream_lanes", action="store_false",
                   help="ray: send engine calls, C3's gate calls and C1's lookups as Ray actor "
                        "calls, not over the direct stream each engine actor, the gate and "
                        "each store shard open on their node (a free port each; a lane that "
                        "cannot connect falls back to actor calls by itself)")
    p.add_argument("--network", default="none", choices=["none", "vastai-wan", "vastai-cluster"],
                   help="model the driver-to-worker network (engines on other nodes)")
    p.add_argument("--out", default="runs/replay",
                   help="result directory: a path or a filesystem URI (file://, s3://, gs://)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or report")


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """The real engines' settings: a TOML file and flags over it (dynbranch/engines/config.py)."""
    g = p.add_argument_group("real engines (hf | vllm)")
    g.add_argument("--engine-config", default=None, metavar="FILE",
                   help="TOML file of engine settings (see ray_cluster/engines/)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="share of GPU memory vLLM may use (default: vLLM's)")
    g.add_argument("--tensor-parallel-size", type=int, default=None,
                   help="GPUs per vLLM engine (default 1)")
    g.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--quantization", default=None, help="vLLM quantization method, e.g. awq")
    g.add_argument("--enforce-eager", default=None, action=argparse.BooleanOptionalAction,
                   help="vLLM without CUDA graphs or compilation (fast start)")


def _data_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="fetch the BFCL wheel; check the other data sets")
    p.add_argument("names", nargs="*", default=["bfcl"],
                   help="bfcl | musique | hotpotqa | sgd | swe_agent | all")
    p.add_argument("--check", action="store_true",
                   help="verify the data directory against its SHA256SUMS")
    p.add_argument("--data-dir", default=None)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _experiment_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="reproduce one table or figure of the paper")
    p.add_argument("name", help="table1 | table2 | fig5a | fig5b | ... (DESIGN.md §5)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None,
                   help="result directory: a path or a filesystem URI (file://, s3://, gs://)")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="replays (cells) run at once, each in a process of its own; the rows "
                        "are the same as with 1 (default 1; more than the cores is no faster)")


def _model_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="make a local model for the hf and vllm engines")
    p.add_argument("action", choices=["make-tiny", "fetch"],
                   help="make-tiny: write a seeded tiny Qwen3 model and its tokenizer; fetch: "
                        "download a Hugging Face model into this node's HF cache")
    p.add_argument("out_dir", metavar="TARGET",
                   help="make-tiny: directory to write the model into; fetch: model id")
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--heads", type=int, default=4,
                   help="attention heads (head size = hidden / heads; vLLM needs >= 64 on a "
                        "GPU and >= 32 on CPU, e.g. --hidden 128 --heads 2 --kv-heads 1)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    p.add_argument("--max-positions", type=int, default=40_960,
                   help="context length in tokens (BFCL prompts need up to ~17k here)")


def _calibrate_parser(sub: argparse._SubParsersAction) -> None:
    from dynbranch.calibrate import add_arguments

    p = sub.add_parser("calibrate", help="fit a profile's [calibration] knobs to a real "
                       "engine, or the sim profile to the paper's Fig. 5b",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)


def _stages_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stages", help="a run's stage log: tokens and seconds per stage, "
                       "branch windows, the Eq. 2 overlap bound")
    p.add_argument("run_dir", help="a replay's --out directory")
    p.add_argument("--depth", type=int, default=2, help="fill depth the bound assumes")


def _timeline_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("timeline", help="draw one request of a run as a per-stage timeline "
                       "(engine lanes, canonical and speculative stages, served-from marks)")
    p.add_argument("run_dir", help="a replay's --out directory")
    p.add_argument("--request", required=True, help="the request id (requests.parquet)")
    p.add_argument("--vs", default=None, metavar="OTHER_RUN_DIR",
                   help="a second run of the same request, drawn below and compared with "
                        "RUN_DIR (e.g. RUN_DIR the floor's run, --vs full's)")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/timeline-ID.png)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynbranch", description="replay a workload, read its stage log, fetch or check "
        "data, run an experiment, calibrate a profile, make a model")
    sub = parser.add_subparsers(dest="command", required=True)
    _replay_parser(sub)
    _data_parser(sub)
    _experiment_parser(sub)
    _calibrate_parser(sub)
    _model_parser(sub)
    _stages_parser(sub)
    _timeline_parser(sub)
    return parser


def cmd_replay(args: argparse.Namespace) -> int:
    from dynbranch.driver import ReplayConfig, prepare, run_replay
    from dynbranch.engines.config import engine_config_from

    engine_config = engine_config_from(
        args.engine_config, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size, dtype=args.dtype,
        quantization=args.quantization, enforce_eager=args.enforce_eager)
    if args.plan is not None and args.workload != "subagent":
        raise ConfigError(f"--plan sets how the subagent workload's planner writes bridges, "
                          f"not a setting of {args.workload!r}")
    if args.split_by is not None and args.workload not in ("react", "subagent"):
        raise ConfigError(f"--split-by sets how MuSiQue's questions are split (react, "
                          f"subagent), not a setting of {args.workload!r}")
    options = {} if args.plan is None else {"plan": args.plan}
    if args.split_by is not None:
        options["split_by"] = args.split_by
    cfg = ReplayConfig(engine_config=engine_config,
        workload=args.workload, arm=args.arm, engine=args.engine, profile=args.profile,
        model=args.model, backend=args.backend, clock=args.clock, rate=args.rate,
        requests=args.requests, seed=args.seed, workers=args.workers, fanout=args.fanout,
        arrival=args.arrival, cv=args.cv, split=args.split, tool_time=args.tool_time,
        decode_lengths=args.decode_lengths,
        categories=None if args.categories is None else tuple(args.categories.split(",")),
        data_dir=args.data_dir, address=args.address,
        predictor=args.predictor, drafter_profile=args.drafter_profile,
        drafter_model=args.drafter_model, drafter_workers=args.drafter_workers,
        drafter_samples=args.drafter_samples,
        drafter_think_tokens=args.drafter_think_tokens, depth=args.depth, gate=args.gate,
        p_star=args.p_star, store_mb=args.store_mb, eviction=args.eviction,
        max_inflight=args.max_inflight, deadline_s=args.deadline_s, tenants=args.tenants,
        gate_lane=args.gate_lane, stream_lanes=args.stream_lanes, network=args.network,
        out=args.out,
        progress=not args.quiet,
        workload_options=options)
    progress = print if not args.quiet else (lambda _msg: None)
    result = run_replay(prepare(cfg, progress), keep_log=False)
    if result.summary.get("interrupted"):
        s = result.summary
        print(f"dynbranch: interrupted by {s['interrupted_by']}: {s['completed']} requests "
              f"completed, {s['interrupted_requests']} cut short, {s['not_started']} never "
              f"started; partial results in {cfg.out}/", file=sys.stderr)
        return 130
    if not args.quiet:
        print(f"results in {cfg.out}/ (summary.json, requests.parquet, stages.parquet, "
              f"branches.parquet, latency_cdf.png)")
    failed = result.summary["failed"]
    if failed:
        # NOTE: the run itself completed, so the status is 0: a request that fails (a typed
        # error in requests.parquet) is a result, like a wrong answer, not a broken run.
        print(f"{failed} of {result.summary['requests']} requests failed: "
              f"{result.summary.get('errors', {})} (see {cfg.out}/requests.parquet)",
              file=sys.stderr)
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from dynbranch import datasets
    from workloads.routing import bfcl_wheel

    # NOTE: BFCL is the routing workload's (fetched into the cache from PyPI); the core's
    # registry holds the data directory sets. The command line is the layer that has both.
    known = {bfcl_wheel.BFCL.name: bfcl_wheel.BFCL, **datasets.DATASETS}
    names = list(known) if "all" in args.names else args.names
    data_dir = datasets.resolve_data_dir(args.data_dir)
    status = 0
    for name in names:
        if name not in known:
            from dynbranch.errors import UnknownNameError

            raise UnknownNameError("data set", name, list(known))
        if name == bfcl_wheel.BFCL.name:
            root = bfcl_wheel.fetch_bfcl(datasets.cache_dir())
            print(f"bfcl: ready at {root}")
            continue
        datasets.require_dataset(data_dir, name)
        print(f"{name}: present in {data_dir / name}")
    if args.check:
        if data_dir is None:
            print("no data directory found to check", file=sys.stderr)
            return 1
        problems = datasets.verify_checksums(data_dir)
        for p in problems:
            print(f"checksum: {p}", file=sys.stderr)
        print(f"checked {data_dir}: {'OK' if not problems else f'{len(problems)} problems'}")
        status = 1 if problems else 0
    return status


def cmd_experiment(args: argparse.Namespace) -> int:
    from dynbranch.outdir import OutDir
    from experiments import default_out, get_experiment
    from experiments.common import cell_jobs, staged, write_experiment

    run = get_experiment(args.name)
    dest = OutDir.parse(args.out if args.out else default_out(args.name))
    dest.check()  # NOTE: before the experiment runs, not after
    with staged(dest) as out, cell_jobs(args.jobs):
        experiment = run(quick=args.quick, out=out)
        write_experiment(experiment, out)
    print(experiment.report)
    print(f"results in {dest}/ (results.parquet, summary.json, report.md, "
          f"{', '.join(experiment.plots) or 'no plots'})")
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    import importlib.util

    if args.action == "fetch":
        from dynbranch.engines.model_ref import resolve_model

        print(resolve_model(args.out_dir))  # NOTE: a cached model resolves without network
        return 0
    missing = [m for m in ("torch", "transformers", "tokenizers")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"making a model needs {', '.join(missing)}: pip install '.[hf]'")
    from transformers.utils import logging

    from dynbranch.models.tiny import make_tiny

    logging.disable_progress_bar()  # NOTE: the files are written in milliseconds
    try:
        out = make_tiny(args.out_dir, seed=args.seed, hidden=args.hidden, heads=args.heads,
                        kv_heads=args.kv_heads, max_positions=args.max_positions)
    except ValueError as e:  # TinySpec's range checks name the offending values
        raise ConfigError(f"make-tiny: {e}") from None
    print(out)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from dynbranch.calibrate import main as calibrate_main

    return calibrate_main(args)


def cmd_stages(args: argparse.Namespace) -> int:
    from dynbranch.errors import ConfigError
    from dynbranch.stagelog import report

    if not (Path(args.run_dir) / "stages.parquet").is_file():
        raise ConfigError(f"{args.run_dir}: no stages.parquet (a replay's --out directory?)")
    from workloads import unfillable_stages

    summary = Path(args.run_dir) / "summary.json"
    name = json.loads(summary.read_text()).get("workload") if summary.is_file() else None
    print(report(args.run_dir, args.depth, unfillable_stages(name)))
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from dynbranch.timeline import describe, draw, load_request

    runs = [load_request(args.run_dir, args.request)]
    if args.vs:
        runs.append(load_request(args.vs, args.request))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.request)
    out = Path(args.out) if args.out else Path(args.run_dir) / f"timeline-{safe}.png"
    draw(runs, out)
    print(describe(runs))
    print(f"timeline in {out}")
    return 0


COMMANDS = {"replay": cmd_replay, "data": cmd_data, "experiment": cmd_experiment,
            "model": cmd_model, "calibrate": cmd_calibrate, "stages": cmd_stages,
            "timeline": cmd_timeline}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DynBranchError as e:
        print(f"dynbranch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dynbranch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
