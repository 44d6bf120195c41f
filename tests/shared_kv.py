"""A workload whose requests share one external key-value store: reads and writes.

``ReadRequest`` asks about a key: ``plan`` (llm) → ``lookup`` (read-only tool; reads the
store at its version) → ``answer`` (llm, rendered from the lookup's value).
``WriteRequest`` changes a key through ``store`` (a mutating tool that declares its write
set; bumps the version the moment it runs, then is charged ``write_s``). Two read requests
about the same key render identical inputs, so C1 may serve the second from the first's
records — until a write makes them stale. ``SharedKV.history`` keeps the contents at every
version, so a test can say what a read of any version returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynbranch.workflow import StageSpec, Template
from dynbranch.workload import NO_WRITES, ModelledCost, RequestInstance, Tool, ToolResult, WriteSet

TEMPLATE = Template("kv", "1", [
    StageSpec("plan", "llm", ("question",), prompt="Which key answers: {question}",
              model="target", speculable=True),
    StageSpec("lookup", "tool", ("key",), tool="kv", tool_schema_version="1", speculable=True),
    StageSpec("answer", "llm", ("question", "fact"), prompt="Q: {question}\nFact: {fact}\nA:",
              model="target", speculable=True),
    StageSpec("store", "tool", ("key", "value"), tool="kv", tool_schema_version="1",
              speculable=True),
])
RESOURCE = "kv:shared"


class SharedKV:
    """The external store: contents, a version bumped by every write, and the contents at
    every version (``history[v]``)."""

    def __init__(self, contents: Mapping[str, str], resource: str = RESOURCE) -> None:
        self.contents, self.version, self.resource = dict(contents), 0, resource
        self.history = [dict(self.contents)]

    def put(self, key: str, value: str) -> None:
        self.contents[key] = value
        self.version += 1
        self.history.append(dict(self.contents))


class KVTool(Tool):
    """Reads a key, or (a call with a ``value``) writes one; charged ``cost_s`` per call."""

    name, schema_version = "kv", "1"

    def __init__(self, kv: SharedKV, cost_s: float = 0.02) -> None:
        self.kv, self.cost = kv, ModelledCost(cost_s)

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        return "value" not in fields

    def write_set(self, fields: Mapping[str, Any]) -> WriteSet:
        return NO_WRITES if self.is_read_only(fields) else WriteSet.of(self.kv.resource)

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        res, before = self.kv.resource, str(self.kv.version)
        if "value" in fields:
            self.kv.put(fields["key"], fields["value"])
            return ToolResult("ok", reads={res: before}, writes={res: str(self.kv.version)})
        return ToolResult(self.kv.contents.get(fields["key"], "unknown"), reads={res: before})


class FailingKVTool(KVTool):
    """Writes, then raises (a write that changed the store but reports nothing)."""

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        super().call(fields)
        raise ConnectionError("the store went away after the write")


class ReadRequest(RequestInstance):
    template = TEMPLATE

    def __init__(self, request_id: str, kv: SharedKV, key: str) -> None:
        self.request_id, self.key, self.kv, self._tool = request_id, key, kv, KVTool(kv)
        self.question = f"What is the {key}?"

    async def run(self, ctx) -> Any:
        key = await ctx.llm("plan", {"question": self.question})
        fact = await ctx.tool("lookup", {"key": key})
        return await ctx.llm("answer", {"question": self.question, "fact": fact})

    def tool(self, name: str) -> Tool:
        return self._tool

    def replay_text(self, rendered) -> str | None:
        if rendered.stage == "plan":
            return self.key
        return f"The {self.key} is {rendered.fields['fact']}."

    def score(self, outcome: Any) -> float:
        return 1.0


class LookupRequest(ReadRequest):
    """Only the ``lookup`` stage, charged ``lookup_s``. ``seen`` holds the store's version
    when the lookup was issued and when it returned, and the value it returned."""

    def __init__(self, request_id: str, kv: SharedKV, key: str, lookup_s: float = 0.02) -> None:
        super().__init__(request_id, kv, key)
        self._tool = KVTool(kv, lookup_s)
        self.seen: tuple[int, int, str] | None = None

    async def run(self, ctx) -> Any:
        issued = self.kv.version
        fact = await ctx.tool("lookup", {"key": self.key})
        self.seen = (issued, self.kv.version, fact)
        return fact


class WriteRequest(ReadRequest):
    """Writes ``value`` under ``key``: the store changes at once, the call is charged
    ``write_s``; ``fail``: the tool raises right after writing."""

    def __init__(self, request_id: str, kv: SharedKV, key: str, value: str, *,
                 write_s: float = 0.02, fail: bool = False) -> None:
        super().__init__(request_id, kv, key)
        self.value = value
        self._tool = (FailingKVTool if fail else KVTool)(kv, write_s)

    async def run(self, ctx) -> Any:
        return await ctx.tool("store", {"key": self.key, "value": self.value})
