"""What Fig. 10 and Fig. 11 share: Routing at a set exact-replay share, ``full`` against the
floor, speedups.

Why Routing, share 0.22 and one rate for every model: :data:`WHY` (quoted in both reports).

**Speedup** = the paired floor's mean latency over the arm's; **saving** = the difference
in seconds per request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.common import Cell
from experiments.pairing import pair_key
from experiments.rates import canonical_llm_s, rate_for
from experiments.streams import exact_replay_share, repeating, shaped

WORKLOAD = "routing"
WHY = (
    "Workload: Routing. Neither figure names its workload. Routing is the paper's reference "
    "workload elsewhere (the Fig. 12 case study, the Fig. 14 load decomposition); its BFCL "
    "records recur byte for byte when asked again, which is what Fig. 10a's exact-replay "
    "share sets; and its branches choose among the record's listed functions, the bounded "
    "candidate set a drafter ranks in Fig. 11b. The model, backbone and drafter sweeps run at "
    "share 0.22, the low end of Fig. 10a, whose 1.8× speedup lies inside the paper's "
    "model-size range (1.75–2.06×). One arrival rate serves every model (ρ = 0.5 canonical "
    "LLM calls in flight per engine of the 32B), so every model serves the same traffic and "
    "the smaller ones carry less load: the paper's \"larger serving models increase absolute "
    'savings" is about the same requests taking longer.'
)
BASE_SHARE = 0.22
BASE_PROFILE = "qwen3-32b@h200"
RHO = 0.5
WORKERS = 4


def base_rate(out: Path) -> tuple[float, float]:
    """(the arrival rate every model is measured at, the 32B pilot's T_llm)."""
    llm_s = canonical_llm_s(WORKLOAD, replay(BASE_PROFILE), out / "pilot")
    return rate_for(RHO, WORKERS, llm_s), llm_s


def replay(profile: str, **extra: Any) -> dict[str, Any]:
    """Replay settings with ``profile`` on every worker."""
    return {"profile": profile, "workers": WORKERS, "tool_time": "modelled", **extra}


def variant(share: float, **tags: str) -> str:
    """A cell's variant: its tags and its share (``profile=…,share=0.22``)."""
    return ",".join([*(f"{k}={v}" for k, v in tags.items()), f"share={share:g}"])


def tag(cell_or_row: Cell | dict[str, Any], key: str) -> str | None:
    """One tag of a variant (``None`` when the variant has none)."""
    text = cell_or_row.variant if isinstance(cell_or_row, Cell) else cell_or_row["variant"]
    found = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
    return found.get(key)


def trio(
    v: str,
    rate: float,
    n: int,
    seed: int,
    settings: dict[str, Any],
    arm_settings: dict[str, Any] | None = None,
) -> list[Cell]:
    """The floor, ``full`` and the oracle of one configuration (one arrival schedule)."""
    full = {**settings, **(arm_settings or {})}
    return [
        Cell(WORKLOAD, "floor", v, rate, n, seed, settings),
        Cell(WORKLOAD, "full", v, rate, n, seed, full),
        Cell(WORKLOAD, "oracle", v, rate, n, seed, settings),
    ]


def customize(cell: Cell, prepared: Any) -> Any:
    """Draw the cell's stream at its exact-replay share."""
    share = float(tag(cell, "share") or 0.0)
    return shaped(prepared, repeating(share), cell.variant)


def replay_share(cell: Cell, result: Any) -> dict[str, Any]:
    """The stream's measured exact-replay share and the cell's tags."""
    out: dict[str, Any] = {"exact_replay_share": exact_replay_share(result.requests)}
    out.update({k: tag(cell, k) for k in ("profile", "drafter") if tag(cell, k) is not None})
    return out


def add_speedup(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``speedup``, ``saving_s`` and ``accuracy_delta`` of every row against its floor."""
    floors = {pair_key(r): r for r in rows if r["arm"] == "floor"}
    for r in rows:
        f = floors.get(pair_key(r))
        mean, fmean = r.get("mean_latency_s"), f.get("mean_latency_s") if f else None
        r["speedup"] = fmean / mean if fmean and mean else None
        r["saving_s"] = fmean - mean if fmean is not None and mean is not None else None
        acc, facc = r.get("accuracy"), f.get("accuracy") if f else None
        r["accuracy_delta"] = acc - facc if acc is not None and facc is not None else None
    return rows
