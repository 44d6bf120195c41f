"""A workload whose requests share one external key-value store: reads and writes.

``ReadRequest`` asks about a key: ``plan`` (llm) → ``lookup`` (read-only tool; reads the
store at its version) → ``answer`` (llm, rendered from the lookup's value).
``WriteRequest`` changes a key through ``store`` (a mutating tool; bumps the version). Two
read requests about the same key render identical inputs, so C1 may serve the second from
the first's records — until a write makes them stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynbranch.workflow import StageSpec, Template
from dynbranch.workload import ModelledCost, RequestInstance, Tool, ToolResult

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
    """The external store: contents and a version bumped by every write."""

    def __init__(self, contents: Mapping[str, str]) -> None:
        self.contents, self.version = dict(contents), 0


class KVTool(Tool):
    name, schema_version = "kv", "1"

    def __init__(self, kv: SharedKV) -> None:
        self.kv, self.cost = kv, ModelledCost(0.02)

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        return "value" not in fields

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        before = str(self.kv.version)
        if "value" in fields:
            self.kv.contents[fields["key"]] = fields["value"]
            self.kv.version += 1
            return ToolResult("ok", reads={RESOURCE: before},
                              writes={RESOURCE: str(self.kv.version)})
        return ToolResult(self.kv.contents.get(fields["key"], "unknown"),
                          reads={RESOURCE: before})


class ReadRequest(RequestInstance):
    template = TEMPLATE

    def __init__(self, request_id: str, kv: SharedKV, key: str) -> None:
        self.request_id, self.key, self._tool = request_id, key, KVTool(kv)
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


class WriteRequest(ReadRequest):
    def __init__(self, request_id: str, kv: SharedKV, key: str, value: str) -> None:
        super().__init__(request_id, kv, key)
        self.value = value

    async def run(self, ctx) -> Any:
        return await ctx.tool("store", {"key": self.key, "value": self.value})
