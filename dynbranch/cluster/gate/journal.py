"""The gate actor's checkpoint: a snapshot and the journal of calls since it.

A :class:`GateCheckpoint` is a directory holding

* ``snapshot.msgpack`` — :meth:`Gate.state` (plus the actor's recent call replies) and the
  journal position it covers, replaced atomically (:meth:`GateCheckpoint.save`);
* ``journal.jsonl`` — every mutating call since that snapshot, one compact JSON row each
  (:mod:`~dynbranch.cluster.gate.codec`), appended by :meth:`GateCheckpoint.append`;
* ``journal.<seq>.jsonl`` — the journal as it stood when a snapshot covering entry
  ``<seq>`` was taken, set aside until that snapshot is in place, then deleted.

A snapshot is taken in two steps: :meth:`GateCheckpoint.save` packs it and sets the journal
aside at once (a rename), and the snapshot is written and put in place either there or, for
a checkpoint made with ``background=True``, on a writer thread of its own while the actor
answers calls. Its largest parts, the remembered replies and released receipts, come
already packed (:class:`Packed`): each was packed once, when it was made. At every moment
the directory holds a snapshot and, after it, every entry since: the set-aside journals
until the newer snapshot is in place, and the live journal.

The actor decides *when* to append and snapshot (:mod:`~dynbranch.cluster.gate.actor`);
the deployment decides *where* the directory is (:mod:`~dynbranch.cluster.gate.deployment`).
NOTE: writes are not fsync'ed: the directory is on the actor's own node, and what must
survive is a crash of the actor's process, whose writes are already in the page cache.

NOTE: the snapshot is msgpack, not JSON: the actor answers no call while it packs one, and
for a gate with a full call log and ledger (512 replies, 2,000 released receipts, 230 kB)
msgpack packed it in 1.4 ms where JSON took 10.5 ms, with the same values read back. A
``snapshot.json`` an earlier version wrote is still read when there is no msgpack one.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack

from dynbranch.cluster.gate.codec import dumps, plain

FORMAT = 1
"""The snapshot format this code writes and the only one it reads."""


def pack(value: Any) -> bytes:
    """``value`` as msgpack, as the snapshot packs its parts (:func:`pack_snapshot`)."""
    return msgpack.packb(value, default=plain, use_bin_type=True)


class Packed:
    """An array in a snapshot whose items are already packed (:func:`pack`): written as the
    array's header and their bytes, the same bytes as packing the items there."""

    __slots__ = ("items",)

    def __init__(self, items: list[bytes]) -> None:
        self.items = items


def pack_snapshot(snapshot: Any) -> bytes:
    """``snapshot`` as msgpack, with each :class:`Packed` array joined rather than packed.

    NOTE: dictionaries are walked (their keys packed one by one, in order), anything else is
    packed whole, so the bytes are those of ``pack`` on the snapshot with every
    :class:`Packed` replaced by its items unpacked.
    """
    parts: list[bytes] = []
    _assemble(snapshot, parts, msgpack.Packer())
    return b"".join(parts)


def _assemble(value: Any, parts: list[bytes], headers: msgpack.Packer) -> None:
    if isinstance(value, Packed):
        parts.append(headers.pack_array_header(len(value.items)))
        parts += value.items
    elif isinstance(value, dict):
        parts.append(headers.pack_map_header(len(value)))
        for key, item in value.items():
            parts.append(pack(key))
            _assemble(item, parts, headers)
    else:
        parts.append(pack(value))


class GateCheckpoint:
    """A gate's snapshot and the journal of calls since it, in one directory.

    ``background``: write snapshots on a writer thread (one at a time, in the order they
    were taken) instead of in :meth:`save`. NOTE: the gate actor's deployment asks for
    it: in ``bench_gate_ray.py`` a snapshot taken in place stopped the actor for 6.8-8.0 ms
    on average. A plain ``GateCheckpoint`` (a test's) writes in place, so once ``save``
    returns the snapshot is on disk.
    """

    SNAPSHOT = "snapshot.msgpack"
    LEGACY_SNAPSHOT = "snapshot.json"
    JOURNAL = "journal.jsonl"

    def __init__(self, directory: str | Path, *, background: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._snapshot = self.directory / self.SNAPSHOT
        self._legacy = self.directory / self.LEGACY_SNAPSHOT
        self._journal = self.directory / self.JOURNAL
        self._fd: int | None = None
        self._writer = (ThreadPoolExecutor(1, thread_name_prefix="gate-snapshot")
                        if background else None)
        self.written = {"snapshots": 0, "failed": 0, "write_ms_last": 0.0,
                        "write_ms_max": 0.0, "write_ms_total": 0.0, "error": ""}
        """What the writer did: snapshots in place, writes that failed (their journals stay
        set aside, so nothing is lost) and the last error, and how long writing one took."""

    def load(self) -> tuple[dict[str, Any] | None, list[list]]:
        """The snapshot (None if there is none) and the journal entries written after it.

        NOTE: the journals are read before the snapshot: a writer still running (a test's
        earlier actor on this directory) puts a snapshot in place before it deletes the
        journals that snapshot covers, so what is read here is never missing an entry.
        Only the live journal's last line can be torn (the process died inside its write);
        it is cut off, so the next incarnation appends after the last whole entry. That
        entry's call was never answered, so dropping it loses nothing a caller was told.
        """
        entries = []
        for _, path in self._set_aside():
            with _missing_ok():
                entries += [json.loads(line) for line in path.read_bytes().splitlines()]
        data = self._journal.read_bytes() if self._journal.exists() else b""
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) < len(data):
            os.truncate(self._journal, len(whole))
        entries += [json.loads(line) for line in whole.splitlines()]
        snapshot = self._read_snapshot()
        covered = snapshot["seq"] if snapshot is not None else 0
        return snapshot, [e for e in entries if e[0] > covered]

    def _read_snapshot(self) -> dict[str, Any] | None:
        if self._snapshot.exists():
            return msgpack.unpackb(self._snapshot.read_bytes(), raw=False, strict_map_key=False)
        if self._legacy.exists():
            return json.loads(self._legacy.read_bytes())
        return None

    def _set_aside(self) -> list[tuple[int, Path]]:
        """The set-aside journals, oldest first, with the entry each ends at."""
        found = []
        for path in self.directory.glob("journal.*.jsonl"):
            seq = path.name.split(".")[1]
            if seq.isdigit():
                found.append((int(seq), path))
        return sorted(found)

    def append(self, entry: list) -> None:
        """Add one entry to the journal (one ``write``: a dying process leaves it whole or torn)."""
        if self._fd is None:
            self._fd = os.open(self._journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, dumps(entry) + b"\n")

    def save(self, snapshot: dict[str, Any]) -> Future[int]:
        """Take ``snapshot`` (it covers every entry appended so far): pack it
        (:func:`pack_snapshot`), set the journal aside, and write it, here or on the writer
        thread. The future's result is its size in bytes, or the error that stopped the
        write.

        NOTE: the writer puts the snapshot in place atomically, then deletes the journals it
        covers; a crash between the two leaves entries the snapshot already covers, which
        ``load`` skips by sequence number, so none is applied twice. Packing stays here:
        it holds the interpreter, so on the writer thread it stopped calls all the same, and
        the writer, waiting out the interpreter's 5 ms switch interval for its turns, took
        7.0 ms per snapshot on average (30.5 at most) in ``bench_gate_ray.py``.
        """
        data, seq = pack_snapshot(snapshot), snapshot["seq"]
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._journal.exists():
            os.replace(self._journal, self.directory / f"journal.{seq:012d}.jsonl")
        if self._writer is not None:
            return self._writer.submit(self._write, data, seq)
        done: Future[int] = Future()
        done.set_result(self._write(data, seq))
        return done

    def flush(self) -> None:
        """Wait until every snapshot taken so far is written (or has failed)."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()

    def _write(self, data: bytes, seq: int) -> int:
        t0 = time.perf_counter()
        try:
            tmp = self._snapshot.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self._snapshot)
            self._legacy.unlink(missing_ok=True)  # NOTE: superseded; load reads the msgpack one
            for covered, path in self._set_aside():
                if covered <= seq:
                    path.unlink(missing_ok=True)
        except Exception as e:  # NOTE: the set-aside journals stay: the next snapshot retries
            self.written["failed"] += 1
            self.written["error"] = f"{type(e).__name__}: {e}"
            raise
        ms = (time.perf_counter() - t0) * 1e3
        self.written["snapshots"] += 1
        self.written["write_ms_last"] = ms
        self.written["write_ms_max"] = max(self.written["write_ms_max"], ms)
        self.written["write_ms_total"] += ms
        return len(data)

    def close(self) -> None:
        """Write what is pending and stop the writer thread."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)


def _missing_ok() -> contextlib.AbstractContextManager[None]:
    """A set-aside journal a running writer deleted between listing and reading (its
    snapshot is in place by then, and covers it)."""
    return contextlib.suppress(FileNotFoundError)
