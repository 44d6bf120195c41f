"""Records: one recorded execution of a subgraph, and its Arrow serialisation.

A :class:`Record` keeps what C1 needs to serve a later request and to invalidate safely:
the reuse name and full key bytes (compared on every hit), the rendered input fields, the
output value, the external read-set ``{resource: version}``, provenance (who produced it,
when, on which engine and arm, and the names of the records its input was rendered from),
its state (``shadow`` from a fill, or ``committed``), its size in bytes and the execution it
saves (``cost_ms``, for cost-aware eviction).

Serialisation (:func:`to_arrow` / :func:`from_arrow`) is an Arrow IPC stream holding one
one-row RecordBatch of the fixed :data:`RECORD_SCHEMA` — what the Ray store actors keep in
the object store. Input fields and the output value are JSON-like trees stored as *plain*
msgpack in binary columns (maps keep their insertion order, tuples read back as lists); the
read-set is an Arrow ``map<string, string>``; the state is a bool column ``committed``.
A record's ``size`` is the length of its serialised bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import msgpack
import pyarrow as pa

from dynbranch.errors import CorruptRecordError, UnrecordableValueError
from dynbranch.reuse.names import HashFn, ReuseKey, reuse_name, sha256hex

RECORD_SCHEMA_VERSION = "1"

RECORD_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("key", pa.binary()),
        ("fields", pa.binary()),
        ("value", pa.binary()),
        ("read_set", pa.map_(pa.string(), pa.string())),
        ("request_id", pa.string()),
        ("time", pa.float64()),
        ("engine", pa.string()),
        ("arm", pa.string()),
        ("upstream", pa.list_(pa.string())),
        ("committed", pa.bool_()),
        ("cost_ms", pa.float64()),
        ("hits", pa.int64()),
    ],
    metadata={"dynbranch.record": RECORD_SCHEMA_VERSION, "fields,value": "msgpack"},
)


class RecordState(enum.StrEnum):
    """A fill's result is a ``shadow`` until promoted; canonical results are ``committed``."""

    SHADOW = "shadow"
    COMMITTED = "committed"


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a record came from.

    ``upstream`` names the records (reuse names) whose outputs entered this record's rendered
    input; a write that invalidates one of them invalidates this record too (the cascade).
    """

    request_id: str
    time: float
    engine: str
    arm: str
    upstream: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Record:
    """One recorded execution. Build with :meth:`create`; treat as immutable.

    ``fields`` and ``value`` decode a fresh copy on every access, so a caller that mutates
    a served value cannot change what the store serves next.
    """

    name: str
    key_bytes: bytes = field(repr=False)
    fields_bytes: bytes = field(repr=False)
    value_bytes: bytes = field(repr=False)
    read_set: Mapping[str, str]
    provenance: Provenance
    state: RecordState
    cost_ms: float = 0.0
    hits: int = 0
    size: int = field(default=0, compare=False)

    @classmethod
    def create(cls, key: ReuseKey, value: Any, *, read_set: Mapping[str, str],
               provenance: Provenance, state: RecordState = RecordState.COMMITTED,
               cost_ms: float = 0.0, hash_fn: HashFn = sha256hex) -> Record:
        """A record of one execution of ``key`` that returned ``value``.

        Raises :class:`UnrecordableValueError` when the value or fields are not JSON-like.
        """
        record = cls(
            name=reuse_name(key, hash_fn), key_bytes=key.key_bytes(),
            fields_bytes=_pack(key.fields, "input fields"), value_bytes=_pack(value, "value"),
            read_set=MappingProxyType(dict(read_set)), provenance=provenance,
            state=RecordState(state), cost_ms=float(cost_ms))
        return replace(record, size=arrow_size(record))

    @property
    def value(self) -> Any:
        """The output value (a fresh copy)."""
        return _unpack(self.value_bytes)

    @property
    def fields(self) -> dict[str, Any]:
        """The rendered input fields (a fresh copy)."""
        return _unpack(self.fields_bytes)

    @property
    def committed(self) -> bool:
        return self.state is RecordState.COMMITTED


def _default(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-like")


def _pack(value: Any, what: str) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True, default=_default)
    except (TypeError, ValueError, OverflowError) as e:
        raise UnrecordableValueError(what, str(e)) from e


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def to_arrow(record: Record) -> bytes:
    """``record`` as an Arrow IPC stream of one one-row batch of :data:`RECORD_SCHEMA`."""
    p = record.provenance
    row = {
        "name": [record.name], "key": [record.key_bytes], "fields": [record.fields_bytes],
        "value": [record.value_bytes], "read_set": [list(record.read_set.items())],
        "request_id": [p.request_id], "time": [p.time], "engine": [p.engine],
        "arm": [p.arm], "upstream": [list(p.upstream)], "committed": [record.committed],
        "cost_ms": [record.cost_ms], "hits": [record.hits],
    }
    batch = pa.RecordBatch.from_pydict(row, schema=RECORD_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORD_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _pad(n: int) -> int:
    return (n + 7) // 8 * 8


def _body_bytes(record: Record) -> int:
    """The padded bytes of the variable-length buffers of ``record``'s one-row batch."""
    p = record.provenance
    utf8 = [len(s.encode("utf-8")) for s in (record.name, p.request_id, p.engine, p.arm)]
    keys = [len(k.encode("utf-8")) for k in record.read_set]
    values = [len(v.encode("utf-8")) for v in record.read_set.values()]
    upstream = [len(u.encode("utf-8")) for u in p.upstream]
    return (sum(map(_pad, utf8))
            + _pad(len(record.key_bytes)) + _pad(len(record.fields_bytes))
            + _pad(len(record.value_bytes))
            + 2 * _pad(4 * (len(keys) + 1)) + _pad(sum(keys)) + _pad(sum(values))
            + _pad(4 * (len(upstream) + 1)) + _pad(sum(upstream)))


def arrow_size(record: Record) -> int:
    """``len(to_arrow(record))``, without encoding it.

    NOTE: with one row, no nulls and a fixed schema, the stream's schema message, batch
    metadata and fixed-width buffers have one size; only the variable-length buffers vary,
    each padded to 8 bytes. Building the batch cost more than anything else of storing a
    record (a ninth of a replay), and the local store needs only the length;
    ``tests/test_reuse_record.py`` checks the two agree on random records.
    """
    return _FRAMING + _body_bytes(record)


def from_arrow(data: bytes) -> Record:
    """The record :func:`to_arrow` wrote; raises :class:`CorruptRecordError` otherwise."""
    try:
        reader = pa.ipc.open_stream(data)
        table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptRecordError(f"not an Arrow IPC stream: {e}") from e
    if not table.schema.equals(RECORD_SCHEMA, check_metadata=True):
        raise CorruptRecordError(f"schema {table.schema} is not record schema "
                                 f"v{RECORD_SCHEMA_VERSION}")
    if table.num_rows != 1:
        raise CorruptRecordError(f"{table.num_rows} rows, expected 1")
    r = table.to_pylist()[0]
    return Record(
        name=r["name"], key_bytes=r["key"], fields_bytes=r["fields"], value_bytes=r["value"],
        read_set=MappingProxyType(dict(r["read_set"])),
        provenance=Provenance(r["request_id"], r["time"], r["engine"], r["arm"],
                              tuple(r["upstream"])),
        state=RecordState.COMMITTED if r["committed"] else RecordState.SHADOW,
        cost_ms=r["cost_ms"], hits=r["hits"], size=len(data))


def _framing() -> int:
    empty = Record(name="", key_bytes=b"", fields_bytes=b"", value_bytes=b"",
                   read_set=MappingProxyType({}),
                   provenance=Provenance("", 0.0, "", "", ()), state=RecordState.COMMITTED)
    return len(to_arrow(empty)) - _body_bytes(empty)


_FRAMING = _framing()
"""The bytes of a record's stream that do not vary with its contents (measured once)."""
