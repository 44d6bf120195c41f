"""One BFCL record as the routing workload replays it (see :mod:`workloads.routing.bfcl_data`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dynbranch.canonical import digest, freeze
from workloads.routing.categories import MULTI_TURN, is_irrelevance


@dataclass(frozen=True)
class Record:
    """A BFCL record: its user turns, the functions it offers, and the recorded calls.

    ``recorded`` holds, per turn, the calls the trace makes in BFCL's python syntax (the
    ground truth for multi-turn; for single-turn, one concrete call per expected call built
    from the allowed values; nothing for irrelevance). ``parallel`` records make all of a
    turn's calls at once. ``functions`` are all the functions the record ever offers;
    ``held_out`` maps a turn to the names first offered at that turn (``miss_func``).
    """

    id: str
    category: str
    turns: tuple[str, ...]
    functions: tuple[Mapping[str, Any], ...]
    recorded: tuple[tuple[str, ...], ...]
    parallel: bool = False
    classes: tuple[str, ...] = ()
    initial_config: Mapping[str, Any] = field(default_factory=dict)
    possible_answer: tuple[Mapping[str, Mapping[str, list]], ...] = ()
    held_out: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    long_context: bool = False

    def __post_init__(self) -> None:
        # NOTE: frozen deeply, so each schema keeps its canonical form: every router and
        # handler input carries function schemas, and walking them again per stage was the
        # largest cost of a replay (issue: fast at scale).
        object.__setattr__(self, "functions", tuple(freeze(f) for f in self.functions))

    @property
    def multi_turn(self) -> bool:
        return self.category in MULTI_TURN

    @property
    def irrelevance(self) -> bool:
        return is_irrelevance(self.category)

    @cached_property
    def scenario(self) -> str:
        """The workspace a multi-turn record acts on: its API classes and initial state
        (``""`` for single-turn records, which act on nothing).

        Records of one BFCL task in different categories often share their user turns while
        acting on different workspaces (``long_context`` adds files and rows), and their
        recorded calls differ with the workspace: the router and handler read this name, as
        an agent's system prompt names the session it acts in, so one rendered input never
        stands for two recorded answers.
        """
        if not self.multi_turn:
            return ""
        return digest({"classes": list(self.classes), "initial_config": dict(self.initial_config),
                       "long_context": self.long_context})[:16]

    @cached_property
    def function_names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.functions)

    def doc(self, name: str) -> Mapping[str, Any] | None:
        return self._docs.get(name)

    @cached_property
    def _docs(self) -> dict[str, Mapping[str, Any]]:
        docs: dict[str, Mapping[str, Any]] = {}
        for f in self.functions:
            docs.setdefault(f["name"], f)  # the first of a name, as a scan would find
        return docs

    def request_text(self, turn: int) -> str:
        """What the user asks at ``turn``, as the handler reads it.

        NOTE: a held-out turn's own message (BFCL's "I have updated some more functions...")
        names no task: the task is the previous turn's, which could not be done without the
        new functions. A handler reading only that message could not know what to call, and
        records holding out the same function would render the same handler input with
        different recorded calls, so the previous turn's text comes first.
        """
        if turn in self.held_out and turn > 0:
            return f"{self.turns[turn - 1]}\n{self.turns[turn]}"
        return self.turns[turn]

    def offered(self, turn: int) -> tuple[Mapping[str, Any], ...]:
        """The functions offered at ``turn``: all but those held out until a later turn,
        held-out ones appended in the order they arrive (as BFCL's inference loop does)."""
        later = {n for t, names in self.held_out.items() if t > turn for n in names}
        early = {n for t, names in self.held_out.items() if t <= turn for n in names}
        base = [f for f in self.functions if f["name"] not in later | early]
        added = [self.doc(n) for t in sorted(self.held_out) if t <= turn for n in self.held_out[t]]
        return (*base, *added)
