"""A run's results on disk while it runs: JSON Lines shards, then the final files.

:class:`ResultStream` writes each finished request's row, and every stage row logged since
the last shard, to ``OUT/parts/`` as numbered JSON Lines shards (each written atomically,
so a shard is whole or absent). It writes a shard once ``flush_every`` requests have
finished since the last one, or ``flush_s`` seconds on the run clock have passed at a
request's end, and whenever it is told to (an interrupt). :meth:`ResultStream.close` writes
the final ``requests.parquet``/``stages.parquet``/… and ``summary.json``
(:func:`~dynbranch.results.write_results`) and only then removes the shards. A run killed
outright (SIGKILL, a lost node) therefore leaves its finished requests in ``parts/``;
:func:`read_partial` reads them back.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dynbranch.outdir import OutDir
from dynbranch.runtime.runlog import BranchRecord, RequestRecord, StageRecord

PARTS = "parts"
"""The subdirectory of a result directory that holds a running replay's shards."""
DEFAULT_FLUSH_EVERY = 16
"""Finished requests per shard (a shard is a few kilobytes per request)."""
DEFAULT_FLUSH_S = 2.0
"""Most run-clock seconds a finished request waits before its shard is written."""


class ResultStream:
    """Streams a replay's rows to ``out`` as requests finish (see the module doc).

    ``stages`` is the run log's stage list: the stream keeps its own cursor into it, so each
    stage row goes into exactly one shard, in log order. ``now`` is the run clock.
    """

    def __init__(
        self,
        out: OutDir | Path | str,
        stages: Sequence[StageRecord],
        now: Callable[[], float],
        *,
        flush_every: int = DEFAULT_FLUSH_EVERY,
        flush_s: float = DEFAULT_FLUSH_S,
    ) -> None:
        if flush_every < 1 or not flush_s > 0:
            raise ValueError(f"need flush_every >= 1 and flush_s > 0, got {flush_every}, {flush_s}")
        self.out = OutDir.parse(out)
        self._stages, self._now = stages, now
        self.flush_every, self.flush_s = flush_every, flush_s
        self._pending: list[RequestRecord] = []
        self._stage_cursor = 0
        self._shards = 0
        self._last_flush: float | None = None
        self.rows_written = {"requests": 0, "stages": 0}

    def finished(self, record: RequestRecord) -> None:
        """A request finished (whatever its fate): its row goes into the next shard."""
        self._pending.append(record)
        now = self._now()
        if self._last_flush is None:
            self._last_flush = now
        if len(self._pending) >= self.flush_every or now - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Write what is pending as one shard pair (nothing when nothing is pending)."""
        stages = self._stages[self._stage_cursor :]
        if not self._pending and not stages:
            return
        self._shards += 1
        n = self._shards
        # NOTE: stages first: a requests shard on disk implies its stage rows are there too.
        self.out.write_bytes(f"{PARTS}/stages-{n:05d}.jsonl", _jsonl(_stage_rows(stages)))
        self.out.write_bytes(
            f"{PARTS}/requests-{n:05d}.jsonl", _jsonl([r.row() for r in self._pending])
        )
        self.rows_written["requests"] += len(self._pending)
        self.rows_written["stages"] += len(stages)
        self._stage_cursor += len(stages)
        self._pending.clear()
        self._last_flush = self._now()

    def close(
        self,
        summary: Mapping[str, Any],
        requests: Sequence[RequestRecord],
        stages: Sequence[StageRecord],
        branches: Sequence[BranchRecord],
    ) -> None:
        """Write the final result files, then remove the shards they supersede."""
        from dynbranch.results import write_results

        write_results(self.out, summary, requests, stages, branches)
        self.out.remove_tree(PARTS)


def _stage_rows(stages: Sequence[StageRecord]) -> list[dict[str, Any]]:
    return [s.row() for s in stages]


def _jsonl(rows: Sequence[Mapping[str, Any]]) -> bytes:
    buf = io.StringIO()
    for row in rows:
        buf.write(json.dumps(row, sort_keys=True, default=str))
        buf.write("\n")
    return buf.getvalue().encode("utf-8")


def read_partial(out: OutDir | Path | str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The request and stage rows a run streamed into ``out/parts`` before it stopped.

    Reads only whole shards (each was written atomically); empty frames if there are none.
    """
    out = OutDir.parse(out)
    names = out.listdir(PARTS)
    frames = {}
    for kind in ("requests", "stages"):
        rows = [
            json.loads(line)
            for name in names
            if name.startswith(f"{kind}-") and name.endswith(".jsonl")
            for line in out.read_bytes(f"{PARTS}/{name}").decode("utf-8").splitlines()
            if line
        ]
        frames[kind] = pd.DataFrame(rows)
    return frames["requests"], frames["stages"]
