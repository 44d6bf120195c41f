"""A tiny real workload for orchestrator tests: plan (llm) → branch → lookup (tool) → answer.

Its tool keeps per-request state and can be told to raise, so tests can check that one
failing request does not take the others with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynbranch.workflow import BranchCoordinate, BranchPoint, StageSpec, Template
from dynbranch.workload import NO_WRITES, ModelledCost, RequestInstance, Tool, ToolResult, WriteSet

TEMPLATE = Template("toy", "1", [
    StageSpec("plan", "llm", ("question",), prompt="Plan for: {question}", model="target",
              speculable=True),
    StageSpec("lookup", "tool", ("key",), tool="kv", tool_schema_version="1", speculable=True),
    StageSpec("answer", "llm", ("question", "fact"), prompt="Q: {question}\nFact: {fact}\nA:",
              model="target", speculable=True),
    StageSpec("pick", "human", ("question",)),
])
KEYS = ("alpha", "beta", "gamma")


class KVTool(Tool):
    name, schema_version = "kv", "1"

    def __init__(self, request_id: str, fail: bool) -> None:
        self.cost = ModelledCost(0.05)
        self._rid, self._fail = request_id, fail

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        return True

    def write_set(self, fields: Mapping[str, Any]) -> WriteSet:
        return NO_WRITES  # per-request state, only ever read

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        if self._fail:
            raise LookupError(f"no such key {fields['key']!r}")
        return ToolResult(f"{fields['key']} is {len(fields['key'])} letters long",
                          reads={f"{self._rid}/kv": "0"})


class ToyRequest(RequestInstance):
    template = TEMPLATE

    def __init__(self, n: int, fail: bool = False, answer_words: int = 20,
                 context_words: int = 0) -> None:
        self.request_id = f"toy-{n:03d}"
        self.key = KEYS[n % len(KEYS)]
        context = " ".join(f"w{n}x{i}" for i in range(context_words))
        self.question = f"{context} How long is the word {self.key}? (#{n})"
        self._tool = KVTool(self.request_id, fail)
        self._answer_words = answer_words

    async def run(self, ctx) -> Any:
        point = BranchPoint(BranchCoordinate("toy", "plan", 0), KEYS)
        async with ctx.branch(point) as br:
            key = await ctx.llm("plan", {"question": self.question})
            br.resolve(key)
        fact = await ctx.tool("lookup", {"key": key})
        return await ctx.llm("answer", {"question": self.question, "fact": fact})

    def tool(self, name: str) -> Tool:
        assert name == "kv"
        return self._tool

    async def speculate(self, ctx, point, candidate: str) -> None:
        fact = await ctx.tool("lookup", {"key": candidate})
        await ctx.llm("answer", {"question": self.question, "fact": fact})

    def replay_text(self, rendered) -> str | None:
        if rendered.stage == "plan":
            return self.key
        words = " ".join(["word"] * self._answer_words)
        letters = rendered.fields["fact"].split()[2]  # "<key> is <n> letters long"
        return f"{letters} letters: {words}"

    def score(self, outcome: Any) -> float:
        return float(outcome.startswith(f"{len(self.key)} letters"))
