"""One Routing request: its control flow, its replay oracle and its score.

Control flow per user turn: the router decides (a branch); each chosen function gets a
handler (LLM) and an executor (tool) call; the calls of one decision run concurrently; the
router decides again on the grown conversation until it answers :data:`END_OF_TURN`.

Replay (:meth:`RoutingRequest.replay_text`) is a pure function of the rendered input: the
router's position comes from the conversation in its input (which user turn, which calls
that turn already holds), the handler's from the user turns of its history, its turn text
and calls so far. It answers
the trace's decision where the input lies on the recorded path, a deterministic plausible
call for a handler of a function the trace did not call there, and ``None`` elsewhere;
the request's decode model (:mod:`workloads.routing.decode`) wraps a decision in the
reasoning a Qwen3 agent decodes before it, and the workflow reads only the decision
(:func:`~dynbranch.decode_lengths.decision_of`), as an agent framework strips the thinking.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache, partial
from typing import Any

from dynbranch.canonical import freeze
from dynbranch.decode_lengths import RECORDED, DecodeModel, decision_of
from dynbranch.errors import ToolCallError
from dynbranch.predictors.base import EVIDENCE_KEY
from dynbranch.predictors.frequency import FEATURES_KEY
from dynbranch.workflow import BranchCoordinate, BranchPoint, RenderedInput
from dynbranch.workload import RequestInstance, StageContext, Tool
from workloads.routing.apis import ApiState, ApiSuite
from workloads.routing.bfcl_data import Record
from workloads.routing.calls import ParsedCall, parse_call, to_jsonable
from workloads.routing.schema import matches_answers, plausible_call
from workloads.routing.template import END_OF_TURN, TEMPLATE, TOOL_NAME, WORKFLOW
from workloads.routing.tools import ApiTool, SchemaTool

# NOTE: a bound on router decisions per turn, so a model that never ends a turn still ends
# the request (the longest recorded turns, in multi_turn_long_context_38 and _46, have 34
# calls).
MAX_DECISIONS_PER_TURN = 64


def _frozen(value: dict[str, Any]) -> Mapping[str, Any]:
    """``value`` frozen, so its canonical form is walked once however many later stage
    inputs carry it; as it is when it holds what cannot be frozen."""
    try:
        return freeze(value)
    except TypeError:
        return value


def _message(role: str, content: Any) -> Mapping[str, Any]:
    """One conversation message (frozen where it can be)."""
    return _frozen({"role": role, "content": content})


class RouterEvidence(Mapping[str, Any]):
    """A router branch's evidence: ``turn``, the candidates' features
    (:data:`~dynbranch.predictors.frequency.FEATURES_KEY`) and its name
    (:data:`~dynbranch.predictors.base.EVIDENCE_KEY`).

    The name is what the features are read from: the record, the turn and the functions
    called so far in it. A repeated request's branches carry their first occurrence's name,
    and the logit predictor learns them from what it kept of that one, so the features,
    several hundred strings, are built only when first read (``build``, which must not
    depend on anything that changes later). Pickled as the plain dict it reads as."""

    __slots__ = ("_build", "_features", "_name", "_turn")

    def __init__(self, turn: str, name: Hashable, build: Callable[[], dict[str, list[str]]]
                 ) -> None:
        self._turn, self._name = turn, name
        self._build: Callable[[], dict[str, list[str]]] | None = build
        self._features: dict[str, list[str]] | None = None

    def __getitem__(self, key: str) -> Any:
        if key == FEATURES_KEY:
            if self._build is not None:
                self._features, self._build = self._build(), None
            return self._features
        if key == "turn":
            return self._turn
        if key == EVIDENCE_KEY:
            return self._name
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("turn", FEATURES_KEY, EVIDENCE_KEY))

    def __len__(self) -> int:
        return 3

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))

    def __repr__(self) -> str:
        return f"RouterEvidence({dict(self)!r})"


@dataclass(frozen=True)
class ExecutedCall:
    """A call the request ran and the value the executor returned."""

    call: str
    value: Any

    @cached_property
    def entry(self) -> Mapping[str, Any]:
        """The call and its result as stage inputs carry them (frozen where it can be)."""
        return _frozen({"call": self.call, "result": self.value})


@dataclass
class RoutingOutcome:
    """What :meth:`RoutingRequest.run` returns and :meth:`RoutingRequest.score` reads."""

    record_id: str
    category: str
    turns: list[list[ExecutedCall]] = field(default_factory=list)
    states: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    router_decisions: int = 0
    ignored_routes: list[str] = field(default_factory=list)


@lru_cache(maxsize=1 << 14)
def _name(call: str) -> str:
    """The function a call in BFCL's syntax names.

    NOTE: remembered by the call's text: a call with a list or dict argument is parsed
    afresh by :func:`parse_call` each time, and every request of a record names its
    recorded calls again (0.9 % of a 10,000-request replay)."""
    return parse_call(call).name


_DOC_WORDS = """this that with from into given will which when then than their
there these those have been also only such each more most other some what your about
function returns return retrieve retrieves value values list specified provided using"""
_DOC_STOPWORDS = frozenset(_DOC_WORDS.split())


@lru_cache(maxsize=8192)
def _name_words(name: str) -> frozenset[str]:
    """The first four letters of each word of a function name (``get_stock_info``,
    ``Flights_4_SearchOnewayFlight``, ``math.hypot``): snake, dotted and camel case.

    NOTE: remembered like :func:`_description_words` (every router branch reads every offered
    name's words; the data set's names bound the cache)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return frozenset(w[:4] for w in re.findall(r"[a-z0-9]+", spaced.lower()) if len(w) >= 3)


@lru_cache(maxsize=8192)
def _verb(name: str) -> str:
    """The first word of a function name, lower case (``get_stock_info`` → ``get``,
    ``displayCarStatus`` → ``display``, ``math.hypot`` → ``math``)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    words = re.findall(r"[a-z0-9]+", spaced.lower())
    return words[0] if words else name


@lru_cache(maxsize=8192)
def _description_words(description: str) -> frozenset[str]:
    """Content words (first four letters) of a function description.

    NOTE: shared by every request (a pure function of the text, bounded by the data set's
    descriptions): a per-request cache kept every finished request's sets alive.
    """
    text = description.lower()
    return frozenset(w[:4] for w in re.findall(r"[a-z0-9]+", text)
                     if len(w) >= 4 and w not in _DOC_STOPWORDS)


def _doc_words(record: Record, name: str) -> frozenset[str]:
    """Content words (first four letters) of the description of ``record``'s function
    ``name``."""
    doc = record.doc(name) or {}
    return _description_words(str(doc.get("description", "")))


class _TurnFeatures:
    """The router features of one turn of a record that do not depend on the calls made so
    far: each candidate's overlaps with what the turn says, and each word the turn says
    crossed with a candidate (or an ``end-after``), built once per turn.

    NOTE: a turn with n calls opens n + 1 router branches, each of which built every
    ``word:<w>><candidate>`` string again: 6,609 feature builds over 1,000 Routing requests
    were of 3,252 distinct turns. Kept for the last :data:`TURNS_KEPT` turns; a kept turn
    holds its record and is used only for that same record object.
    """

    __slots__ = ("_crossed", "ordered", "overlaps", "record")

    def __init__(self, record: Record, candidates: tuple[str, ...], turn: str) -> None:
        said = {w[:4] for w in re.findall(r"[a-z0-9]+", turn.lower()) if len(w) >= 3}
        doc = {c: len(_doc_words(record, c) & said) for c in candidates if c != END_OF_TURN}
        best = max(doc.values(), default=0)
        self.record = record
        self.ordered = [f"word:{w}>" for w in sorted(said)]
        self.overlaps: dict[str, tuple[str, ...]] = {
            c: (f"name-overlap={min(3, len(_name_words(c) & said))}",
                f"doc-overlap={min(4, doc[c])}", *(("doc-best",) if best and doc[c] == best
                                                   else ()))
            for c in doc}
        self._crossed: dict[str, list[str]] = {}

    def crossed(self, suffix: str) -> list[str]:
        """``word:<w>>`` + ``suffix`` for each word the turn says, in order (do not change
        the list: it is kept)."""
        words = self._crossed.get(suffix)
        if words is None:
            words = self._crossed[suffix] = [w + suffix for w in self.ordered]
        return words

    @classmethod
    def of(cls, record: Record, candidates: tuple[str, ...], turn: str) -> _TurnFeatures:
        key = (record.id, candidates, turn)
        kept = _TURNS.get(key)
        if kept is None or kept.record is not record:
            kept = _TURNS[key] = cls(record, candidates, turn)
            if len(_TURNS) > TURNS_KEPT:
                del _TURNS[next(iter(_TURNS))]
        return kept


TURNS_KEPT = 1024
"""Turns whose router features :class:`_TurnFeatures` keeps (the requests in flight hold a
few hundred open turns at a few requests per second)."""
_TURNS: dict[tuple[str, tuple[str, ...], str], _TurnFeatures] = {}


class RoutingRequest(RequestInstance):
    """A request built from one BFCL record, with its own API instances.

    NOTE: what a request builds from its record (its API instances, the recorded calls'
    names) is built when it is first used, not when the request is made: a trace made in
    full before its first request starts (a run that keeps its log, an experiment's shaped
    stream, a trace read through) held about 4 KB a request built eagerly (200 MB for
    50,000). The APIs draw from their own seeded generators, so when they are built does
    not change a run.
    """

    template = TEMPLATE

    def __init__(
        self, request_id: str, record: Record, suite: ApiSuite | None, tool_time: str = "modelled",
        shared: tuple[str, ApiState] | None = None, decode: DecodeModel = RECORDED,
    ) -> None:
        self.request_id, self.record, self._suite = request_id, record, suite
        self.decode, self._tool_time = decode, tool_time
        self.candidates = (*record.function_names, END_OF_TURN)
        self._state: ApiState | None = None
        self._tool: Tool | None = None
        if record.multi_turn and shared is not None:
            owner, self._state = shared  # a workspace other requests read and write too
            self._tool = ApiTool(request_id, self._state, tool_time, owner=owner)
            self.scope = {"shared": owner, "classes": list(record.classes)}
        elif record.multi_turn:
            self.scope = None  # rendered per call from the state's lineage
        else:
            self.scope = {"record": record.id}  # validation is pure: shareable across requests
        # open router branch -> (turn, calls so far, history, functions offered)
        self._open: dict[BranchCoordinate, tuple[str, list, list, tuple[str, ...]]] = {}
        self._truth: tuple[list[list[Any]], list[dict]] | None = None

    @property
    def state(self) -> ApiState | None:
        """The API instances this request's calls run on (``None`` for a single-turn record):
        its own, loaded with the record's initial configuration, or a shared workspace."""
        if self._state is None and self.record.multi_turn:
            r = self.record
            self._state = ApiState(self._suite, r.classes, r.initial_config, r.long_context)
        return self._state

    @property
    def functions(self) -> list[dict[str, Any]]:
        """The record's function documents, as plain dicts."""
        return [dict(f) for f in self.record.functions]

    @cached_property
    def _names(self) -> list[list[str]]:
        """The names of the functions each turn's recorded calls name."""
        return [[_name(c) for c in turn] for turn in self.record.recorded]

    # -- control flow -------------------------------------------------------------------------

    async def run(self, ctx: StageContext) -> RoutingOutcome:
        outcome = RoutingOutcome(self.record.id, self.record.category)
        conversation: list[dict[str, Any]] = []
        for t, turn in enumerate(self.record.turns):
            history = list(conversation)  # the conversation before this user turn
            conversation.append(_message("user", turn))
            functions = list(self.record.offered(t))
            request = self.record.request_text(t)
            offered = tuple(f["name"] for f in functions)
            executed: list[ExecutedCall] = []
            for _ in range(MAX_DECISIONS_PER_TURN):
                chosen = await self._route(ctx, outcome, functions, conversation, request,
                                           executed, history)
                if not chosen:
                    break
                so_far = [c.entry for c in executed]
                seen: Counter[str] = Counter()
                jobs = []
                for name in chosen:
                    jobs.append(self._handle(ctx, name, seen[name], request, so_far, history,
                                             offered))
                    seen[name] += 1
                for done in await asyncio.gather(*jobs):
                    conversation.append(_message("assistant", done.call))
                    # NOTE: the result as the call's entry froze it, so the conversation
                    # and the handlers' calls share one kept encoding of it (a long-context
                    # listing took 1.3 ms to encode, once for each until then)
                    conversation.append(_message("tool", done.entry["result"]))
                    executed.append(done)
            outcome.turns.append(executed)
            if self.state is not None:
                outcome.states.append(self.state.public_state())
        return outcome

    async def _route(
        self,
        ctx: StageContext,
        outcome: RoutingOutcome,
        functions: list[dict[str, Any]],
        conversation: list,
        turn: str,
        executed: list[ExecutedCall],
        history: list,
    ) -> list[str]:
        coordinate = BranchCoordinate(WORKFLOW, "router", outcome.router_decisions)
        outcome.router_decisions += 1
        offered = tuple(f["name"] for f in functions)
        self._open[coordinate] = (
            turn, [c.entry for c in executed], history, offered)
        point = BranchPoint(coordinate, self.candidates, multi_valued=self.record.parallel,
                            evidence=self._evidence(turn, executed))
        async with ctx.branch(point) as branch:
            text = decision_of(await ctx.llm("router", self.router_values(functions, conversation)))
            chosen = self._parse_route(text, outcome)
            branch.resolve(*(dict.fromkeys(chosen) or (END_OF_TURN,)))
        self._open.pop(coordinate, None)
        return chosen

    def _evidence(self, turn: str, executed: Sequence[ExecutedCall]) -> RouterEvidence:
        """What a predictor may know at the router's branch: the user's turn and the
        functions offered (what the router itself reads) and the calls made so far
        (:meth:`_features`), named by what it is read from (:class:`RouterEvidence`)."""
        names = tuple(_name(c.call) for c in executed)
        # NOTE: the build holds the record and the candidates, not this request: an evidence
        # never read must not keep a finished request's state alive
        return RouterEvidence(turn, (WORKFLOW, self.record.id, turn, names),
                              partial(self._features, self.record, self.candidates, turn, names))

    @staticmethod
    def _features(record: Record, candidates: tuple[str, ...], turn: str,
                  called_names: tuple[str, ...]) -> dict[str, list[str]]:
        """Each of ``candidates``' features at a router branch of ``record``'s ``turn`` after
        ``called_names`` (this turn's calls so far, in order).

        Each candidate gets features the frequency predictor pools across records (their
        pick rates generalise, unlike a function's own name):

        * ``"<previous> -> <candidate>"``: which function tends to follow which;
        * ``"name-overlap=k"``: how many words of the function's name the turn mentions
          (0-3; a word matches on its first four letters);
        * ``"doc-overlap=k"``: how many distinct content words of the function's
          description the turn mentions (0-4, same matching), and ``"doc-best"`` for the
          offered function(s) whose description the turn mentions most — what the router
          reads in the function list, not what it decides;
        * ``"called-this-turn"``: the function was already called in this turn, and
          ``"repeat-previous"`` when it was the call just made;
        * ``"verb:<previous verb>-><verb>"``: the first word of each name (``get``, ``check``,
          ``display``, ``book``…), so which kind of call follows which pools across the API
          classes whose functions are each seen rarely;
        * ``"word:<w>><candidate>"``, for each word the turn says: which words tend to ask
          for which function (a model that weighs tokens learns it from the train split:
          the logit predictor's fillable top-1 on the test split 0.667 -> 0.712);
        * for :data:`END_OF_TURN`, ``"end-after=n"``: calls made in this turn so far (0-3),
          and ``"word:<w>>end-after=n"`` for each word the turn says (which requests are
          done after n calls: the logit predictor's top-1 0.720 -> 0.744).

        NOTE: the last two measured with ``scripts/predictor_accuracy.py`` (1,024 train, 300
        test requests): multi-turn fillable top-1 / top-3 0.748 / 0.909 without them, 0.773 /
        0.916 with both (``repeat-previous`` alone 0.764, the verbs alone 0.773); single-turn
        0.898 -> 0.904; ``table2``'s Routing c2 captured 0.78 / 0.71 / 0.76 over seeds 0-2
        (0.76 / 0.73 / 0.75 without). A token for the functions called in earlier turns added
        nothing (0.773).
        """
        previous = called_names[-1] if called_names else "<turn start>"
        after = f"verb:{_verb(previous) if called_names else '<turn start>'}->"
        called = set(called_names)
        said = _TurnFeatures.of(record, candidates, turn)
        features = {}
        for c in candidates:
            listed = [f"{previous} -> {c}"]
            if c == END_OF_TURN:
                end = f"end-after={min(len(called_names), 3)}"
                listed.append(end)
                listed.extend(said.crossed(end))
            else:
                listed.extend(said.overlaps[c])
                listed.append(after + _verb(c))
                if c in called:
                    listed.append("called-this-turn")
                    if c == previous:
                        listed.append("repeat-previous")
                listed.extend(said.crossed(c))
            features[c] = listed
        return features

    def _parse_route(self, text: str, outcome: RoutingOutcome) -> list[str]:
        """The record's function names in the router's output; the rest is ignored (and kept).

        NOTE: any function of the record, as BFCL's executor runs any method of the
        record's classes: some ``miss_func`` ground truths call a function before the turn
        that offers it (``multi_turn_miss_func_49`` calls ``tail`` at turn 1 of 3).

        Only parallel records take several names at once: elsewhere the branch is
        single-valued and the first offered name wins.
        """
        names = [n.strip() for n in text.strip().split(",") if n.strip()]
        known = [n for n in names if n in self.record.function_names]
        if not self.record.parallel:
            known = known[:1]
        outcome.ignored_routes.extend(n for n in names if n != END_OF_TURN and n not in known)
        return known

    async def _handle(
        self, ctx: StageContext, name: str, occurrence: int, turn: str, so_far: list,
        history: list, offered: Sequence[str],
    ) -> ExecutedCall:
        values = self.handler_values(name, occurrence, turn, so_far, history, offered)
        call = decision_of(await ctx.llm("handler", values)).strip()
        try:
            value = await ctx.tool("executor", self.executor_values(call))
        except ToolCallError as e:
            # NOTE: as BFCL's harness does, a call that fails (unparseable, unknown function,
            # bad arguments, the API raising) returns its error text to the conversation;
            # the request goes on and its accuracy says whether that was right.
            value = f"Error during execution: {e.__cause__ or e}"
        return ExecutedCall(call, value)

    def router_values(self, functions: Sequence[Mapping[str, Any]],
                      conversation: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The router's input values: the record's workspace, the functions offered and
        the whole conversation so far."""
        # NOTE: the record's frozen schemas themselves, not copies: each keeps its canonical
        # form (a copy would be walked again for every stage's name and digest).
        return {"workspace": self.record.scenario, "functions": list(functions),
                "conversation": list(conversation)}

    def handler_values(
        self, name: str, occurrence: int, turn: str, so_far: Sequence[Mapping[str, Any]],
        history: Sequence[Mapping[str, Any]] = (), offered: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The handler's input values for a call of ``name`` at this point of a turn.

        ``history`` is the conversation before this user turn (earlier turns, their calls
        and results): a handler's call often depends on them ("the file I just created"),
        and two records whose current turns read alike but whose earlier turns differ
        must not render one input. ``offered``: the names of the functions offered at this
        turn (default: all the record's), which the handler sees beside its own function's
        doc — BFCL's ``miss_func`` records hold a function back for a turn, and a handler
        that could not see that would render the base record's input for another task.
        """
        if offered is None:
            offered = self.record.function_names
        return {
            "workspace": self.record.scenario,
            "history": list(history),
            "offered": list(offered),
            "function": self._doc(name),
            "turn": turn,
            "calls": list(so_far),
            "occurrence": occurrence,
        }

    def _doc(self, name: str) -> Mapping[str, Any]:
        doc = self.record.doc(name)
        if doc is None:
            raise KeyError(f"record {self.record.id!r} has no function {name!r}")
        return doc

    def executor_values(self, call: str) -> dict[str, Any]:
        """The executor's input values for a call text.

        The scope names the state the call will run on: the record (single-turn: nothing
        to run on), the shared workspace, or the request's own state by its lineage now —
        two requests whose states have the same lineage render the same executor input.
        """
        scope = self.scope
        if scope is None:
            scope = {"state": dict(self.state.lineage), "classes": list(self.record.classes)}
        return {"call": call, "scope": scope}

    def fill_values(self, coordinate: BranchCoordinate, candidate: str) -> dict[str, Any] | None:
        """The handler values a fill of ``candidate`` at the open branch ``coordinate`` renders.

        ``None`` for :data:`END_OF_TURN`, an unknown function, or a branch not open now.
        Equal to the canonical handler's values when the router picks ``candidate`` alone.
        """
        opened = self._open.get(coordinate)
        if opened is None or candidate not in self.record.function_names:
            return None
        turn, so_far, history, offered = opened
        return self.handler_values(candidate, 0, turn, so_far, history, offered)

    def request_input(self) -> dict[str, Any]:
        r = self.record
        return {"turns": list(r.turns), "functions": [dict(f) for f in r.functions],
                "classes": list(r.classes), "initial_config": dict(r.initial_config)}

    def fillable(self, point: BranchPoint, candidate: str) -> bool:
        return candidate in self.record.function_names

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """Early fill of ``candidate``: its handler, then (if read-only) its executor."""
        values = self.fill_values(point.coordinate, candidate)
        if values is None:
            return
        call = decision_of(await ctx.llm("handler", values)).strip()
        await ctx.tool("executor", self.executor_values(call))

    def tool(self, name: str) -> Tool:
        if name != TOOL_NAME:
            raise KeyError(f"routing requests have one tool, {TOOL_NAME!r}; asked for {name!r}")
        if self._tool is None:
            self._tool = (ApiTool(self.request_id, self.state, self._tool_time)
                          if self.record.multi_turn else SchemaTool(self.record, self._tool_time))
        return self._tool

    # -- replay -------------------------------------------------------------------------------

    def replay_text(self, rendered: RenderedInput) -> str | None:
        """The modelled output of a router or handler stage: reasoning, then the decision."""
        decision = self._replay_decision(rendered)
        return None if decision is None else self.decode.wrap(rendered, decision)

    def _replay_decision(self, rendered: RenderedInput) -> str | None:
        try:
            if rendered.stage == "router":
                return self._replay_router(rendered.fields)
            if rendered.stage == "handler":
                return self._replay_handler(rendered.fields, rendered.input_digest)
        except (KeyError, TypeError, AttributeError, ValueError):
            return None  # an input of a shape the trace never produced
        return None

    def _replay_router(self, fields: Mapping[str, Any]) -> str | None:
        if fields["workspace"] != self.record.scenario:
            return None
        conversation = list(fields["conversation"])
        users = [i for i, m in enumerate(conversation) if m["role"] == "user"]
        t = len(users) - 1
        if not 0 <= t < len(self.record.turns) or [
            conversation[i]["content"] for i in users
        ] != list(self.record.turns[: t + 1]):
            return None
        if list(fields["functions"]) != list(self.record.offered(t)):
            return None
        made = [m["content"] for m in conversation[users[-1] + 1 :] if m["role"] == "assistant"]
        expected, names = list(self.record.recorded[t]), self._names[t]
        if self.record.parallel:
            if not made:
                return ",".join(names) if names else END_OF_TURN
            return END_OF_TURN if sorted(made) == sorted(expected) else None
        if made != expected[: len(made)]:
            return None
        return END_OF_TURN if len(made) == len(expected) else names[len(made)]

    def _replay_handler(self, fields: Mapping[str, Any], digest: str) -> str | None:
        doc = dict(fields["function"])
        name, turn, occurrence = doc["name"], fields["turn"], fields["occurrence"]
        if fields["workspace"] != self.record.scenario or self.record.doc(name) != doc:
            return None
        # the turn is the one after the history's user turns, which must be the record's
        earlier = [m["content"] for m in fields["history"] if m["role"] == "user"]
        t = len(earlier)
        if (t >= len(self.record.turns) or earlier != list(self.record.turns[:t])
                or turn != self.record.request_text(t)
                or list(fields["offered"]) != [f["name"] for f in self.record.offered(t)]):
            return None
        made = [c["call"] for c in fields["calls"]]
        expected, names = list(self.record.recorded[t]), self._names[t]
        if self.record.parallel:
            if made:
                return None
            same = [c for c, n in zip(expected, names, strict=True) if n == name]
            return same[occurrence] if occurrence < len(same) else plausible_call(doc, digest)
        if made != expected[: len(made)]:
            return None
        k = len(made)
        if k < len(expected) and names[k] == name and occurrence == 0:
            return expected[k]
        return plausible_call(doc, digest)

    # -- scoring ------------------------------------------------------------------------------

    def score(self, outcome: RoutingOutcome) -> float:
        if len(outcome.turns) != len(self.record.turns):
            return 0.0
        if self.record.multi_turn:
            return float(self._multi_turn_ok(outcome))
        calls = [c.value for turn in outcome.turns for c in turn]
        if self.record.irrelevance:
            return float(not calls)  # BFCL's relevance runner: right iff no call is made
        if not all(isinstance(c, dict) for c in calls):
            return 0.0  # a call the executor rejected counts, and matches no answer
        docs = {f["name"]: f for f in self.record.functions}
        return float(matches_answers(docs, calls, self.record.possible_answer))

    def _multi_turn_ok(self, outcome: RoutingOutcome) -> bool:
        """BFCL's multi-turn check, turn by turn, against a ground-truth run on fresh instances.

        For every turn whose ground truth makes calls: every instance's public state after
        the turn equals the ground truth's, and the ground truth's results of that turn are
        all among the results the request produced so far (order-free, with multiplicity).
        """
        if self._truth is None:
            self._truth = ground_truth_run(self.record, self._suite)
        truth_results, truth_states = self._truth
        produced: Counter[str] = Counter()
        for t, expected in enumerate(self.record.recorded):
            produced.update(_key(c.value) for c in outcome.turns[t])
            if not expected:
                continue
            if outcome.states[t] != truth_states[t]:
                return False
            if Counter(_key(v) for v in truth_results[t]) - produced:
                return False
        return True


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def ground_truth_run(record: Record, suite: ApiSuite) -> tuple[list[list[Any]], list[dict]]:
    """Run the record's ground-truth calls on fresh instances: per-turn results and states.

    A call that raises yields BFCL's ``"Error during execution: ..."`` text as its result.
    """
    state = ApiState(suite, record.classes, record.initial_config, record.long_context)
    results, states = [], []
    for calls in record.recorded:
        turn = []
        for text in calls:
            try:
                call: ParsedCall = parse_call(text)
                cls, bound = state.bind(call)
                turn.append(state.execute(cls, call, bound))
            except Exception as e:  # NOTE: BFCL records any failure as the result text
                turn.append(to_jsonable(f"Error during execution: {e}"))
        results.append(turn)
        states.append(state.public_state())
    return results, states
