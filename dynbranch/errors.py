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


class NotSpeculable(DynBranchError):
    """A fill reached a stage it may not run speculatively (not speculable, or a call with
    external effects, or past its depth); the fill stops there, the request is unaffected."""
