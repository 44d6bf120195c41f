"""Records: Arrow IPC round-trip (exact, nested JSON values), size, refusals."""

from dataclasses import replace

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.errors import CorruptRecordError, UnrecordableValueError
from dynbranch.reuse import (
    RECORD_SCHEMA,
    Provenance,
    Record,
    RecordState,
    ReuseKey,
    from_arrow,
    reuse_name,
    to_arrow,
)

NESTED = {
    "calls": [{"name": "ls", "arguments": {"a": True, "depth": 2, "path": None}},
              {"name": "cd", "arguments": {"folder": "döcs/✓", "ratio": 0.25}}],
    "empty": {}, "list": [], "bytes": b"\x00\xff", 7: "int key", "big": 2**63 - 1,
}


def _record(value=NESTED, **kw):
    key = ReuseKey("fp", {"call": "ls(a=True)", "ctx": {"b": [1, 2]}}, "m", "r", {}, "1", "t")
    args = dict(read_set={"routing-00042/GorillaFileSystem": "3", "corpus:musique": "v1"},
                provenance=Provenance("req-9", 12.5, "engine-2", "full", ("up-a", "up-b")),
                state=RecordState.SHADOW, cost_ms=41.5)
    args.update(kw)
    return Record.create(key, value, **args)


def test_round_trip_is_exact_for_nested_json_values():
    record = _record()
    data = to_arrow(record)
    back = from_arrow(data)
    assert back == record
    assert back.value == NESTED and back.value is not record.value
    assert back.fields == {"call": "ls(a=True)", "ctx": {"b": [1, 2]}}
    assert list(back.value) == list(NESTED)  # insertion order kept
    assert back.size == record.size == len(data)
    assert back.name == reuse_name(ReuseKey("fp", {"call": "ls(a=True)", "ctx": {"b": [1, 2]}},
                                            "m", "r", {}, "1", "t"))
    assert back.read_set == {"routing-00042/GorillaFileSystem": "3", "corpus:musique": "v1"}
    assert back.provenance == Provenance("req-9", 12.5, "engine-2", "full", ("up-a", "up-b"))
    assert back.state is RecordState.SHADOW and back.cost_ms == 41.5 and back.hits == 0


def test_bytes_are_one_row_of_the_fixed_schema():
    table = pa.ipc.open_stream(to_arrow(_record())).read_all()
    assert table.schema.equals(RECORD_SCHEMA, check_metadata=True)
    assert table.num_rows == 1
    assert table.column("committed").to_pylist() == [False]


def test_state_and_hits_do_not_change_the_size():
    record = _record()
    promoted = replace(record, state=RecordState.COMMITTED, hits=12345)
    assert len(to_arrow(promoted)) == record.size


def test_values_are_fresh_copies():
    record = _record(value={"xs": [1]})
    record.value["xs"].append(2)
    assert record.value == {"xs": [1]}


@pytest.mark.parametrize("value", [{1, 2}, object(), 2**70])
def test_non_json_values_are_refused(value):
    with pytest.raises(UnrecordableValueError, match="cannot record value"):
        _record(value=value)


def test_corrupt_bytes_raise_a_typed_error():
    with pytest.raises(CorruptRecordError, match="not an Arrow IPC stream"):
        from_arrow(b"not arrow")
    other = pa.schema([("name", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other) as w:
        w.write_batch(pa.RecordBatch.from_pydict({"name": ["x"]}, schema=other))
    with pytest.raises(CorruptRecordError, match="is not record schema"):
        from_arrow(sink.getvalue().to_pybytes())


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                      st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=4))
json_tree = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3)
                         | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=15)


@settings(max_examples=100, deadline=None)
@given(value=json_tree,
       reads=st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=4), max_size=3),
       upstream=st.lists(st.text(max_size=6), max_size=3))
def test_property_round_trip(value, reads, upstream):
    record = _record(value=value, read_set=reads,
                     provenance=Provenance("r", 1.0, "e", "c1", tuple(upstream)))
    back = from_arrow(to_arrow(record))
    assert back == record and back.value == value and back.size == record.size
    assert record.size == len(to_arrow(record))


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=80), key=st.binary(max_size=300), fields=st.binary(max_size=2000),
       value=st.binary(max_size=300),
       reads=st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=5),
       who=st.tuples(st.text(max_size=9), st.text(max_size=9), st.text(max_size=9)),
       upstream=st.lists(st.text(max_size=70), max_size=4),
       committed=st.booleans(), cost=st.floats(0, 1e6), hits=st.integers(0, 2**40))
def test_the_size_is_the_length_of_the_arrow_stream_without_encoding_it(
        name, key, fields, value, reads, who, upstream, committed, cost, hits):
    from types import MappingProxyType

    from dynbranch.reuse.record import Record, RecordState, arrow_size

    record = Record(name=name, key_bytes=key, fields_bytes=fields, value_bytes=value,
                    read_set=MappingProxyType(reads),
                    provenance=Provenance(who[0], 1.5, who[1], who[2], tuple(upstream)),
                    state=RecordState.COMMITTED if committed else RecordState.SHADOW,
                    cost_ms=cost, hits=hits)
    assert arrow_size(record) == len(to_arrow(record))
