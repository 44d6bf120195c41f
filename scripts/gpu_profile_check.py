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
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.engines.profile import Profile, SeqWork, known_profiles, load_profile  # noqa: E402

TOLERANCE = 0.10
"""A point is off when measured / simulated device time is outside 1 +- this."""
DECISIVE = 2.0
"""Fit a knob only on points whose bound is clear: the other roof this many times lower."""
L2_BYTES = 2 * 2**30
"""Time enough layers that their weights are this large (far above any L2 cache)."""
KV_LIMIT_BYTES = 40 * 2**30
"""The most KV cache one point allocates across its timed layers."""


@dataclass(frozen=True)
class Point:
    """One step shape: ``batch`` sequences computing ``new`` tokens after ``context``."""

    kind: str  # "decode" | "prefill"
    batch: int
    context: int
    new: int

    def work(self) -> list[SeqWork]:
        return [SeqWork(self.context, self.new)] * self.batch


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


# -- the layers ------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Layers:
    """``count`` decoder layers of ``profile``'s model with random weights."""

    def __init__(self, profile: Profile, count: int, device: str, dtype: torch.dtype) -> None:
        m = self.model = profile.model
        self.device, self.dtype = device, dtype
        q, kv = m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(*shape: int) -> torch.Tensor:
            w = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
            return w / math.sqrt(shape[0])

        ones = lambda n: torch.ones(n, device=device, dtype=dtype)  # noqa: E731
        self.layers = [
            {
                "ln1": ones(m.hidden_size),
                "qkv": weight(m.hidden_size, q + 2 * kv),
                "q_norm": ones(m.head_dim),
                "k_norm": ones(m.head_dim),
                "o": weight(q, m.hidden_size),
                "ln2": ones(m.hidden_size),
                "gate_up": weight(m.hidden_size, 2 * m.intermediate_size),
                "down": weight(m.intermediate_size, m.hidden_size),
            }
            for _ in range(count)
        ]
        self.lm_head = weight(m.hidden_size, m.vocab_size)

    def _qkv(self, w: dict, x: torch.Tensor, pos: torch.Tensor):  # noqa: ANN202
        m = self.model
        heads, kvh, d = m.num_attention_heads, m.num_kv_heads, m.head_dim
        q, k, v = (rms_norm(x, w["ln1"]) @ w["qkv"]).split([heads * d, kvh * d, kvh * d], -1)
        freqs = pos.float()[:, None] / (1e6 ** (torch.arange(0, d, 2, device=x.device) / d))
        cos = torch.cat((freqs.cos(), freqs.cos()), -1).to(x.dtype)[:, None, :]
        sin = torch.cat((freqs.sin(), freqs.sin()), -1).to(x.dtype)[:, None, :]
        q = rotary(rms_norm(q.view(-1, heads, d), w["q_norm"]), cos, sin)
        k = rotary(rms_norm(k.view(-1, kvh, d), w["k_norm"]), cos, sin)
        return q, k, v.view(-1, kvh, d)

    def _mlp(self, w: dict, x: torch.Tensor) -> torch.Tensor:
        gate, up = (rms_norm(x, w["ln2"]) @ w["gate_up"]).chunk(2, -1)
        return x + (F.silu(gate) * up) @ w["down"]

    def decode(self, x: torch.Tensor, caches: list, layers: int) -> torch.Tensor:
        """One decode step: ``x`` is (batch, hidden); each cache (batch, kv, context + 1, d)."""
        m = self.model
        b, group = x.shape[0], m.num_attention_heads // m.num_kv_heads
        pos = torch.full((b,), caches[0][0].shape[2] - 1, device=x.device)
        for w, (k_cache, v_cache) in zip(self.layers[:layers], caches, strict=False):
            q, k, v = self._qkv(w, x, pos)
            k_cache[:, :, -1] = k
            v_cache[:, :, -1] = v
            # NOTE: grouped-query decode without repeating K/V: a KV head's query group is
            # its "query length", so the kernel reads each cached K/V once.
            qg = q.view(b, m.num_kv_heads, group, m.head_dim)
            attn = F.scaled_dot_product_attention(qg, k_cache, v_cache)
            x = x + attn.reshape(b, -1) @ w["o"]
            x = self._mlp(w, x)
        return rms_norm(x, self.layers[0]["ln2"]) @ self.lm_head

    def prefill(self, x: torch.Tensor, caches: list, layers: int, context: int) -> torch.Tensor:
        """A prefill chunk: ``x`` is (new, hidden) after ``context`` cached tokens."""
        m = self.model
        n, group = x.shape[0], m.num_attention_heads // m.num_kv_heads
        pos = torch.arange(context, context + n, device=x.device)
        mask = _causal_mask(n, context + n, x.device)
        for w, (k_cache, v_cache) in zip(self.layers[:layers], caches, strict=False):
            q, k, v = self._qkv(w, x, pos)
            k_cache[0, :, context:] = k.transpose(0, 1)
            v_cache[0, :, context:] = v.transpose(0, 1)
            keys = k_cache.repeat_interleave(group, dim=1)
            values = v_cache.repeat_interleave(group, dim=1)
            q = q.transpose(0, 1)[None]
            if mask is None:
                attn = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
            else:
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + attn[0].transpose(0, 1).reshape(n, -1) @ w["o"]
            x = self._mlp(w, x)
        return rms_norm(x[-1:], self.layers[0]["ln2"]) @ self.lm_head


def _causal_mask(n: int, total: int, device: torch.device):  # noqa: ANN202
    """None for a fresh prompt (plain causal); else query i sees keys up to total - n + i."""
    if total == n:
        return None
    try:
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(n, total)
    except ImportError:  # older PyTorch: an explicit mask (a slower kernel)
        return torch.ones(n, total, dtype=torch.bool, device=device).tril(total - n)


# -- timing ----------------------------------------------------------------------------------


def _time(fn, device: str, reps: int, trials: int, graph: bool) -> tuple[float, str]:  # noqa: ANN001
    """Median seconds per call of ``fn`` (a CUDA graph replay where asked and possible)."""
    how = "eager"
    if device.startswith("cuda"):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                fn, how = g.replay, "cuda graph"
            except Exception as exc:  # noqa: BLE001 - any capture failure: time eagerly
                how = f"eager (graph capture failed: {type(exc).__name__})"
        results = []
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            results.append(start.elapsed_time(end) / 1e3 / reps)
        return statistics.median(results), how
    fn()
    results = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        results.append((time.perf_counter() - t0) / reps)
    return statistics.median(results), how


def measure(layers: Layers, point: Point, timed: int, grid: Grid) -> tuple[float, int, str]:
    """Seconds of one full-depth step at ``point`` (``timed`` layers, scaled), and how."""
    m, dev, dtype = layers.model, layers.device, layers.dtype
    kv_bytes = 2 * point.batch * (point.context + point.new) * m.num_kv_heads * m.head_dim
    timed = max(1, min(timed, KV_LIMIT_BYTES // max(1, kv_bytes * dtype.itemsize)))
    shape = (point.batch, m.num_kv_heads, point.context + point.new, m.head_dim)
    caches = [
        (torch.randn(shape, device=dev, dtype=dtype), torch.randn(shape, device=dev, dtype=dtype))
        for _ in range(timed)
    ]
    with torch.inference_mode():
        if point.kind == "decode":
            x = torch.randn(point.batch, m.hidden_size, device=dev, dtype=dtype)
            run = lambda: layers.decode(x, caches, timed)  # noqa: E731
            seconds, how = _time(run, dev, grid.decode_reps, grid.trials, graph=True)
        else:
            x = torch.randn(point.new, m.hidden_size, device=dev, dtype=dtype)
            run = lambda: layers.prefill(x, caches, timed, point.context)  # noqa: E731
            seconds, how = _time(run, dev, grid.prefill_reps, grid.trials, graph=False)
        head_x = torch.randn(point.batch, m.hidden_size, device=dev, dtype=dtype)
        head_s, _ = _time(
            lambda: head_x @ layers.lm_head, dev, grid.decode_reps, grid.trials, False
        )
    # The timed stack includes one LM head; the model has num_layers layers and one head.
    return (seconds - head_s) * m.num_layers / timed + head_s, timed, how


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
    shipped = [load_profile(n) for n in known_profiles()]
    here = [p for p in shipped if _gpu_family(p.gpu.name) == _gpu_family(device_name)]
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
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    grid = TINY_GRID if args.tiny else Grid()
    rows, proposals, stopped = [], {}, False
    for profile, note in profiles_for(device_name, args.tiny):
        count = timed_layers(profile, args.tiny)
        layers = Layers(profile, count, args.device, dtype)
        mine = []
        for point in grid.points(profile):
            if time.perf_counter() - t0 > args.budget_s:
                stopped = True
                break
            seconds, timed, how = measure(layers, point, count, grid)
            row = {
                **compare(profile, point, seconds),
                "timed_layers": timed,
                "how": how,
                "note": note,
            }
            mine.append(row)
            print(
                f"{row['profile']:34s} {point.kind:7s} b={point.batch:<4d} ctx={point.context:<6d}"
                f" new={point.new:<5d} measured {row['measured_ms']:9.3f} ms  sim "
                f"{row['sim_device_ms']:9.3f} ms ({row['sim_bound']})  x{row['ratio']:.2f}",
                flush=True,
            )
        del layers
        if args.device.startswith("cuda"):
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


if __name__ == "__main__":
    sys.exit(main())
