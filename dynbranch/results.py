"""Results of a replay, exactly as DESIGN §5 fixes them.

``summary.json`` (every listed field, zeros where a mechanism is not in the arm),
``requests.parquet``, ``stages.parquet``, ``branches.parquet``, a latency CDF
(``latency_cdf.png``) and a text report in the style of ``vllm bench serve``.
"""

from __future__ import annotations

import dataclasses
import io
import json
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dynbranch.audit import unsafe_splices, unverified_splices
from dynbranch.outdir import OutDir
from dynbranch.runtime.runlog import BranchRecord, RequestRecord, StageRecord

SUMMARY_FIELDS = (
    "workload", "arm", "engine", "backend", "rate", "requests", "completed", "failed",
    "mean_latency_s", "p50_latency_s", "p99_latency_s", "accuracy", "reuse_hits",
    "promotions", "fills_issued", "fills_consumed", "fills_discarded", "spec_engine_s",
    "unsafe_splices", "wall_s",
)


def summarize(run: Mapping[str, Any], requests: Sequence[RequestRecord],
              stages: Sequence[StageRecord] | StageTally, fills: Mapping[str, int] | None = None,
              mechanisms: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's summary: ``run`` holds its settings (workload, arm, …, wall_s).

    ``stages`` is the stage log, or its :class:`StageTally` when the rows were streamed away.
    """
    tally = stages if isinstance(stages, StageTally) else StageTally.of(stages)
    done = [r for r in requests if r.status == "completed"]
    lat = np.array([r.latency for r in done]) if done else np.array([np.nan])
    scored = [r.correct for r in done if r.correct is not None]
    fills = dict(fills or {})
    sim_s = max((r.end for r in requests), default=0.0)
    out: dict[str, Any] = {
        **{k: run[k] for k in ("workload", "arm", "engine", "backend", "rate")},
        "requests": len(requests), "completed": len(done),
        "failed": sum(r.status == "failed" for r in requests),
        "mean_latency_s": _f(np.mean(lat)), "p50_latency_s": _f(np.percentile(lat, 50)),
        "p99_latency_s": _f(np.percentile(lat, 99)),
        "accuracy": _f(np.mean(scored)) if scored else None,
        "reuse_hits": tally.reuse_hits, "promotions": tally.promotions,
        "fills_issued": fills.get("issued", 0), "fills_consumed": fills.get("consumed", 0),
        "fills_discarded": fills.get("discarded", 0), "fills_covered": fills.get("covered", 0),
        "spec_engine_s": _f(sum(tally.spec_engine_s)),
        "unsafe_splices": tally.unsafe, "unverified_splices": tally.unverified,
        "wall_s": _f(run["wall_s"]),
    }
    extra = {k: v for k, v in run.items() if k not in out}
    send_lag = np.array([r.send_lag for r in requests]) if requests else np.zeros(1)
    extra.update({
        "simulated_s": _f(sim_s),
        "sim_s_per_wall_s": _f(sim_s / run["wall_s"]) if run["wall_s"] > 0 else None,
        "send_lag_p50_s": _f(np.percentile(send_lag, 50)),
        "send_lag_max_s": _f(np.max(send_lag)),
        "throughput_rps": _f(len(done) / sim_s) if sim_s > 0 else 0.0,
        "prompt_tokens": int(sum(r.prompt_tokens for r in requests)),
        "output_tokens": int(sum(r.output_tokens for r in requests)),
        "stages": tally.stages,
        **fate_counts(requests),
        "tenant_reuse": tally.tenant_reuse(requests),
        "errors": _error_counts(requests),
        **dict(mechanisms or {}),
    })
    return {**out, **extra}


class StageTally:
    """Every stage-derived summary field, kept as running aggregates while rows stream by.

    A replay streams its stage rows to disk and forgets them (:mod:`dynbranch.resultlog`);
    what the summary needs of them is added up here, one row at a time in log order, so the
    summary is the same as one computed over the whole log and memory does not hold the rows.
    """

    def __init__(self) -> None:
        self.stages = self.reuse_hits = self.promotions = self.unsafe = self.unverified = 0
        # NOTE: the engine seconds themselves (8 bytes a speculative stage), not a running
        # float sum: ``sum`` over them is the summation the whole-log summary does.
        self.spec_engine_s = array("d")
        self._first_exec: dict[str, tuple[float, float, int, str]] = {}
        self._served: list[tuple[str, float, float, int, str]] = []

    @classmethod
    def of(cls, stages: Iterable[StageRecord]) -> StageTally:
        """The tally of a whole stage log."""
        tally = cls()
        for s in stages:
            tally.add(s)
        return tally

    def add(self, s: StageRecord) -> None:
        """Count the next stage row of the log."""
        at = self.stages
        self.stages += 1
        self.reuse_hits += s.served_from == "cache"
        self.promotions += s.served_from in ("shadow", "join")
        if s.speculative:
            self.spec_engine_s.append(s.engine_s)
        self.unsafe += bool(unsafe_splices((s,)))
        self.unverified += bool(unverified_splices((s,)))
        if s.served_from != "exec":
            self._served.append((s.reuse_name, s.end, s.start, at, s.request_id))
        elif s.reuse_name and not s.error:
            first = self._first_exec.get(s.reuse_name)
            if first is None or (s.end, s.start, at) < first[:3]:
                self._first_exec[s.reuse_name] = (s.end, s.start, at, s.request_id)

    def tenant_reuse(self, requests: Sequence[RequestRecord]) -> dict[str, int]:
        """Served stages (cache, shadow, join) by whether the request that executed what
        they were served ran for the same tenant: the stage log's own check that reuse never
        crosses tenants (``cross_tenant`` must be 0), independent of how names are built.

        A served stage's producer is the first execution of its name in (end, start, log)
        order, if that execution comes before it in the same order.
        """
        tenant = {r.request_id: r.tenant for r in requests}
        counts = {"same_tenant": 0, "cross_tenant": 0, "unattributed": 0}
        for name, end, start, at, request_id in self._served:
            first = self._first_exec.get(name)
            source = first[3] if first is not None and first[:3] < (end, start, at) else None
            if source is None or source not in tenant or request_id not in tenant:
                counts["unattributed"] += 1
            else:
                same = tenant[source] == tenant[request_id]
                counts["same_tenant" if same else "cross_tenant"] += 1
        return counts


def _f(x: Any) -> float | None:
    x = float(x)
    return None if np.isnan(x) else round(x, 6)


FATES = ("completed", "failed", "rejected", "deadline", "interrupted")
"""Every status a request record can have: it ran to its end, it failed with a typed error,
admission refused it at arrival (``--max-inflight``), it was cancelled at its deadline
(``--deadline-s``), or it was in flight when the run was interrupted."""


def fate_counts(requests: Sequence[RequestRecord]) -> dict[str, int]:
    """How many requests were rejected, hit their deadline or were interrupted (completed and
    failed are summary fields of their own)."""
    return {"rejected": sum(r.status == "rejected" for r in requests),
            "deadline": sum(r.status == "deadline" for r in requests),
            "interrupted_requests": sum(r.status == "interrupted" for r in requests)}


def tenant_reuse(requests: Sequence[RequestRecord],
                 stages: Sequence[StageRecord]) -> dict[str, int]:
    """:meth:`StageTally.tenant_reuse` of a whole stage log."""
    return StageTally.of(stages).tenant_reuse(requests)


def _error_counts(requests: Sequence[RequestRecord]) -> dict[str, int]:
    """Requests that did not complete, by error type (typed rejections and deadlines too)."""
    counts: dict[str, int] = {}
    for r in requests:
        if r.status != "completed":
            counts[r.error_type] = counts.get(r.error_type, 0) + 1
    return counts


def write_results(out: OutDir | Path | str, summary: Mapping[str, Any],
                  requests: Sequence[RequestRecord],
                  stages: Iterable[StageRecord | Mapping[str, Any]],
                  branches: Iterable[BranchRecord | Mapping[str, Any]]) -> None:
    """Write every result file of a replay into ``out`` (a path or a filesystem URI).

    ``stages`` and ``branches`` are records or their rows (:meth:`StageRecord.row`), in log
    order; both are consumed chunk by chunk and written as they come (one Parquet row group
    per chunk, straight to the file), so an iterator over streamed shards never has to be
    held whole. Each file is written atomically; ``summary.json`` goes last, so a
    directory holding it holds every other file of the same run.
    """
    out = OutDir.parse(out)
    out.make()
    out.write_bytes("requests.parquet", _parquet(requests_frame(requests)))
    with out.open_atomic("stages.parquet") as sink:
        _write_chunked(sink, stage_schema(), map(_stage_row, stages))
    with out.open_atomic("branches.parquet") as sink:
        _write_chunked(sink, BRANCH_SCHEMA, map(_row, branches))
    png = io.BytesIO()
    plot_latency_cdf({summary["arm"]: [r.latency for r in requests
                                        if r.status == "completed"]},
                     png, title=f"{summary['workload']} · {summary['engine']} · "
                                f"{summary['backend']} · λ={summary['rate']}/s")
    out.write_bytes("latency_cdf.png", png.getvalue())
    out.write_text("summary.json", json.dumps(summary, indent=2, default=_plain) + "\n")


BRANCH_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("coordinate", pa.string()),
    ("candidates", pa.list_(pa.string())), ("chosen", pa.list_(pa.string())),
    ("opened_at", pa.float64()), ("resolved_at", pa.float64()),
])
"""The Arrow schema of ``branches.parquet``: one column per :class:`BranchRecord` field."""
BRANCH_COLUMNS = tuple(BRANCH_SCHEMA.names)

CHUNK_ROWS = 4096
"""Stage or branch rows converted to Arrow at a time (one Parquet row group each).

NOTE: the chunk's rows and its Arrow table are the largest thing writing the results holds:
at 16,384 rows an 8,000-request Routing replay's RSS rose about 87 MB while writing them,
at 4,096 about 40 MB (files about 10 % larger, the same rows; ``scripts/BENCHMARKS.md``)."""

_ARROW_TYPES = {"str": pa.string(), "str | None": pa.string(), "int": pa.int64(),
                "float": pa.float64(), "bool": pa.bool_(), "dict[str, str]": pa.string()}


def stage_schema() -> pa.Schema:
    """The Arrow schema of ``stages.parquet``: one column per :class:`StageRecord` field
    (maps as JSON text), then ``duration``."""
    cols = [(f.name, _ARROW_TYPES[str(f.type)]) for f in dataclasses.fields(StageRecord)]
    return pa.schema([*cols, ("duration", pa.float64())])


def _row(record: Any) -> dict[str, Any]:
    return dict(record) if isinstance(record, Mapping) else record.row()


def _write_chunked(sink: Any, schema: pa.Schema, rows: Iterable[dict[str, Any]]) -> None:
    """Write ``rows`` to ``sink`` as Parquet under ``schema``, :data:`CHUNK_ROWS` at a time
    (an empty table when there are none, so the file always has the schema)."""
    import pyarrow.parquet as pq

    with pq.ParquetWriter(sink, schema) as writer:
        chunk: list[dict[str, Any]] = []
        written = 0
        for row in rows:
            chunk.append(row)
            if len(chunk) >= CHUNK_ROWS:
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                written += len(chunk)
                chunk.clear()
        if chunk or not written:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))


def _stage_row(record: StageRecord | Mapping[str, Any]) -> dict[str, Any]:
    r = _row(record)
    # NOTE: a map column with per-run keys is awkward in Parquet; JSON keeps it exact.
    r["read_set"] = json.dumps(r["read_set"], sort_keys=True)
    r["writes"] = json.dumps(r["writes"], sort_keys=True)
    return r


def _parquet(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and other values a mechanism may report."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def requests_frame(requests: Sequence[RequestRecord]) -> pd.DataFrame:
    """``requests.parquet`` as a frame: one row per request record."""
    return pd.DataFrame([r.row() for r in requests])


def stages_frame(stages: Iterable[StageRecord | Mapping[str, Any]]) -> pd.DataFrame:
    """``stages.parquet`` as a frame (maps as JSON text)."""
    return pd.DataFrame([_stage_row(s) for s in stages])


def plot_latency_cdf(series: Mapping[str, Sequence[float]], path: Path | io.BytesIO,
                     title: str) -> None:
    """Empirical latency CDFs, one line per named series, on one set of axes (into a PNG
    file or buffer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in series.items():
        v = np.sort(np.asarray(values, dtype=float))
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post",
                    label=f"{name} (n={v.size}, mean {v.mean():.2f}s)")
    ax.set_xlabel("latency from scheduled arrival (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    else:  # no request completed (an early interrupt): an empty plot that says so
        ax.text(0.5, 0.5, "no completed requests", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def report(summary: Mapping[str, Any]) -> str:
    """A text report in the layout of ``vllm bench serve``."""
    def line(name: str, value: Any, fmt: str = "") -> str:
        v = "n/a" if value is None else format(value, fmt)
        return f"{name:<44}{v:>12}"

    s = summary
    rows = [
        "{s:{c}^56}".format(s=" DynBranch Replay Result ", c="="),
        line("Workload:", s["workload"]), line("Arm:", s["arm"]),
        line("Engine / backend:", f"{s['engine']}/{s['backend']}"),
        line("Clock:", s.get("clock")),
        line("Successful requests:", s["completed"]), line("Failed requests:", s["failed"]),
        line("Rejected at admission / past deadline:",
             f"{s.get('rejected', 0)}/{s.get('deadline', 0)}"),
        line("Request rate (req/s):", s["rate"], ".2f"),
        line("Run duration on the clock (s):", s.get("simulated_s"), ".2f"),
        line("Wall time (s):", s["wall_s"], ".2f"),
        line("Request throughput (req/s):", s.get("throughput_rps"), ".3f"),
        line("Total prompt tokens:", s.get("prompt_tokens")),
        line("Total generated tokens:", s.get("output_tokens")),
        line("Accuracy:", s["accuracy"], ".3f"),
        "{s:{c}^56}".format(s="Request Latency (from scheduled arrival)", c="-"),
        line("Mean latency (s):", s["mean_latency_s"], ".3f"),
        line("Median latency (s):", s["p50_latency_s"], ".3f"),
        line("P99 latency (s):", s["p99_latency_s"], ".3f"),
        line("Median send lag (s):", s.get("send_lag_p50_s"), ".4f"),
        "{s:{c}^56}".format(s="Reuse and speculation", c="-"),
        line("Reuse hits:", s["reuse_hits"]), line("Promotions:", s["promotions"]),
        line("Fills issued / consumed / discarded:",
             f"{s['fills_issued']}/{s['fills_consumed']}/{s['fills_discarded']}"),
        line("Speculative engine time (s):", s["spec_engine_s"], ".2f"),
        line("Unsafe splices:", s["unsafe_splices"]),
        line("Splices the audit could not re-execute:", s.get("unverified_splices")),
        "=" * 56,
    ]
    if s.get("errors"):
        rows.insert(-1, line("Failures by error:", ", ".join(
            f"{k}={v}" for k, v in s["errors"].items())))
    if s.get("interrupted"):
        rows.insert(1, line("INTERRUPTED by:", s.get("interrupted_by", "signal")))
        rows.insert(2, line("In flight when interrupted / never started:",
                            f"{s.get('interrupted_requests', 0)}/{s.get('not_started', 0)}"))
    return "\n".join(rows)
