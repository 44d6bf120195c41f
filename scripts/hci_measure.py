"""HCI under the utterance-reading reply: floor, C1, C2 (with and without the prefix warm-up)
and the Eq. 2 bounds, on the virtual clock with simulated engines.

    python scripts/hci_measure.py [--requests 100] [--rates 0.5 1.0] [--out /tmp/hci-measure]

Per rate it replays ``floor``, ``c1``, ``full`` and ``c2`` (C3's priced gate and, to see the
mechanism without the gate's refusals, ``--gate topk`` with fanout 2), each with the
``respond_prefix`` warm-up on and off, plus one counterfactual: ``c2`` whose placement puts
a warm-up on the request's home engine (:class:`WarmupAtHome`, defined here only; the
shipped session-affinity policy sends every fill off home). It prints, per run, mean / p50 /
p99 latency and the change against the paired floor, fills, unsafe splices, how canonical
``respond`` rows were served and their mean cached prompt tokens, and the replay's wall
time; and from the floor's stage log the gross Eq. 2 bound (every post-click stage
fillable) and HCI's own (the lookup plus the reply prefill a warm-up could take over,
priced with the profile's roofline for a lone prefill step). Writes ``results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd

from dynbranch.arms.registry import get_arm
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.engines.profile import SeqWork, load_profile
from dynbranch.engines.protocol import CANONICAL, GenerateRequest
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.runtime.placement import SessionAffinity
from workloads.hci import TEMPLATE, overlap_share

BLOCK = 16


class WarmupAtHome(SessionAffinity):
    """Session affinity, except that a ``respond_prefix`` fill goes to the request's home.

    NOTE: a counterfactual for measurement only. It recognises the warm-up by its call id
    (``request/fill/n/stage``); a placement change in the project would carry the intent
    on the request instead (see the report).
    """

    name = "session-affinity-warm-home"

    def place(self, outstanding, request: GenerateRequest):
        home = self._home.get(request.session) if request.session else None
        warm = request.priority > CANONICAL and request.request_id.endswith("/respond_prefix")
        if warm and home is not None and home < len(outstanding):
            return home, None
        return super().place(outstanding, request)


def replay(out: Path, rate: float, n: int, arm: str, home: bool = False, **kw) -> dict:
    """One replay; its summary with the respond rows' serving and cached tokens."""
    options = {"prefix_warmup": kw.pop("warmup", False)}
    cfg = ReplayConfig(
        workload="hci",
        arm=arm,
        backend="local",
        clock="virtual",
        requests=n,
        rate=rate,
        seed=0,
        workers=4,
        out=out,
        progress=False,
        workload_options=options,
        **kw,
    )
    prepared = prepare(cfg, progress=lambda _m: None)
    if home:
        prepared = dataclasses.replace(
            prepared, arm=dataclasses.replace(get_arm(arm), make_placement=WarmupAtHome)
        )
    s = run_replay(prepared).summary
    stages = pd.read_parquet(out / "stages.parquet")
    respond = stages[(stages.stage == "respond") & ~stages.speculative]
    warm = stages[stages.stage == "respond_prefix"]
    return {
        "mean_s": s["mean_latency_s"],
        "p50_s": s["p50_latency_s"],
        "p99_s": s["p99_latency_s"],
        "accuracy": s["accuracy"],
        "failed": s["failed"],
        "unsafe": s["unsafe_splices"],
        "issued": s["fills_issued"],
        "consumed": s["fills_consumed"],
        "discarded": s["fills_discarded"],
        "wall_s": s["wall_s"],
        "respond_served": respond.served_from.value_counts().to_dict(),
        "respond_cached": float(respond.cached_prompt_tokens.mean()),
        "respond_prompt": float(respond.prompt_tokens.mean()),
        "warmups": len(warm),
        "stages": stages,
        "prepared": prepared,
    }


def prefill_saving(floor: dict, profile_name: str = "qwen3-32b@h200") -> dict[str, float]:
    """Per request, what a warm-up of the reply's known prefix could save of its prefill.

    The canonical reply's first step computes its uncached tokens on top of what is cached;
    a warm-up raises the cached part to the prefix's whole blocks. Priced as a lone step.
    """
    profile = load_profile(profile_name)
    rows = floor["stages"]
    respond = rows[(rows.stage == "respond") & ~rows.speculative].set_index("request_id")
    out = {}
    for inst in floor["prepared"].instances:
        r = respond.loc[inst.request_id]
        result = inst.tool("sgd").call(inst.lookup_values(inst.chosen)).value
        prefix = TEMPLATE.stage("respond_prefix").render(
            inst.prefix_values(inst.chosen, result, inst.episode.offer)
        )
        prompt, cached = int(r.prompt_tokens), int(r.cached_prompt_tokens)
        warm = max(cached, count_tokens(prefix.text) // BLOCK * BLOCK)

        def step(c: int, p: int = prompt) -> float:
            return profile.step_cost([SeqWork(c, p - c)]).total_s

        out[inst.request_id] = step(cached) - step(warm)
    return out


def bounds(floor: dict) -> dict[str, float]:
    """Eq. 2 on the floor's stage log: gross, HCI's (lookup + prefix prefill), no-cache."""
    stages, saving = floor["stages"], prefill_saving(floor)
    gross = overlap_share(stages)
    hci = overlap_share(stages, fillable=("lookup",), extra_s=saving)
    lookup = overlap_share(stages, fillable=("lookup",))
    return {
        "gross_share": gross.post_click_share,
        "gross_mean_s": gross.overlap_s / gross.requests,
        "hci_share": hci.post_click_share,
        "hci_mean_s": hci.overlap_s / hci.requests,
        "lookup_share": lookup.post_click_share,
        "prefill_saving_mean_s": sum(saving.values()) / len(saving),
    }


VARIANTS = {  # name: (arm, options)
    "c1": ("c1", {}),
    "full": ("full", {}),
    "c2": ("c2", {}),
    "c2-warmup": ("c2", {"warmup": True}),
    "c2-topk": ("c2", {"gate": "topk", "fanout": 2}),
    "c2-topk-warmup": ("c2", {"gate": "topk", "fanout": 2, "warmup": True}),
    "c2-topk-warmup-home": ("c2", {"gate": "topk", "fanout": 2, "warmup": True, "home": True}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/hci-measure"))
    args = ap.parse_args()
    results = {}
    for rate in args.rates:
        floor = replay(args.out / f"{rate}-floor", rate, args.requests, "floor")
        rows = {"floor": floor}
        for name, (arm, options) in VARIANTS.items():
            rows[name] = replay(
                args.out / f"{rate}-{name}", rate, args.requests, arm, **dict(options)
            )
        b = bounds(floor)
        print(
            f"\nrate {rate}/s, {args.requests} requests; Eq. 2 (post-click share): "
            + ", ".join(f"{k} {v:.4f}" for k, v in b.items())
        )
        print(
            f"{'run':20} {'mean_s':>7} {'vs floor':>8} {'p50_s':>6} {'p99_s':>7} "
            f"{'iss/con/dis':>12} {'unsafe':>6} {'warm':>4} {'cached/prompt':>13} "
            f"{'respond served':>22} {'wall_s':>6}"
        )
        for name, r in rows.items():
            d = r["mean_s"] / floor["mean_s"] - 1
            print(
                f"{name:20} {r['mean_s']:7.3f} {d:+8.2%} {r['p50_s']:6.2f} {r['p99_s']:7.2f} "
                f"{r['issued']:>4}/{r['consumed']:>3}/{r['discarded']:>3} {r['unsafe']:>6} "
                f"{r['warmups']:>4} {r['respond_cached']:6.1f}/{r['respond_prompt']:6.1f} "
                f"{json.dumps(r['respond_served']):>22} {r['wall_s']:6.2f}"
            )
        results[str(rate)] = {
            "bounds": b,
            "runs": {
                k: {f: v for f, v in r.items() if f not in ("stages", "prepared")}
                for k, r in rows.items()
            },
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
