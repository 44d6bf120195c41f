"""A run's results on disk while it runs: JSON Lines shards, then the final files.

:class:`ResultStream` writes each finished request's row, and every stage row logged since
the last shard, to ``OUT/parts/`` as numbered JSON Lines shards (each written atomically,
so a shard is whole or absent). It writes a shard once ``flush_every`` requests have
finished since the last one, or ``flush_s`` seconds on the run clock have passed at a
request's end, and whenever it is told to (an interrupt). :meth:`ResultStream.close` writes
the final ``requests.parquet``/``stages.parquet``/… and ``summary.json``
(:func:`~dynbranch.results.write_results`) and only then removes the shards. A run killed
outright (SIGKILL, a lost node) therefore leaves its finished requests in ``parts/``;
:func:`read_partial` reads them back. A later run into the same directory first moves such
shards aside (:func:`set_aside_stopped_run`), so they are neither lost nor mixed into its own.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dynbranch.errors import OutputError
from dynbranch.outdir import OutDir
from dynbranch.results import StageTally
from dynbranch.runtime.runlog import BranchRecord, RequestRecord, StageRecord

PARTS = "parts"
"""The subdirectory of a result directory that holds a running replay's shards."""
DEFAULT_FLUSH_EVERY = 16
"""Finished requests per shard (a shard is a few kilobytes per request)."""
DEFAULT_FLUSH_S = 2.0
"""Most run-clock seconds a finished request waits before its shard is written."""


class ResultStream:
    """Streams a replay's rows to ``out`` as requests finish (see the module doc).

    ``stages`` and ``branches`` are the run log's lists: the stream keeps its own cursors into
    them, so each row goes into exactly one shard, stages in log order and a request's branch
    rows with its request row. ``now`` is the run clock. Unless ``keep``, rows written to a
    shard are removed from the lists, so a long run's memory does not grow with its length;
    :attr:`tally` keeps what the summary needs of the stage rows either way.
    """

    def __init__(
        self,
        out: OutDir | Path | str,
        stages: list[StageRecord],
        now: Callable[[], float],
        *,
        branches: list[BranchRecord] | None = None,
        keep: bool = True,
        flush_every: int = DEFAULT_FLUSH_EVERY,
        flush_s: float = DEFAULT_FLUSH_S,
    ) -> None:
        if flush_every < 1 or not flush_s > 0:
            raise ValueError(f"need flush_every >= 1 and flush_s > 0, got {flush_every}, {flush_s}")
        self.out = OutDir.parse(out)
        self._stages, self._now, self.keep = stages, now, keep
        self._branches = branches if branches is not None else []
        self.flush_every, self.flush_s = flush_every, flush_s
        # NOTE: rows are encoded as each request finishes, not when a shard is written: a
        # shard's rows encoded at once held the serving loop for 4-11 ms every 16 requests,
        # and every stage whose reply came in meanwhile waited (the Ray backend's tail per
        # stage). A row is final once logged (a served stage's audit fields are set in the
        # step that logs it; a branch resolves before its request ends).
        self._lines: dict[str, list[str]] = {"stages": [], "branches": [], "requests": []}
        self._pending = 0  # finished requests whose rows wait for the next shard
        self._stage_cursor = self._branch_cursor = 0
        # NOTE: branch rows wait here by request, numbered in the order they opened, until
        # their request finishes: a branch record is completed when it resolves.
        self._open: dict[str, list[tuple[int, BranchRecord]]] = {}
        self._branch_seq = 0
        self._shards = 0
        self._last_flush: float | None = None
        self.rows_written = {"requests": 0, "stages": 0, "branches": 0}
        self.tally = StageTally()

    def finished(self, record: RequestRecord) -> None:
        """A request finished (whatever its fate): its row goes into the next shard."""
        self._encode_stages()
        self._lines["branches"].extend(self._branch_lines(record.request_id))
        self._lines["requests"].append(_line(record.row()))
        self._pending += 1
        now = self._now()
        if self._last_flush is None:
            self._last_flush = now
        if self._pending >= self.flush_every or now - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self, *, every_branch: bool = False) -> None:
        """Write what is pending as one shard set (nothing when nothing is pending);
        ``every_branch`` writes the branch rows of unfinished requests too (the run's end)."""
        self._encode_stages()
        if every_branch:
            self._lines["branches"].extend(self._branch_lines(None))
        lines = self._lines
        if not any(lines.values()):
            return
        self._shards += 1
        n = self._shards
        # NOTE: stages and branches first: a requests shard on disk implies its other rows.
        for kind in ("stages", "branches", "requests"):
            self.out.write_bytes(f"{PARTS}/{kind}-{n:05d}.jsonl", _joined(lines[kind]))
            self.rows_written[kind] += len(lines[kind])
            lines[kind] = []
        if not self.keep:
            del self._stages[: self._stage_cursor]
            self._stage_cursor = 0
        self._pending = 0
        self._last_flush = self._now()

    def _encode_stages(self) -> None:
        """Encode the stage rows logged since the last call (and count them in the tally)."""
        stages = self._stages[self._stage_cursor :]
        if not stages:
            return
        self._lines["stages"].extend(_line(s.row()) for s in stages)
        for s in stages:
            self.tally.add(s)
        self._stage_cursor += len(stages)

    def _branch_lines(self, request_id: str | None) -> list[str]:
        """The encoded rows of ``request_id``'s branches (of every open one when ``None``)."""
        for b in self._branches[self._branch_cursor :]:
            self._open.setdefault(b.request_id, []).append((self._branch_seq, b))
            self._branch_seq += 1
        if self.keep:
            self._branch_cursor = len(self._branches)
        else:
            self._branches.clear()
        if request_id is not None:
            taken = self._open.pop(request_id, [])
        else:
            taken = sorted(t for rows in self._open.values() for t in rows)
            self._open.clear()
        return [_line({**b.row(), SEQ: seq}) for seq, b in taken]

    def close(self, summary: Mapping[str, Any], requests: Sequence[RequestRecord]) -> None:
        """Write the final result files from the shards, then remove the shards.

        ``requests`` are the run's request records in launch order; stage and branch rows
        come back from the shards and are written as they come back
        (:func:`~dynbranch.results.write_results`), so closing holds no run's worth of rows.
        """
        from dynbranch.results import write_results

        self.flush(every_branch=True)
        names = self.out.listdir(PARTS)
        write_results(
            self.out,
            summary,
            requests,
            _shard_rows(self.out, names, "stages"),
            _branch_rows(self.out, names),
        )
        self.out.remove_tree(PARTS)


SEQ = "_seq"
"""The column of a branch shard row that numbers branches in the order they opened."""


def _shard_rows(out: OutDir, names: Sequence[str], kind: str) -> Iterator[dict[str, Any]]:
    """The rows of every ``kind`` shard, shard by shard, in the order they were written."""
    for name in names:
        if name.startswith(f"{kind}-") and name.endswith(".jsonl"):
            data = out.read_bytes(f"{PARTS}/{name}").decode("utf-8")
            yield from (json.loads(line) for line in data.splitlines() if line)


def _branch_rows(out: OutDir, names: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Every branch row, in the order the branches opened (as the run log holds them).

    NOTE: a shard holds the branch rows of the requests it finished, so rows arrive out of
    opening order only by the requests in flight at once; they wait in a heap until every
    branch opened before them has arrived. Memory follows that window, not the run's length
    (every branch has a number, 0, 1, …: each is written exactly once).
    """
    waiting: list[tuple[int, dict[str, Any]]] = []
    numbers: set[int] = set()  # of the rows waiting
    following = 0
    for row in _shard_rows(out, names, "branches"):
        seq = row.pop(SEQ)
        if seq < following or seq in numbers:  # NOTE: else the heap would compare two rows
            raise OutputError(out.shown, f"two branch rows numbered {seq} in {PARTS}/: shards "
                              "of more than one run")
        heapq.heappush(waiting, (seq, row))
        numbers.add(seq)
        while waiting and waiting[0][0] == following:
            numbers.discard(following)
            yield heapq.heappop(waiting)[1]
            following += 1
    while waiting:  # only if a shard went missing: the rest, still in order
        yield heapq.heappop(waiting)[1]


def _line(row: Mapping[str, Any]) -> str:
    """One JSON Lines row (keys sorted, so a row's text does not depend on field order)."""
    return json.dumps(row, sort_keys=True, default=str) + "\n"


def _joined(lines: Sequence[str]) -> bytes:
    return "".join(lines).encode("utf-8")


STOPPED = "stopped-"
"""The prefix of the subdirectories that keep the shards of runs that stopped unfinished."""


def set_aside_stopped_run(out: OutDir | Path | str) -> str | None:
    """Move the shards a stopped run left in ``out/parts`` to ``out/stopped-K/parts`` (the
    first free K) and return ``stopped-K``; ``None`` when there are none.

    NOTE: a run starts here, holding the destination (:meth:`OutDir.claimed`), so shards
    already there belong to a run that ended without writing its final files (SIGKILL, a lost
    node). Left in place they would be read back with this run's as if its own; deleted, the
    only record of those requests would be gone. ``read_partial(out / "stopped-K")`` reads them.
    """
    out = OutDir.parse(out)
    names = out.listdir(PARTS)
    if not names:
        return None
    taken = set(out.listdir_dirs())
    k = 1
    while f"{STOPPED}{k}" in taken:
        k += 1
    aside = f"{STOPPED}{k}"
    out.fs.create_dir(out.file(f"{aside}/{PARTS}"), recursive=True)
    for name in names:  # NOTE: file by file: an object store cannot move a directory
        out.fs.move(out.file(f"{PARTS}/{name}"), out.file(f"{aside}/{PARTS}/{name}"))
    out.remove_tree(PARTS)
    return aside


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
