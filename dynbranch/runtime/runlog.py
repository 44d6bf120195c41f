"""The run log: one typed row per stage execution, branch and request.

These are what ``stages.parquet`` and ``requests.parquet`` hold and what the independent
checkers (unsafe splices, teardown) read, so every field has one meaning, written here.
All times are seconds on the run's clock, relative to the run's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SERVED_FROM = ("exec", "cache", "shadow", "join")


def _row(record: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` for these flat records: each field, containers copied.

    NOTE: the fields are scalars and flat lists/dicts of strings, so a one-level copy is
    the deep copy ``asdict`` makes, at a fraction of its cost (it was a thirtieth of a
    replay); a test compares the two.
    """
    row = {}
    for f in fields(record):
        v = getattr(record, f.name)
        t = type(v)
        row[f.name] = dict(v) if t is dict else list(v) if t is list else v
    return row


@dataclass
class StageRecord:
    """One execution (or service from a record) of one stage of one request."""

    request_id: str
    stage: str
    kind: str  # llm | tool | human
    seq: int  # position of this stage among the request's stages
    coordinate: str | None  # the branch this stage resolved or followed, if any
    start: float
    end: float
    served_from: str = "exec"  # one of SERVED_FROM
    engine: str = ""  # engine id for llm stages, tool name for tool stages
    call_id: str = ""  # executed llm stages: the engine call's request id (retries share it)
    speculative: bool = False
    fill: str = ""  # speculative stages: the fill (candidate) that ran them
    reusable: bool = False  # declared speculable and, for a tool call, read-only
    reuse_name: str = ""
    fingerprint: str = ""
    input_digest: str = ""
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
    queued_s: float = 0.0  # engine-side wait before first schedule
    engine_s: float = 0.0  # engine-side time of the call (0 for tools)
    preemptions: int = 0
    read_set: dict[str, str] = field(default_factory=dict)
    writes: dict[str, str] = field(default_factory=dict)  # resource -> version after
    output_digest: str = ""
    audit_digest: str = ""  # served stages: digest of what canonical execution returned then
    audit_verdict: str = ""  # served stages: the splice checker's safe | unsafe | unverified
    audit_note: str = ""  # the evidence for the verdict
    error: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def row(self) -> dict[str, Any]:
        r = _row(self)
        r["duration"] = self.duration
        return r


@dataclass
class BranchRecord:
    """One branch a request opened: where, which candidates, what it resolved to."""

    request_id: str
    coordinate: str
    candidates: list[str]
    chosen: list[str]
    opened_at: float
    resolved_at: float | None

    def row(self) -> dict[str, Any]:
        return _row(self)


@dataclass
class RequestRecord:
    """One request's fate: latency from its *scheduled* arrival, and its accuracy."""

    request_id: str
    arrival: float  # scheduled arrival
    start: float  # when the driver actually started it (send lag = start - arrival)
    end: float
    status: str  # completed | failed | rejected | deadline | interrupted
    measured_from: float | None = None  # latency origin when not the arrival (HCI)
    correct: float | None = None
    error_type: str = ""
    error: str = ""
    stages: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    tenant: str = "default"  # assigned by the serving side, never read from the request

    @property
    def latency(self) -> float:
        origin = self.arrival if self.measured_from is None else self.measured_from
        return self.end - origin

    @property
    def send_lag(self) -> float:
        return self.start - self.arrival

    def row(self) -> dict[str, Any]:
        r = _row(self)
        r["latency"] = self.latency
        r["send_lag"] = self.send_lag
        return r


class RunLog:
    """Every stage and branch record of a run, in the order they completed."""

    def __init__(self) -> None:
        self.stages: list[StageRecord] = []
        self.branches: list[BranchRecord] = []
