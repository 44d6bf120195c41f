"""Which SGD offer pairs become HCI requests, and what each one's menu, pick and next turn are.

An **episode** is one dialogue segment around an offer: the system offers entries of a
**menu** (the ``service_results`` of the latest call of that service, from the raw dialogue),
the user picks one, and the next system turn looks it up and replies. Only dev pairs of the
raw files (dev 001–011) can be joined with full menus; of those, a pair is **usable** when

1. it offers entries (``OFFER``), not a new intent (``OFFER_INTENT``), from a non-empty menu,
   and the offered entries are on that menu (:func:`offered_indices`);
2. the next turn is a SYSTEM turn with a frame of the same service (the reply to replay);
3. the user's turn resolves to exactly one menu entry, the **pick**:

   * ``select`` — ``SELECT`` naming a slot value: the menu entry with that value;
   * ``accept`` — ``SELECT``, ``AFFIRM``, ``AFFIRM_INTENT`` or ``REQUEST`` (asking about the
     offer) when exactly one entry was offered: that entry;
   * ``alternative`` — ``REQUEST_ALTS`` with no new constraint, when the next turn offers
     exactly one other entry of the same menu without a new call: that entry (asking for
     another option is modelled as a click on the entry the assistant shows next);

   and is unusable when it declines (``NEGATE``), starts a new search (``INFORM`` with
   ``REQUEST_ALTS``, or a next turn that calls the service anew) or names no single entry;
4. the next turn's service work follows from the pick alone (the **lookup**):

   * the menu came from a search (a non-transactional method): the lookup reads the picked
     entry's details — the menu's own call with ``result`` = the pick (read-only);
   * the menu came from a transactional call that offered an alternative (a failed
     booking): the lookup is the booking of the picked entry, the same method with the
     entry's values for the method's slots; usable only when the next turn makes exactly
     that call (it is mutating: it bumps the service's version);

5. the service database has one recorded answer for the lookup (per session if needed).

The user's pick-turn **utterance** is an input of the next turn: it often asks or tells
something beyond the pick ("Is it furnished?" → "No, it is not furnished."), and the
recorded reply answers it. It is known only after the click, never at branch time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workloads.hci.services import ServiceDB
from workloads.hci.sgd_data import (
    Action,
    Call,
    Dialogue,
    Frame,
    Pair,
    SGDData,
    best_match,
    latest_call,
    same,
)

ACCEPT_ACTS = frozenset({"SELECT", "AFFIRM", "AFFIRM_INTENT", "REQUEST"})
DECLINE_ACTS = frozenset({"NEGATE", "NEGATE_INTENT"})
KINDS = ("accept", "select", "alternative", "booking")


@dataclass(frozen=True)
class Episode:
    """One usable offer → pick → next-turn segment of a dialogue."""

    pair_id: str
    dialogue_id: str
    service: str
    turn: int  # index of the user's turn (the pick) in the dialogue
    history: tuple[Mapping[str, str], ...]  # turns before the offer: speaker, utterance
    offer: str  # the recorded offer utterance
    menu_call: Call
    menu: tuple[Mapping[str, str], ...]
    offered: tuple[int, ...]  # menu indices the offer names, in the offer's order
    offer_slot: str  # the slot the offer names its entries by (e.g. restaurant_name)
    pick: int  # the menu index the user picked (ground truth, never evidence)
    kind: str  # one of KINDS
    booking: bool  # the lookup books the picked entry (mutating) instead of reading it
    response: str  # the recorded next system utterance
    utterance: str  # the user's pick-turn utterance (known after the click, never evidence)

    @property
    def order(self) -> tuple[int, ...]:
        """Menu indices in candidate order: offered first, then the rest from after the offer.

        NOTE: entries before the offered ones were (in SGD) usually shown and passed over
        earlier in the dialogue, so they come last; ties in a predictor keep this order.
        """
        n, last = len(self.menu), self.offered[-1]
        rest = [(last + 1 + k) % n for k in range(n)]
        return (*self.offered, *(i for i in rest if i not in self.offered))


@dataclass(frozen=True)
class Usability:
    """How many pairs each rule kept or dropped, per split."""

    counts: Mapping[tuple[str, str], int]  # (split, reason or "usable") -> pairs

    def usable(self, split: str) -> int:
        return self.counts.get((split, "usable"), 0)

    def table(self) -> list[tuple[str, int, int]]:
        """Rows (reason, train, test), usable first."""
        reasons = sorted({r for _, r in self.counts}, key=lambda r: (r != "usable", r))
        return [
            (r, self.counts.get(("train", r), 0), self.counts.get(("test", r), 0)) for r in reasons
        ]


def offered_indices(menu: Sequence[Mapping[str, str]], acts: Sequence[Action]) -> tuple[int, ...]:
    """The menu entries an offer names, in its order.

    An ``OFFER`` with several values of one slot names one entry per value (the first entry
    with that value); otherwise the offer names the entry that matches most of its slot
    values (:func:`~workloads.hci.sgd_data.best_match`), or none.
    """
    multi = [a for a in acts if a.act == "OFFER" and len(a.values) > 1]
    if not multi:
        best = best_match(menu, acts)
        return () if best is None else (best,)
    out: list[int] = []
    for a in multi:
        for v in a.values:
            hit = next((i for i, e in enumerate(menu) if a.slot in e and same(v, e[a.slot])), None)
            if hit is not None and hit not in out:
                out.append(hit)
    return tuple(out)


def booking_call(menu_call: Call, entry: Mapping[str, str], parameters: frozenset[str]) -> Call:
    """The booking of ``entry`` with the menu's transactional method: its slots from the entry."""
    return Call(
        menu_call.service, menu_call.method, {k: v for k, v in entry.items() if k in parameters}
    )


def classify(pair: Pair, data: SGDData, db: ServiceDB) -> Episode | str:
    """The pair's episode, or the reason it is unusable (the rules of the module docstring)."""
    if pair.offers_intent:
        return "offers an intent"
    dialogue = data.dialogues[pair.dialogue_id]
    frame = _menu_frame(dialogue, pair)
    if frame is None:
        return "no menu"
    menu = frame.results
    offered = offered_indices(menu, pair.offer_acts)
    if not offered:
        return "offer not on the menu"
    nxt = dialogue.turns[pair.user_turn + 1] if pair.user_turn + 1 < len(dialogue.turns) else None
    reply = nxt.frame(pair.service) if nxt is not None and nxt.speaker == "SYSTEM" else None
    if reply is None:
        return "no next system turn for the service"
    picked = _pick(pair, menu, offered, reply)
    if isinstance(picked, str):
        return picked
    pick, kind = picked
    intent = db.intent(pair.service, frame.call.method)
    booking = intent.transactional
    if booking:
        if reply.call != booking_call(frame.call, menu[pick], intent.parameters):
            return "booking alternative not booked next"
        kind = "booking"
    lookup = booking_call(frame.call, menu[pick], intent.parameters) if booking else frame.call
    if not db.answers(lookup, pair.dialogue_id):
        return "no single recorded answer"
    offer_slot = next(a.slot for a in pair.offer_acts if a.act == "OFFER")
    history = tuple(
        {"speaker": t.speaker, "utterance": t.utterance} for t in dialogue.turns[: pair.system_turn]
    )
    return Episode(
        pair.id,
        pair.dialogue_id,
        pair.service,
        pair.user_turn,
        history,
        pair.system_utterance,
        frame.call,
        menu,
        offered,
        offer_slot,
        pick,
        kind,
        booking,
        nxt.utterance,
        pair.user_utterance,
    )


def classify_all(data: SGDData, db: ServiceDB) -> list[tuple[Pair, Episode | str]]:
    """Every joined pair (file order) with its episode or the reason it is unusable."""
    return [(pair, classify(pair, data, db)) for pair in data.joined()]


def _menu_frame(dialogue: Dialogue, pair: Pair) -> Frame | None:
    frame = latest_call(dialogue, pair.service, pair.system_turn)
    return frame if frame is not None and frame.results else None


def _pick(
    pair: Pair, menu: Sequence[Mapping[str, str]], offered: tuple[int, ...], reply: Frame
) -> tuple[int, str] | str:
    acts = {a.act for a in pair.user_actions}
    if acts & DECLINE_ACTS:
        return "declined"
    if "REQUEST_ALTS" in acts:
        if "INFORM" in acts or reply.call is not None:
            return "new search"
        shown = [i for i in offered_indices(menu, reply.actions) if i not in offered]
        return (shown[0], "alternative") if len(shown) == 1 else "alternative not one menu entry"
    for a in pair.user_actions:
        if a.act == "SELECT" and a.slot and a.values:
            hits = {
                i
                for i, e in enumerate(menu)
                if a.slot in e and any(same(v, e[a.slot]) for v in a.values)
            }
            return (hits.pop(), "select") if len(hits) == 1 else "selected value not one entry"
    if not acts & ACCEPT_ACTS:
        return "no pick"
    return (offered[0], "accept") if len(offered) == 1 else "pick among several offered"
