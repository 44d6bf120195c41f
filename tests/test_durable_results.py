"""Results that survive the run's end however it comes: rows stream to disk while it runs,
SIGINT and SIGTERM write a readable partial result marked ``interrupted``, SIGKILL leaves the
streamed shards, every file is written atomically, and ``--out`` takes a filesystem URI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.cli import main
from dynbranch.errors import OutputError
from dynbranch.outdir import OutDir
from dynbranch.resultlog import PARTS, ResultStream, read_partial
from dynbranch.runtime.runlog import RequestRecord, StageRecord

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"


def _start(out: Path, requests: int = 80) -> subprocess.Popen:
    """A real-clock replay on the local backend, in its own process."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynbranch",
            "replay",
            "--backend",
            "local",
            "--clock",
            "real",
            "--requests",
            str(requests),
            "--rate",
            "4",
            "--workers",
            "2",
            "--quiet",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_shard(out: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if any(p.name.startswith("requests-") for p in (out / PARTS).glob("*.jsonl")):
            return
        time.sleep(0.2)
    proc.kill()
    pytest.fail("no result shard was streamed in time")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_writes_a_readable_partial_result(tmp_path, sig):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for_shard(out, proc)
    proc.send_signal(sig)
    _stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"interrupted by {sig.name}" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["interrupted_by"] == sig.name
    frame = pd.read_parquet(out / "requests.parquet")
    assert len(frame) == summary["requests"] and summary["completed"] > 0
    assert set(frame.status) <= {"completed", "interrupted"}
    assert summary["requests"] + summary["not_started"] == 80
    assert (frame.status == "interrupted").sum() == summary["interrupted_requests"]
    assert not (out / PARTS).exists()  # the final files superseded the shards
    stages = pd.read_parquet(out / "stages.parquet")
    assert set(stages.request_id) <= set(frame.request_id)
    assert not list(out.glob(".*tmp*"))


def test_sigkill_leaves_the_streamed_rows_readable(tmp_path):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for_shard(out, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    requests, stages = read_partial(out)
    assert not (out / "summary.json").exists()
    assert len(requests) >= 1 and set(requests.status) <= {"completed", "failed"}
    assert requests.request_id.is_unique and set(stages.request_id) >= set(requests.request_id)


class _BrokenMove:
    """A filesystem whose rename fails (a disk lost between the write and the rename)."""

    def __init__(self, fs) -> None:
        self._fs = fs

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def move(self, src, dst):
        raise OSError("disk gone mid-rename")


def test_every_file_is_written_atomically(tmp_path):
    out = OutDir.parse(tmp_path / "d")
    out.make()
    out.write_text("summary.json", "old")
    broken = OutDir(_BrokenMove(out.fs), out.path, out.shown)
    with pytest.raises(OSError, match="disk gone"):
        broken.write_text("summary.json", "new")
    assert (tmp_path / "d" / "summary.json").read_text() == "old"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["summary.json"]


def test_the_stream_flushes_by_count_and_by_clock(tmp_path):
    stages: list[StageRecord] = []
    now = [0.0]
    stream = ResultStream(tmp_path, stages, lambda: now[0], flush_every=3, flush_s=10.0)

    def done(i: int) -> None:
        stages.append(StageRecord(f"r{i}", "s", "llm", 0, None, now[0], now[0] + 1))
        stream.finished(RequestRecord(f"r{i}", 0.0, 0.0, now[0], "completed"))

    for i in range(3):
        done(i)
    assert stream.rows_written == {"requests": 3, "stages": 3, "branches": 0}
    done(3)
    now[0] = 10.0
    done(4)  # 10 s on the clock since the last shard: written without waiting for a third
    requests, shard_stages = read_partial(tmp_path)
    assert list(requests.request_id) == [f"r{i}" for i in range(5)]
    assert len(shard_stages) == 5 and len(list((tmp_path / PARTS).iterdir())) == 6


def test_out_takes_a_filesystem_uri(tmp_path, capsys):
    target = tmp_path / "remote" / "run"
    rc = main(
        [
            "replay",
            "--backend",
            "local",
            "--clock",
            "virtual",
            "--requests",
            "6",
            "--quiet",
            "--out",
            f"file://{target}",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((target / "summary.json").read_text())
    assert summary["completed"] == 6 and summary["out"] == f"file://{target}"
    assert len(pd.read_parquet(target / "requests.parquet")) == 6
    assert {p.name for p in target.iterdir()} == {
        "summary.json",
        "requests.parquet",
        "stages.parquet",
        "branches.parquet",
        "latency_cdf.png",
    }


def test_branch_rows_come_back_in_opening_order_holding_only_the_disordered_ones(
    tmp_path, monkeypatch
):
    """Shards hold branch rows by the request that finished; closing puts them back in the
    order the branches opened, and holds back only rows whose predecessors are still to come
    (a long run's close does not hold all its branch rows at once)."""
    from dynbranch.resultlog import SEQ, _branch_rows

    out = OutDir.parse(tmp_path)
    shards = [[3, 0, 1], [2, 4], [6, 5, 7]]  # each shard: the rows of the requests it finished
    for n, seqs in enumerate(shards, start=1):
        rows = [json.dumps({"request_id": f"r{q}", SEQ: q}) for q in seqs]
        out.write_text(f"{PARTS}/branches-{n:05d}.jsonl", "\n".join(rows) + "\n")
    read = []
    original = OutDir.read_bytes

    def counting(self, name):
        read.append(name)
        return original(self, name)

    monkeypatch.setattr(OutDir, "read_bytes", counting)
    rows = _branch_rows(out, out.listdir(PARTS))
    first = [next(rows) for _ in range(2)]
    assert len(read) == 1  # rows 0 and 1 were out before the second shard was read
    rest = list(rows)
    assert [r["request_id"] for r in first + rest] == [f"r{q}" for q in range(8)]
    assert all(SEQ not in r for r in first + rest)


def test_a_result_file_that_fails_while_streaming_leaves_the_old_one(tmp_path):
    """``open_atomic``: a file written piece by piece (the chunked Parquet files) appears
    only whole; an error halfway leaves the previous file and no temporary."""
    out = OutDir.parse(tmp_path)
    out.write_text("stages.parquet", "old")
    with pytest.raises(RuntimeError, match="halfway"), out.open_atomic("stages.parquet") as f:
        f.write(b"new, part one")
        raise RuntimeError("halfway")
    assert (tmp_path / "stages.parquet").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stages.parquet"]


def _quick_replay(out: Path, requests: int = 6) -> int:
    return main(["replay", "--backend", "local", "--clock", "virtual", "--requests",
                 str(requests), "--quiet", "--out", str(out)])


def test_a_stopped_runs_shards_are_set_aside_not_mixed_into_the_next_run(tmp_path, capsys):
    """A run killed outright leaves its shards; a later run into the same directory moves
    them to ``stopped-1/parts`` (still readable) and writes only its own rows."""
    from dynbranch.resultlog import SEQ

    out = OutDir.parse(tmp_path)
    old = {"request_id": "old-0", "arrival": 0.0, "start": 0.0, "end": 1.0,
           "status": "completed"}
    out.write_text(f"{PARTS}/requests-00007.jsonl", json.dumps(old) + "\n")
    out.write_text(f"{PARTS}/stages-00007.jsonl", json.dumps({"request_id": "old-0"}) + "\n")
    out.write_text(f"{PARTS}/branches-00007.jsonl",
                   json.dumps({"request_id": "old-0", SEQ: 0}) + "\n")
    assert _quick_replay(tmp_path) == 0
    assert "moved them to" in capsys.readouterr().err
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(requests) == 6 and "old-0" not in set(requests.request_id)
    assert "old-0" not in set(pd.read_parquet(tmp_path / "stages.parquet").request_id)
    assert not (tmp_path / PARTS).exists()
    kept, kept_stages = read_partial(tmp_path / "stopped-1")
    assert list(kept.request_id) == ["old-0"] and list(kept_stages.request_id) == ["old-0"]
    out.write_text(f"{PARTS}/requests-00001.jsonl", json.dumps(old) + "\n")
    assert _quick_replay(tmp_path) == 0  # a second stopped run goes beside the first
    assert sorted(p.name for p in tmp_path.glob("stopped-*")) == ["stopped-1", "stopped-2"]


def test_a_destination_is_held_by_one_run_at_a_time(tmp_path, capsys):
    out = OutDir.parse(tmp_path)
    with out.claimed():
        holder = json.loads((tmp_path / ".dynbranch-run.lock").read_text())
        assert holder["pid"] == os.getpid()
        busy = f"another run is writing here \\(pid {os.getpid()}"
        with pytest.raises(OutputError, match=busy), out.claimed():
            pass
        assert _quick_replay(tmp_path) == 2  # refused before anything runs
        assert "another run is writing here" in capsys.readouterr().err
        assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / ".dynbranch-run.lock").exists()
    with out.claimed():  # released: claimable again
        pass


def test_a_claim_ends_with_its_process_however_it_ends(tmp_path):
    code = ("import sys, time; from dynbranch.outdir import OutDir\n"
            "with OutDir.parse(sys.argv[1]).claimed():\n"
            "    print('held', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(OutputError, match=f"pid {proc.pid}"), OutDir.parse(tmp_path).claimed():
            pass
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert (tmp_path / ".dynbranch-run.lock").exists()  # SIGKILL leaves the file, not the lock
    with OutDir.parse(tmp_path).claimed():
        pass


def test_branch_rows_of_two_runs_are_refused_by_name(tmp_path):
    from dynbranch.resultlog import SEQ, _branch_rows

    out = OutDir.parse(tmp_path)
    for n in (1, 2):
        out.write_text(f"{PARTS}/branches-{n:05d}.jsonl",
                       json.dumps({"request_id": f"r{n}", SEQ: 0}) + "\n")
    with pytest.raises(OutputError, match="two branch rows numbered 0"):
        list(_branch_rows(out, out.listdir(PARTS)))
