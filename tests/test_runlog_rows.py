"""Run-log rows are what ``dataclasses.asdict`` gives, as independent copies."""

from dataclasses import asdict, fields

from dynbranch.runtime.runlog import BranchRecord, RequestRecord, StageRecord


def _filled(cls):
    values = {}
    for i, f in enumerate(fields(cls)):
        kind = str(f.type)
        if "dict" in kind:
            values[f.name] = {f"r{i}": f"v{i}"}
        elif "list" in kind:
            values[f.name] = [f"x{i}", f"y{i}"]
        elif "float" in kind:
            values[f.name] = float(i) + 0.5
        elif "int" in kind:
            values[f.name] = i
        elif "bool" in kind:
            values[f.name] = True
        else:
            values[f.name] = f"s{i}"
    return cls(**values)


def test_each_record_kind_rows_as_asdict_with_its_derived_columns():
    for cls, derived in ((StageRecord, {"duration"}), (BranchRecord, set()),
                         (RequestRecord, {"latency", "send_lag"})):
        record = _filled(cls)
        row = record.row()
        assert set(row) - set(asdict(record)) == derived
        assert {k: v for k, v in row.items() if k not in derived} == asdict(record)
        for k, v in row.items():  # containers are copies: changing a row leaves the record
            if isinstance(v, (dict, list)):
                assert v is not getattr(record, k)


def test_the_records_hold_only_flat_values():
    # the one-level copy is a deep copy only while no field nests a container
    for cls in (StageRecord, BranchRecord, RequestRecord):
        for f in fields(cls):
            kind = str(f.type)
            assert kind.count("[") <= 1, f"{cls.__name__}.{f.name}: {kind} nests"
