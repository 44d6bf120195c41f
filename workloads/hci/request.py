"""One HCI request: an offer, the user's pick after a think time, and the next system turn.

Control flow: ``offer`` (LLM) → the pick branch, inside which the user thinks (``pick``,
a human stage of the request's paired think time) and resolves it with the recorded pick →
``lookup`` (tool) on the picked entry → ``respond`` (LLM) on the pick, the lookup's value
and the user's pick-turn utterance. Latency counts from the click.

Early fill (:meth:`HCIRequest.speculate`) runs, for a predicted pick during the think time,
what does not read the utterance: the lookup and, with ``prefix_warmup``,
``respond_prefix``, a one-token warm-up whose prompt is ``respond``'s prompt up to the
utterance, so a prefix-caching engine holds that prefix when the canonical reply arrives. ``respond`` itself is never filled: its input
names the utterance, which no branch-time evidence holds, so a fill cannot render its
reuse name (value equivalence: the reply's value comes only from its own execution).

Branch: ``BranchCoordinate("hci", "pick", 0)``; candidates are the menu entries' indices
as text, offered entries first (:attr:`Episode.order`). Evidence is what the user sees and
the system knows at branch time: the service, the menu, the offered entries, the dialogue
including the offer, and per candidate the features a frequency prior counts
(:data:`FEATURES_KEY`) — never the pick, never the utterance.

Replay (:meth:`HCIRequest.replay_text`) is a pure function of the rendered input: the
recorded offer for the recorded offer input, and the recorded reply for the recorded pick,
lookup value and utterance, each wrapped in the reasoning the request's decode model gives
that input (:mod:`workloads.hci.decode`); an empty warm-up output for the known prefix of
any candidate; ``None`` elsewhere (an input the trace never produced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynbranch.decode_lengths import DecodeModel, decision_of
from dynbranch.predictors.frequency import FEATURES_KEY
from dynbranch.workflow import BranchCoordinate, BranchPoint, RenderedInput
from dynbranch.workload import RequestInstance, StageContext, Tool
from workloads.hci.decode import HCI_DECODE
from workloads.hci.episodes import Episode, booking_call
from workloads.hci.services import TOOL_NAME, ServiceDB, ServiceTool, ServiceVersions, call_fields
from workloads.hci.template import PICK_STEP, TEMPLATE, WORKFLOW
from workloads.hci.thinktime import ThinkTime


@dataclass(frozen=True)
class HCIOutcome:
    """What :meth:`HCIRequest.run` returns and :meth:`HCIRequest.score` reads."""

    pair_id: str
    pick: str
    lookup: Any
    response: str


def candidate_features(episode: Episode) -> dict[str, list[str]]:
    """Per candidate, what a frequency prior may count besides the candidate itself.

    ``offered`` / ``not-offered``; ``offset:k``, its position in candidate order (0 = the
    first offered entry), also per service; and ``value:<service>:<slot>=<value>``, the
    entry's value of the slot the offer names entries by (the entity, e.g. a restaurant).
    """
    out = {}
    for pos, i in enumerate(episode.order):
        entry = episode.menu[i]
        value = entry.get(episode.offer_slot, "")
        out[str(i)] = [
            "offered" if i in episode.offered else "not-offered",
            f"offset:{pos}",
            f"{episode.service}:offset:{pos}",
            f"value:{episode.service}:{episode.offer_slot}={value.strip().casefold()}",
        ]
    return out


class HCIRequest(RequestInstance):
    """A request built from one :class:`Episode`, with its service tool and think time.

    ``decode`` is what its LLM stages decode around the recorded text
    (:data:`~workloads.hci.decode.HCI_DECODE`, or
    :data:`~dynbranch.decode_lengths.RECORDED` for the trace's text alone);
    ``prefix_warmup`` whether a fill runs ``respond_prefix`` after its lookup.

    NOTE: the warm-up is off by default because it does not pay here (measured with
    ``scripts/hci_measure.py``): ``respond``'s prompt extends ``offer``'s, so the home
    engine already caches ~78 % of it and a warm-up could take over ~4 ms of prefill; and
    session affinity places fills off home, where a warm-up caches nothing the reply uses
    and adds prefill contention (+1.8 % mean latency with ungated fills at 1 req/s).
    """

    template = TEMPLATE
    latency_origin = "last_human"

    def __init__(
        self,
        request_id: str,
        episode: Episode,
        db: ServiceDB,
        versions: ServiceVersions,
        seed: int,
        think: ThinkTime | None = None,
        tool_time: str = "modelled",
        decode: DecodeModel = HCI_DECODE,
        prefix_warmup: bool = False,
    ) -> None:
        self.request_id, self.episode, self.db, self.decode = request_id, episode, db, decode
        self.prefix_warmup = prefix_warmup
        self.candidates = tuple(str(i) for i in episode.order)
        self.chosen = str(episode.pick)  # the recorded pick: resolves the branch, never evidence
        self.think_s = (think or ThinkTime()).seconds(seed, request_id, episode.turn)
        self.coordinate = BranchCoordinate(WORKFLOW, "pick", PICK_STEP)
        self._tool = ServiceTool(db, versions, tool_time)
        intent = db.intent(episode.service, episode.menu_call.method)
        self._parameters = intent.parameters if intent is not None else frozenset()
        self._expected = db.results(**self._call(episode.pick))
        if not episode.booking:
            self._expected = self._expected[episode.pick]

    # -- control flow -------------------------------------------------------------------------

    async def run(self, ctx: StageContext) -> HCIOutcome:
        # NOTE: a turn's reasoning never enters the conversation (Qwen3's chat template drops
        # earlier turns' thinking): later inputs read only the decision.
        offer = decision_of(await ctx.llm("offer", self.offer_values()))
        async with ctx.branch(self.branch_point(offer)) as branch:
            await ctx.human("pick", self.pick_values(offer), self.think_s)
            branch.resolve(self.chosen)
        # The click reveals the pick and what the user said with it, together.
        utterance = self.episode.utterance
        result = await ctx.tool("lookup", self.lookup_values(self.chosen))
        values = self.respond_values(self.chosen, result, offer, utterance)
        text = decision_of(await ctx.llm("respond", values))
        return HCIOutcome(self.episode.pair_id, self.chosen, result, text)

    def offer_values(self) -> dict[str, Any]:
        ep = self.episode
        return {
            "service": ep.service,
            "dialogue": [dict(t) for t in ep.history],
            "menu": [dict(e) for e in ep.menu],
        }

    def pick_values(self, offer: str) -> dict[str, Any]:
        return {"offer": offer, "menu": [dict(e) for e in self.episode.menu]}

    def branch_point(self, offer: str) -> BranchPoint:
        """The pick branch as it opens after ``offer`` (evidence: branch-time facts only)."""
        ep = self.episode
        evidence = {
            "service": ep.service,
            "menu": [dict(e) for e in ep.menu],
            "offered": [str(i) for i in ep.offered],
            "offer_slot": ep.offer_slot,
            "dialogue": [
                *self.offer_values()["dialogue"],
                {"speaker": "SYSTEM", "utterance": offer},
            ],
            FEATURES_KEY: candidate_features(ep),
        }
        return BranchPoint(self.coordinate, self.candidates, evidence=evidence)

    def lookup_values(self, candidate: str) -> dict[str, Any]:
        """The lookup's values when the user picks ``candidate`` (a menu index as text)."""
        return call_fields(
            **self._call(int(candidate)), result=None if self.episode.booking else int(candidate)
        )

    def prefix_values(self, candidate: str, result: Any, offer: str) -> dict[str, Any]:
        """What the reply to a pick of ``candidate`` reads that is known before the click:
        the conversation up to the offer, the pick and its lookup's ``result``."""
        return {**self.offer_values(), "offer": offer, "pick": candidate, "result": result}

    def respond_values(
        self, candidate: str, result: Any, offer: str, utterance: str
    ) -> dict[str, Any]:
        """The reply's values: :meth:`prefix_values` and, last, the user's ``utterance``."""
        return {**self.prefix_values(candidate, result, offer), "utterance": utterance}

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """Early fill of a pick of ``candidate``: its lookup, then the reply's prefix warm-up.

        Rendered exactly as :meth:`run` renders them when the user picks ``candidate``, from
        branch-time facts only (the offer is the last turn of the branch's evidence). The
        reply itself reads the utterance, unknown here, so it is never filled. A booking
        lookup is mutating: the fill context refuses it and the fill ends there.
        """
        if point.coordinate != self.coordinate or candidate not in self.candidates:
            return
        offer = point.evidence["dialogue"][-1]["utterance"]
        result = await ctx.tool("lookup", self.lookup_values(candidate))
        if self.prefix_warmup:
            await ctx.llm("respond_prefix", self.prefix_values(candidate, result, offer))

    def tool(self, name: str) -> Tool:
        if name != TOOL_NAME:
            raise KeyError(f"hci requests have one tool, {TOOL_NAME!r}; asked for {name!r}")
        return self._tool

    def _call(self, index: int) -> dict[str, Any]:
        ep = self.episode
        call = (
            booking_call(ep.menu_call, ep.menu[index], self._parameters)
            if ep.booking
            else ep.menu_call
        )
        return {"call": call, "session": ep.dialogue_id if self.db.needs_session(call) else None}

    # -- replay -------------------------------------------------------------------------------

    def replay_text(self, rendered: RenderedInput) -> str | None:
        text = None
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            if rendered.stage == "offer" and dict(rendered.fields) == self.offer_values():
                text = self.episode.offer
            elif rendered.stage == "respond":
                text = self._replay_respond(rendered.fields)
            elif rendered.stage == "respond_prefix" and self._known_prefix(rendered.fields):
                return ""  # a warm-up: one end-of-turn token, read by nobody
        # None: a stage without text, or an input of a shape the trace never produced
        return None if text is None else self.decode.wrap(rendered, text)

    def _known_prefix(self, fields: Mapping[str, Any]) -> bool:
        ep = self.episode
        return (
            {k: fields[k] for k in self.offer_values()} == self.offer_values()
            and fields["offer"] == ep.offer
            and fields["pick"] in self.candidates
        )

    def _replay_respond(self, fields: Mapping[str, Any]) -> str | None:
        ep = self.episode
        recorded = (
            self._known_prefix(fields)
            and fields["pick"] == self.chosen
            and fields["result"] == self._expected
            and fields["utterance"] == ep.utterance
        )
        return ep.response if recorded else None

    # -- scoring ------------------------------------------------------------------------------

    def score(self, outcome: HCIOutcome) -> float:
        """1.0 when the reply (and the lookup behind it) match the recorded next turn."""
        return float(outcome.response == self.episode.response and outcome.lookup == self._expected)
