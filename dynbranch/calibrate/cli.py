"""The ``dynbranch calibrate`` command line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dynbranch.calibrate.contention import ContentionShape, fit_contention
from dynbranch.calibrate.engine import fit_profile, measure_cpu, measure_engine, profile_from_hf
from dynbranch.calibrate.profile_io import write_profile
from dynbranch.engines.profile import Profile
from dynbranch.engines.protocol import Engine

# -- the command line ----------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dynbranch calibrate`` flags."""
    p.add_argument(
        "--engine",
        default="hf",
        choices=["hf", "vllm"],
        help="real engine to measure (ignored with --contention)",
    )
    p.add_argument("--model", default=None, help="model directory (hf) or model (vllm)")
    p.add_argument(
        "--base-profile",
        default=None,
        help="profile to start from (hf: derived from the model when omitted)",
    )
    p.add_argument(
        "--contention",
        action="store_true",
        help="fit the sim profile to the paper's Fig. 5b points instead",
    )
    p.add_argument("--profile", default="qwen3-32b@h200", help="sim profile (--contention)")
    p.add_argument(
        "--batch-sizes", type=_ints, default=None, help="decode batch sizes, e.g. 1,2,4,8"
    )
    p.add_argument(
        "--contexts", type=_ints, default=None, help="prompt lengths in tokens, e.g. 32,128,512"
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions and points")
    p.add_argument("--out", required=True, help="profile TOML file to write")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


GRIDS = {
    # (batch sizes, prompt lengths): the tiny model on a CPU; a served model on a GPU.
    "hf": ((1, 2, 4, 8), (32, 128, 512)),
    "vllm": ((1, 8, 32, 128), (256, 1024, 4096)),
}
QUICK_GRIDS = {"hf": ((1, 4), (32, 256)), "vllm": ((1, 32), (256, 2048))}


def main(args: argparse.Namespace) -> int:
    """Run ``dynbranch calibrate`` with parsed ``args``; prints the fit report."""
    if args.contention:
        return _contention_main(args)
    return _engine_main(args)


def _write(
    profile: Profile, out: str, title: str, report_lines: Sequence[str], report: Mapping[str, Any]
) -> None:
    path = Path(out)
    write_profile(profile, path, [title, *report_lines])
    path.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print("\n".join(report_lines))
    print(f"profile written to {path} (fit report: {path.with_suffix('.json')})")


def _contention_main(args: argparse.Namespace) -> int:
    from dynbranch.engines.profile import load_profile

    shape = ContentionShape(repetitions=3 if args.quick else 5)
    fitted, report = fit_contention(load_profile(args.profile), shape=shape)
    _write(
        fitted,
        args.out,
        f"{args.profile} calibrated to paper Fig. 5b (dynbranch calibrate --contention)",
        report.lines(),
        report.to_dict(),
    )
    return 0


def _engine_main(args: argparse.Namespace) -> int:
    from dynbranch.clock import RealClock
    from dynbranch.engines import make_engine
    from dynbranch.engines.profile import load_profile, load_profile_file
    from dynbranch.errors import ConfigError

    if args.model is None:
        raise ConfigError("dynbranch calibrate --engine needs --model")
    clock = RealClock()
    if args.base_profile is not None and args.base_profile.endswith(".toml"):
        base = load_profile_file(args.base_profile)
    elif args.base_profile is not None:
        base = load_profile(args.base_profile)
    elif args.engine == "hf":
        base = profile_from_hf(args.model, measure_cpu())
    else:
        raise ConfigError("dynbranch calibrate --engine vllm needs --base-profile")

    def factory() -> Engine:
        return make_engine(args.engine, profile=args.model, clock=clock, engine_id="calibrate")

    batches, contexts = (QUICK_GRIDS if args.quick else GRIDS)[args.engine]
    batches = getattr(args, "batch_sizes", None) or batches
    contexts = getattr(args, "contexts", None) or contexts
    fitted, report = fit_profile(base, measure_engine(factory, clock, batches, contexts))
    _write(
        fitted,
        args.out,
        f"{base.name} calibrated against the {args.engine} engine "
        f"serving {args.model} (dynbranch calibrate)",
        report.lines(),
        asdict(report),
    )
    return 0


__all__ = ["GRIDS", "QUICK_GRIDS", "add_arguments", "main"]
