"""One HCI request: an offer, the user's pick after a think time, and the next system turn.

Control flow: ``offer`` (LLM) → the pick branch, inside which the user thinks (``pick``,
a human stage of the request's paired think time) and resolves it with the recorded pick →
``lookup`` (tool) on the picked entry → ``respond`` (LLM). Latency counts from the click.
Early fill (:meth:`HCIRequest.speculate`) runs lookup → respond for a predicted pick
during the think time.

Branch: ``BranchCoordinate("hci", "pick", 0)``; candidates are the menu entries' indices
as text, offered entries first (:attr:`Episode.order`). Evidence is what the user sees and
the system knows at branch time: the service, the menu, the offered entries, the dialogue
including the offer, and per candidate the features a frequency prior counts
(:data:`FEATURES_KEY`) — never the pick.

Replay (:meth:`HCIRequest.replay_text`) is a pure function of the rendered input: the
recorded offer for the recorded offer input; the recorded reply for the recorded pick with
its recorded lookup value; a deterministic plausible reply for any other menu entry (what a
fill of a candidate the user did not pick renders); ``None`` elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynbranch.predictors.frequency import FEATURES_KEY
from dynbranch.workflow import BranchCoordinate, BranchPoint, RenderedInput
from dynbranch.workload import RequestInstance, StageContext, Tool
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


def plausible_reply(pick: str, result: Any) -> str:
    """A deterministic reply about a picked entry (for fills of picks the trace lacks)."""
    entry = result if isinstance(result, Mapping) else (result[0] if result else {})
    facts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(entry.items())[:3])
    return (
        f"Sure, option {int(pick) + 1} it is{': ' + facts if facts else ''}. "
        "Is there anything else I can help you with?"
    )


class HCIRequest(RequestInstance):
    """A request built from one :class:`Episode`, with its service tool and think time."""

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
    ) -> None:
        self.request_id, self.episode, self.db = request_id, episode, db
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
        offer = await ctx.llm("offer", self.offer_values())
        async with ctx.branch(self.branch_point(offer)) as branch:
            await ctx.human("pick", self.pick_values(offer), self.think_s)
            branch.resolve(self.chosen)
        result = await ctx.tool("lookup", self.lookup_values(self.chosen))
        text = await ctx.llm("respond", self.respond_values(self.chosen, result, offer))
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
            "dialogue": self._dialogue(offer),
            FEATURES_KEY: candidate_features(ep),
        }
        return BranchPoint(self.coordinate, self.candidates, evidence=evidence)

    def lookup_values(self, candidate: str) -> dict[str, Any]:
        """The lookup's values when the user picks ``candidate`` (a menu index as text)."""
        return call_fields(
            **self._call(int(candidate)), result=None if self.episode.booking else int(candidate)
        )

    def respond_values(self, candidate: str, result: Any, offer: str) -> dict[str, Any]:
        """The reply's values for a pick of ``candidate`` whose lookup returned ``result``."""
        return {
            "service": self.episode.service,
            "dialogue": self._dialogue(offer),
            "pick": candidate,
            "result": result,
        }

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """Early fill of a pick of ``candidate``: its lookup, then the reply to it (C2).

        Rendered exactly as :meth:`run` renders them when the user picks ``candidate``, from
        branch-time facts only (the offer is the last turn of the branch's evidence). A
        booking lookup is mutating: the fill context refuses it and the fill ends there.
        """
        if point.coordinate != self.coordinate or candidate not in self.candidates:
            return
        offer = point.evidence["dialogue"][-1]["utterance"]
        result = await ctx.tool("lookup", self.lookup_values(candidate))
        await ctx.llm("respond", self.respond_values(candidate, result, offer))

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

    def _dialogue(self, offer: str) -> list[dict[str, str]]:
        return [*(dict(t) for t in self.episode.history), {"speaker": "SYSTEM", "utterance": offer}]

    # -- replay -------------------------------------------------------------------------------

    def replay_text(self, rendered: RenderedInput) -> str | None:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            if rendered.stage == "offer":
                return self.episode.offer if dict(rendered.fields) == self.offer_values() else None
            if rendered.stage == "respond":
                return self._replay_respond(rendered.fields)
        return None  # a stage without text, or an input of a shape the trace never produced

    def _replay_respond(self, fields: Mapping[str, Any]) -> str | None:
        ep = self.episode
        if fields["service"] != ep.service or fields["dialogue"] != self._dialogue(ep.offer):
            return None
        pick, result = fields["pick"], fields["result"]
        if pick not in self.candidates:
            return None
        if pick == self.chosen and result == self._expected:
            return ep.response
        return plausible_reply(pick, result)

    # -- scoring ------------------------------------------------------------------------------

    def score(self, outcome: HCIOutcome) -> float:
        """1.0 when the reply (and the lookup behind it) match the recorded next turn."""
        return float(outcome.response == self.episode.response and outcome.lookup == self._expected)
