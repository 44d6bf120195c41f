"""The workflow model: templates of stages and branches, fingerprints, and input rendering.

A *template* declares the stages a workflow can run (``llm``, ``tool`` or ``human``), which
upstream values enter each stage's rendered input, and which stages are *speculable*
(deterministic and safe to run twice). A request's control flow is ordinary code in the
workload (see :mod:`dynbranch.workload`); every stage it runs is rendered and executed
through the orchestrator, so the template is what gives stages their stable identity.

Pure Python: no Ray, no engines, no clock.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal

from dynbranch.canonical import FrozenList, FrozenMap, Normalised, digest, normalise

StageKind = Literal["llm", "tool", "human"]
STAGE_KINDS: tuple[str, ...] = ("llm", "tool", "human")


@dataclass(frozen=True)
class SamplingParams:
    """Execution parameters of an LLM stage that can change its output."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature {self.temperature} outside [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p {self.top_p} outside (0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} must be >= 1")

    @property
    def greedy(self) -> bool:
        """Whether decoding is deterministic (a precondition for a speculable LLM stage)."""
        return self.temperature == 0.0

    def canonical(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens, "seed": self.seed}


@dataclass(frozen=True)
class StageSpec:
    """One stage of a template.

    ``inputs`` names the upstream values that enter the stage's rendered input, and nothing
    else may: the rendered input is the stage's complete dependency closure (C1 names it).
    ``prompt`` (LLM stages) is a ``str.format`` template over exactly those names.
    ``tool`` (tool stages) names the tool the workload executes. ``model`` is a logical
    model role (``target``, ``drafter``) that the run maps to an engine pool.
    """

    name: str
    kind: StageKind
    inputs: tuple[str, ...]
    prompt: str | None = None
    model: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tool: str | None = None
    tool_schema_version: str | None = None
    speculable: bool = False
    version: str = "1"

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage {self.name!r}: kind {self.kind!r} not in {STAGE_KINDS}")
        if len(set(self.inputs)) != len(self.inputs):
            raise ValueError(f"stage {self.name!r}: duplicate input names {self.inputs}")
        if self.kind == "llm":
            if self.prompt is None or self.model is None:
                raise ValueError(f"llm stage {self.name!r} needs a prompt and a model role")
            used = _format_fields(self.prompt)
            if used != set(self.inputs):
                raise ValueError(
                    f"llm stage {self.name!r}: prompt uses {sorted(used)}, "
                    f"declared inputs are {sorted(self.inputs)}"
                )
            if self.speculable and not self.sampling.greedy:
                raise ValueError(f"llm stage {self.name!r}: a sampling stage cannot be speculable")
        if self.kind == "tool" and self.tool is None:
            raise ValueError(f"tool stage {self.name!r} needs a tool name")
        if self.kind == "human" and self.speculable:
            raise ValueError(f"human stage {self.name!r} cannot be speculable")

    def definition(self, template: str, template_version: str) -> dict[str, Any]:
        """Everything about the stage's definition that can change what it returns."""
        return {
            "template": template, "template_version": template_version,
            "stage": self.name, "kind": self.kind, "version": self.version,
            "inputs": list(self.inputs), "prompt": self.prompt, "model": self.model,
            "sampling": self.sampling, "tool": self.tool,
            "tool_schema_version": self.tool_schema_version,
        }

    def render(self, values: Mapping[str, Any]) -> RenderedInput:
        """Render this stage's complete input from upstream ``values``.

        Raises ``KeyError`` naming the missing inputs. Values not named in ``inputs`` are
        ignored on purpose: they are not part of this stage's dependency closure.
        """
        missing = [n for n in self.inputs if n not in values]
        if missing:
            raise KeyError(f"stage {self.name!r} is missing inputs {missing}")
        fields = {n: values[n] for n in self.inputs}
        text = self.prompt.format(**{n: as_text(v) for n, v in fields.items()}) \
            if self.prompt is not None else as_text(fields)
        return RenderedInput(self.name, MappingProxyType(fields), text)


@dataclass(frozen=True)
class RenderedInput:
    """A stage's complete rendered input: the declared fields and the text they render to."""

    stage: str
    fields: Mapping[str, Any]
    text: str

    @cached_property
    def normal_fields(self) -> Normalised:
        """The fields in canonical form, walked once (the digest and the reuse key share it)."""
        return normalise(dict(self.fields))

    @cached_property
    def input_digest(self) -> str:
        """SHA-256 of the canonical encoding of the fields (the ``H(input)`` of a reuse name)."""
        # NOTE: cached, as the fields are: a rendered input is a snapshot, read many times
        # (decode-length seed, replay, stage row), and walking it dominated a replay.
        return digest(self.normal_fields)


@dataclass(frozen=True)
class SubgraphSpec:
    """A self-contained subgraph: a root stage plus the stages it calls (nested subgraphs)."""

    name: str
    root: str
    children: tuple[str, ...] = ()


@dataclass(frozen=True, order=True)
class BranchCoordinate:
    """The stable identity of a decision in a workflow template, e.g. routing/router/2."""

    workflow: str
    stage: str
    step: int

    def __str__(self) -> str:
        return f"{self.workflow}/{self.stage}/{self.step}"


@dataclass(frozen=True)
class BranchPoint:
    """A branch as the workflow opens it: where, which candidates, how it resolves.

    ``candidates`` is the bounded candidate set when the template can enumerate it, else
    empty (open vocabulary). ``evidence`` is what is known at branch time and nothing more
    (the previous hop's passage, the offered menu): predictors rank from it. A workload
    must never put the branch's outcome, or anything derived from the trace's future, here.
    """

    coordinate: BranchCoordinate
    candidates: tuple[str, ...]
    multi_valued: bool = False
    evidence: Mapping[str, Any] = field(default_factory=dict)


class Template:
    """A workflow template: named stages and subgraphs with stable fingerprints."""

    def __init__(self, name: str, version: str, stages: list[StageSpec],
                 subgraphs: list[SubgraphSpec] = ()) -> None:
        self.name, self.version = name, version
        self.stages: Mapping[str, StageSpec] = MappingProxyType({s.name: s for s in stages})
        if len(self.stages) != len(stages):
            raise ValueError(f"template {name!r}: duplicate stage names")
        self.subgraphs: Mapping[str, SubgraphSpec] = MappingProxyType(
            {g.name: g for g in subgraphs})
        for g in subgraphs:
            unknown = [s for s in (g.root, *g.children)
                       if s not in self.stages and s not in self.subgraphs]
            if unknown:
                raise ValueError(f"subgraph {g.name!r} names unknown stages {unknown}")
        self._fingerprints: dict[str, str] = {}

    def stage(self, name: str) -> StageSpec:
        try:
            return self.stages[name]
        except KeyError:
            raise KeyError(f"template {self.name!r} has no stage {name!r}") from None

    def fingerprint(self, name: str) -> str:
        """The fingerprint of a stage or subgraph: its definition, nested children included."""
        if name not in self._fingerprints:
            self._fingerprints[name] = digest(self._definition(name))
        return self._fingerprints[name]

    def _definition(self, name: str) -> dict[str, Any]:
        if name in self.subgraphs:
            g = self.subgraphs[name]
            return {"subgraph": name, "root": self._definition(g.root),
                    "children": [self._definition(c) for c in g.children]}
        return self.stage(name).definition(self.name, self.version)


def _format_fields(template: str) -> set[str]:
    names = set()
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"prompt field {name!r} must be a plain name")
        names.add(name)
    return names


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def _json_of(value: Any) -> str:
    t = type(value)
    if t is FrozenMap or t is FrozenList:
        return value.text(_json)
    return _json(value)


def as_text(value: Any) -> str:
    """How a value renders into a prompt: strings as they are, anything else as sorted JSON."""
    if isinstance(value, str):
        return value
    t = type(value)
    if t is FrozenMap or t is FrozenList:
        return value.text(_json)
    if t is list or t is tuple:
        # NOTE: item by item, as json.dumps joins a list (", "), so frozen items (a
        # function's schema, a message) render once however many prompts carry them.
        return "[" + ", ".join(map(_json_of, value)) + "]"
    return _json(value)
