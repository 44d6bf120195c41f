"""Time Qwen3-shaped transformer layers on this GPU beside the sim profiles' step times.

    python scripts/gpu_profile_check.py --out gpu-check          # one GPU, under 8 minutes
    python scripts/gpu_profile_check.py --device cpu --tiny --out /tmp/gpu-check   # seconds

For the model of every shipped profile (``dynbranch/engines/profiles/*.toml``: the shapes
of the public Qwen3-32B, -8B and -0.6B configs) it builds a few decoder layers with random
weights (bf16 on a GPU) — RMSNorm, fused QKV with per-head q/k norms and rotary, grouped
query attention over a KV cache, SwiGLU MLP — and times, with PyTorch only (no vLLM, no
weights, no network):

* decode steps: ``batch`` sequences, one new token each, attending to a KV cache of
  ``context`` tokens (CUDA-graph replays, as vLLM decodes);
* prefill chunks: ``new`` tokens after ``context`` cached ones, causal.

A few layers are timed (enough that their weights dwarf the L2 cache) and scaled to the
model's depth, plus the LM head for each sequence's last token. Each point is set beside
``Profile.step_cost`` for the same batch: the *device* part of the roofline,
max(compute, memory); the host terms (step and per-sequence overheads) are vLLM's
scheduling and sampling, which this check cannot see. A profile whose GPU is not this
device is compared as its model on this device (the matching profile's GPU and
calibration). Where a point differs by more than 10 %, it proposes ``bandwidth_efficiency``
(from memory-bound points) and ``mfu`` (from compute-bound ones) that would fit — printed,
never written into a profile. Attention here is PyTorch's SDPA, a stand-in for vLLM's
paged kernels. Writes ``gpu_profile_check.json`` and ``gpu_profile_check.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.engines.profile import Profile, known_profiles, load_profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_layers import Layers, Point, measure  # noqa: E402

TOLERANCE = 0.10
"""A point is off when measured / simulated device time is outside 1 +- this."""
DECISIVE = 2.0
"""Fit a knob only on points whose bound is clear: the other roof this many times lower."""
L2_BYTES = 2 * 2**30
"""Time enough layers that their weights are this large (far above any L2 cache)."""


@dataclass(frozen=True)
class Grid:
    """What to time, how long."""

    decode_batches: tuple[int, ...] = (1, 8, 32, 128)
    decode_contexts: tuple[int, ...] = (1024, 4096, 16384, 32768)
    prefill_tokens: tuple[int, ...] = (512, 2048, 8192)
    prefill_contexts: tuple[int, ...] = (0, 8192)
    max_kv_tokens: int = 262_144  # decode batch x context, as a KV pool would hold
    trials: int = 3
    decode_reps: int = 20
    prefill_reps: int = 5

    def points(self, profile: Profile) -> list[Point]:
        limit = min(self.max_kv_tokens, profile.kv_pool_tokens)
        out = [
            Point("decode", b, c, 1)
            for b in self.decode_batches
            for c in self.decode_contexts
            if b * c <= limit and c < profile.model.max_model_len
        ]
        out += [
            Point("prefill", 1, c, n)
            for n in self.prefill_tokens
            for c in self.prefill_contexts
            if c + n <= profile.model.max_model_len
        ]
        return out


TINY_GRID = Grid((1, 2), (16, 64), (8, 512), (0, 16), 4096, trials=1, decode_reps=2, prefill_reps=1)
TINY_SHAPES = {  # name -> (layers, hidden, heads, kv heads, head dim, intermediate, vocab)
    "qwen3-32b": (4, 160, 8, 1, 16, 640, 512),
    "qwen3-8b": (4, 128, 8, 2, 16, 384, 512),
    "qwen3-0.6b": (4, 64, 4, 2, 16, 192, 512),
}


# -- comparing and refitting -----------------------------------------------------------------


def compare(profile: Profile, point: Point, measured_s: float) -> dict:
    """One table row: the measured step beside the profile's roofline for it."""
    cost = profile.step_cost(point.work())
    device_s = max(cost.compute_s, cost.memory_s)
    return {
        "profile": profile.name,
        **dataclasses.asdict(point),
        "measured_ms": measured_s * 1e3,
        "sim_device_ms": device_s * 1e3,
        "sim_compute_ms": cost.compute_s * 1e3,
        "sim_memory_ms": cost.memory_s * 1e3,
        "sim_overhead_ms": cost.overhead_s * 1e3,
        "sim_bound": cost.bound,
        "ratio": measured_s / device_s,
    }


def propose(profile: Profile, rows: list[dict]) -> dict[str, dict] | None:
    """Calibration knobs that would fit ``rows`` (None when every point is within 10 %).

    A memory-bound point implies the bandwidth efficiency that makes the roofline's memory
    time equal the measured time (memory time scales as 1 / efficiency); a compute-bound
    point implies an MFU the same way. Each knob is the median over decisive points.
    """
    if all(abs(r["ratio"] - 1) <= TOLERANCE for r in rows):
        return None
    cal, out = profile.calibration, {}
    for knob, bound, term in (
        ("bandwidth_efficiency", "memory", "sim_memory_ms"),
        ("mfu", "compute", "sim_compute_ms"),
    ):
        other = "sim_compute_ms" if bound == "memory" else "sim_memory_ms"
        implied = [
            getattr(cal, knob) * r[term] / r["measured_ms"]
            for r in rows
            if r["sim_bound"] == bound and r[term] >= DECISIVE * r[other]
        ]
        if implied:
            value = min(1.0, statistics.median(implied))
            out[knob] = {"now": getattr(cal, knob), "proposed": value, "points": len(implied)}
    return out


def refit_rows(profile: Profile, rows: list[dict], knobs: dict[str, dict]) -> list[float]:
    """Measured / simulated device time for every row under the proposed knobs."""
    fitted = profile.with_calibration(**{k: v["proposed"] for k, v in knobs.items()})
    ratios = []
    for r in rows:
        point = Point(r["kind"], r["batch"], r["context"], r["new"])
        ratios.append(compare(fitted, point, r["measured_ms"] / 1e3)["ratio"])
    return ratios


# -- profiles to check -----------------------------------------------------------------------


def _gpu_family(name: str) -> str:
    words = name.upper().replace("NVIDIA", "").replace("GEFORCE", "").split()
    return " ".join(w for w in words if w not in {"NVL", "SXM", "SXM5", "PCIE"})


def profiles_for(device_name: str, tiny: bool) -> list[tuple[Profile, str]]:
    """(profile to compare against, note) for every shipped profile's model."""
    # NOTE: the Qwen3 shapes this check builds layers for (TINY_SHAPES names them); a model
    # with a profile for this device is compared with that one only.
    shipped = [p for p in map(load_profile, known_profiles())
               if p.name.split("@")[0] in TINY_SHAPES]
    here = [p for p in shipped if _gpu_family(p.gpu.name) == _gpu_family(device_name)]
    models_here = {p.model.name for p in here}
    shipped = [p for p in shipped if p in here or p.model.name not in models_here]
    if not here:  # no profile for this device: each model once (the first shipped)
        shipped = list({p.model.name: p for p in reversed(shipped)}.values())[::-1]
    out = []
    for p in shipped:
        note = ""
        if here and _gpu_family(p.gpu.name) != _gpu_family(device_name):
            # The calibration of this device's profile whose model is nearest in size.
            host = min(here, key=lambda h: abs(math.log(h.param_count / p.param_count)))
            note = f"{p.model.name} shapes on {host.gpu.name} (GPU and calibration of {host.name})"
            p = dataclasses.replace(
                p,
                name=f"{p.name.split('@')[0]}@{host.name.split('@')[1]} (derived)",
                gpu=host.gpu,
                calibration=host.calibration,
                scheduler=host.scheduler,
            )
        elif not here:
            note = f"no shipped profile is for {device_name}: compared against {p.gpu.name}"
        if tiny:
            fields = TINY_SHAPES[p.name.split("@")[0]]
            names = (
                "num_layers",
                "hidden_size",
                "num_attention_heads",
                "num_kv_heads",
                "head_dim",
                "intermediate_size",
                "vocab_size",
            )
            model = dataclasses.replace(p.model, **dict(zip(names, fields, strict=True)))
            p, note = dataclasses.replace(p, name=f"{p.name} (tiny)", model=model), "tiny shapes"
        out.append((p, note))
    return out


def timed_layers(profile: Profile, tiny: bool) -> int:
    """How many layers to build: enough weight bytes to defeat caches (at most all)."""
    if tiny:
        return 2
    per_layer = (
        profile.layer_matmul_params / profile.model.num_layers * profile.model.bytes_per_param
    )
    return int(min(profile.model.num_layers, max(4, math.ceil(L2_BYTES / per_layer))))


# -- reporting -------------------------------------------------------------------------------


def markdown(report: dict) -> str:
    """The report as a markdown table and the proposed knobs."""
    lines = [
        f"# GPU profile check on {report['device']}",
        "",
        f"PyTorch {report['torch']}, {report['dtype']}, {report['elapsed_s']:.0f} s. Device "
        "time only: max(compute, memory) of `Profile.step_cost`; the host overheads are not "
        "measured here.",
        "",
        "| profile | kind | batch | context | new | layers timed | measured ms | sim ms | bound "
        "| measured / sim |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        flag = " **off**" if abs(r["ratio"] - 1) > TOLERANCE else ""
        lines.append(
            f"| {r['profile']} | {r['kind']} | {r['batch']} | {r['context']} | {r['new']} "
            f"| {r['timed_layers']} | {r['measured_ms']:.3f} | {r['sim_device_ms']:.3f} "
            f"| {r['sim_bound']} | {r['ratio']:.2f}{flag} |"
        )
    lines += ["", "## Proposed calibration (not written into any profile)", ""]
    for name, p in report["proposals"].items():
        knobs = ", ".join(
            f"`{k} = {v['proposed']:.4g}` (now {v['now']:.4g}, {v['points']} points)"
            for k, v in p["knobs"].items()
        )
        lines.append(
            f"- {name}: {knobs or 'no decisive points'}; refit ratios "
            f"{p['refit_min']:.2f}-{p['refit_max']:.2f}"
        )
    if not report["proposals"]:
        lines.append("Every point is within 10 %: no refit proposed.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 on success, 2 when asked for a GPU that is not there."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and grid (seconds, CPU)")
    ap.add_argument("--out", type=Path, default=Path("gpu-profile-check"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop measuring after this")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or use --device cpu --tiny", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # NOTE: steadier timings of tiny CPU kernels
    try:
        return _check(args)
    finally:
        torch.set_num_threads(threads)


def _check(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    grid = TINY_GRID if args.tiny else Grid()
    rows, proposals, stopped = [], {}, False
    for profile, note in profiles_for(device_name, args.tiny):
        mine, stopped = _measure_profile(profile, note, grid, args, t0, dtype)
        if cuda:
            torch.cuda.empty_cache()
        knobs = propose(profile, mine) if mine else None
        if knobs is not None:
            ratios = refit_rows(profile, mine, knobs)
            proposals[profile.name] = {
                "knobs": knobs,
                "refit_min": min(ratios),
                "refit_max": max(ratios),
                "note": note,
            }
        rows += mine
    report = {
        "device": device_name,
        "torch": torch.__version__,
        "dtype": str(dtype),
        "tiny": args.tiny,
        "stopped_at_budget": stopped,
        "elapsed_s": time.perf_counter() - t0,
        "rows": rows,
        "proposals": proposals,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_profile_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "gpu_profile_check.md").write_text(markdown(report))
    for name, p in proposals.items():
        for knob, v in p["knobs"].items():
            print(
                f"proposed [calibration] {knob} = {v['proposed']:.4g} for {name} "
                f"(now {v['now']:.4g}; from {v['points']} points)"
            )
    print(f"wrote {args.out}/gpu_profile_check.json and .md in {report['elapsed_s']:.0f} s")
    return 0


def _measure_profile(
    profile: Profile, note: str, grid: Grid, args: argparse.Namespace, t0: float, dtype: torch.dtype
) -> tuple[list[dict], bool]:
    """Every point of ``grid`` for ``profile``'s shapes; whether the time budget ran out."""
    count = timed_layers(profile, args.tiny)
    layers = Layers(profile, count, args.device, dtype)
    rows = []
    for point in grid.points(profile):
        if time.perf_counter() - t0 > args.budget_s:
            return rows, True
        seconds, timed, how = measure(layers, point, count, grid)
        row = {**compare(profile, point, seconds), "timed_layers": timed, "how": how, "note": note}
        rows.append(row)
        print(
            f"{row['profile']:34s} {point.kind:7s} b={point.batch:<4d} ctx={point.context:<6d}"
            f" new={point.new:<5d} measured {row['measured_ms']:9.3f} ms  sim "
            f"{row['sim_device_ms']:9.3f} ms ({row['sim_bound']})  x{row['ratio']:.2f}",
            flush=True,
        )
    return rows, False


if __name__ == "__main__":
    sys.exit(main())
