"""Typed errors. Every failure a user can cause or observe has a class here.

Errors raised before a run starts (bad workload, missing data, malformed record, an arm that
is not built) derive from :class:`ConfigError` or :class:`DataError` and stop the run with a
message naming the problem. Errors raised inside a request (:class:`StageError`) fail that
request only; the driver records the error's class and message and the others complete.
"""

from __future__ import annotations


class DynBranchError(Exception):
    """Base class of every error DynBranch raises on purpose."""


# -- before a run -------------------------------------------------------------------------


class ConfigError(DynBranchError):
    """A flag, option or combination of them that cannot be run."""


class UnknownNameError(ConfigError):
    """A name (workload, arm, engine, profile, experiment) that DynBranch does not know."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known)}")


class NotBuiltError(ConfigError):
    """A name DynBranch knows (from the paper's design) but that is not built yet."""

    def __init__(self, kind: str, name: str, built: list[str]):
        self.kind, self.name, self.built = kind, name, sorted(built)
        built_text = ", ".join(self.built) if self.built else "none yet"
        super().__init__(
            f"{kind} {name!r} is part of the design but not built yet; "
            f"built {kind}s: {built_text}"
        )


class MalformedProfileError(ConfigError):
    """An engine profile file (TOML) with a missing, mistyped or out-of-range field."""

    def __init__(self, path: str, field: str, problem: str):
        self.path, self.field, self.problem = path, field, problem
        super().__init__(f"{path}: field {field}: {problem}")


class ModelNotFoundError(ConfigError):
    """A local model directory (config, weights, tokenizer) that is not where it was looked for."""

    def __init__(self, path: str, how: str):
        self.path, self.how = path, how
        super().__init__(f"no model at {path} (no config.json there). {how}")


class DataError(DynBranchError):
    """Workload data that is missing or cannot be read."""


class DataMissingError(DataError):
    """A data set that is not where DynBranch looked for it."""

    def __init__(self, dataset: str, looked: list[str], how: str):
        self.dataset, self.looked, self.how = dataset, looked, how
        where = "; ".join(looked) if looked else "(nowhere)"
        super().__init__(f"data set {dataset!r} not found; looked in: {where}. {how}")


class MalformedRecordError(DataError):
    """A record in a data file that does not have the shape its loader needs."""

    def __init__(self, path: str, record: str | int, problem: str):
        self.path, self.record, self.problem = path, record, problem
        super().__init__(f"{path}: record {record}: {problem}")


class DataFetchError(DataError):
    """A data set that could not be fetched from its official source (network, layout)."""

    def __init__(self, dataset: str, source: str, problem: str):
        self.dataset, self.source, self.problem = dataset, source, problem
        super().__init__(f"could not fetch data set {dataset!r} from {source}: {problem}")


class ChecksumError(DataFetchError):
    """A fetched file whose SHA-256 is not the pinned one (nothing is extracted from it)."""

    def __init__(self, dataset: str, source: str, path: str, expected: str, actual: str):
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(dataset, source,
                         f"{path} has sha256 {actual}, expected {expected}; it was removed")


# -- inside a request ---------------------------------------------------------------------


class StageError(DynBranchError):
    """A stage that failed inside a request; fails that request only."""

    def __init__(self, request_id: str, stage: str, message: str):
        self.request_id, self.stage = request_id, stage
        super().__init__(f"request {request_id} stage {stage}: {message}")


class ToolCallError(StageError):
    """A tool stage whose tool raised (the tool's own exception is chained as the cause)."""


class ToolError(DynBranchError):
    """A tool's own refusal or failure of one call; the orchestrator records it for the stage.

    Raised by :meth:`dynbranch.workload.Tool.call`, which knows neither the stage nor how the
    orchestrator reports failures; the orchestrator wraps it in :class:`ToolCallError`.
    """

    def __init__(self, tool: str, call: str, problem: str):
        self.tool, self.call, self.problem = tool, call, problem
        super().__init__(f"tool {tool}: call {call!r}: {problem}")


class ToolInputError(ToolError):
    """A call its tool cannot run: unparseable, an unknown function, arguments off-schema."""


class ToolExecutionError(ToolError):
    """A call whose underlying API raised; the API's exception is chained as the cause."""


class RenderError(StageError):
    """A stage whose input could not be rendered from the upstream values."""


class EngineError(DynBranchError):
    """An engine that failed a generate call or is unhealthy."""


class EngineAborted(EngineError):
    """A generate call that was aborted by id before it finished."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        super().__init__(f"engine request {request_id} was aborted")


class PromptTooLongError(EngineError):
    """A prompt that cannot fit in the engine's KV pool even when it runs alone."""


class EngineDied(EngineError):
    """An engine that died (its actor or process is gone, or it stopped answering) under a
    call; the call did not finish there. ``engine_id`` is the engine, ``request_id`` the
    call; ``retried`` says whether the call had already been retried on another engine."""

    def __init__(self, engine_id: str, request_id: str, cause: str, *, retried: bool = False):
        self.engine_id, self.request_id, self.cause, self.retried = (engine_id, request_id,
                                                                     cause, retried)
        again = " (after a retry on another engine)" if retried else ""
        super().__init__(f"engine {engine_id} died under call {request_id}{again}: {cause}")


class NoEngineError(EngineDied):
    """Every engine of a model role is down: the call has nowhere to run."""

    def __init__(self, role: str, request_id: str, down: list[str]):
        self.role, self.down = role, sorted(down)
        super().__init__(f"<{role}>", request_id,
                         f"every engine of role {role!r} is down ({', '.join(self.down)})")


# -- admission and interruption -----------------------------------------------------------


class AdmissionRejected(DynBranchError):
    """A request refused at arrival: the server already held ``max_inflight`` requests."""

    def __init__(self, request_id: str, inflight: int, max_inflight: int):
        self.request_id, self.inflight, self.max_inflight = request_id, inflight, max_inflight
        super().__init__(f"request {request_id} rejected at arrival: {inflight} requests in "
                         f"flight (--max-inflight {max_inflight})")


class DeadlineExceeded(DynBranchError):
    """A request cancelled because it was not done ``deadline_s`` after its arrival."""

    def __init__(self, request_id: str, deadline_s: float):
        self.request_id, self.deadline_s = request_id, deadline_s
        super().__init__(f"request {request_id} not done within {deadline_s:g} s of its "
                         f"scheduled arrival (--deadline-s); cancelled")


class RunInterrupted(DynBranchError):
    """A request still in flight when the run was interrupted (SIGINT, SIGTERM)."""

    def __init__(self, request_id: str, signal_name: str):
        self.request_id, self.signal_name = request_id, signal_name
        super().__init__(f"request {request_id} in flight when the run got {signal_name}")


class OutputError(ConfigError):
    """A result destination (``--out``) that cannot be written: named before the run starts."""

    def __init__(self, out: str, problem: str):
        self.out, self.problem = out, problem
        super().__init__(f"--out {out}: {problem}")


# -- C1 reuse store ------------------------------------------------------------------------


class ReuseError(DynBranchError):
    """A stage C1 cannot name, record or restore; the stage then runs without reuse."""


class UnnameableInputError(ReuseError):
    """A reuse key part (rendered field, parameter) that has no canonical encoding."""

    def __init__(self, part: str, problem: str):
        self.part, self.problem = part, problem
        super().__init__(f"cannot name reuse key: {part}: {problem}")


class UnrecordableValueError(ReuseError):
    """A stage output or input that cannot be serialised into a record (not JSON-like)."""

    def __init__(self, what: str, problem: str):
        self.what, self.problem = what, problem
        super().__init__(f"cannot record {what}: {problem}")


class CorruptRecordError(ReuseError):
    """Record bytes that do not decode to a record of the expected schema."""

    def __init__(self, problem: str):
        self.problem = problem
        super().__init__(f"corrupt reuse record: {problem}")


class TicketError(ReuseError):
    """An in-flight ticket finished twice, or finished with another name's record."""


class StoreUnavailable(ReuseError):
    """A store shard that did not answer (dead, restarting, not yet re-synchronised) within
    its retry policy; callers degrade to a miss."""

    def __init__(self, shard: int, method: str, cause: str):
        self.shard, self.method, self.cause = shard, method, cause
        super().__init__(f"store shard {shard}: {method} unavailable: {cause}")


class NotSpeculable(DynBranchError):
    """A fill reached a stage it may not run speculatively (not speculable, or a call with
    external effects, or past its depth); the fill stops there, the request is unaffected."""


def typed_error_names() -> frozenset[str]:
    """The class names of every error DynBranch raises on purpose (what ``error_type`` holds
    for a typed failure); a failure whose type is not among them is *untyped*."""
    seen: set[str] = set()
    todo: list[type] = [DynBranchError]
    while todo:
        cls = todo.pop()
        if cls.__name__ not in seen:
            seen.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return frozenset(seen)
