"""The gate actor's wire and journal rows: compact, JSON-able lists.

Every call that crosses the actor boundary or enters the journal is written with these
functions, and read back with their inverses, so a replayed journal entry and a live call
decode to the same objects. :func:`dumps` is the one JSON encoder of the checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

from dynbranch.gate import (
    Admission,
    BranchReturn,
    Candidate,
    FillShape,
    GenerationDecision,
    Observation,
    Reservation,
    Settlement,
)
from dynbranch.gate.client import BranchDecision


def encode_observation(o: Observation) -> list:
    """A learning observation as a row."""
    return [o.stage_key, o.rank, o.selected, o.usable, o.confidence]


def decode_observation(row: list) -> Observation:
    """The inverse of :func:`encode_observation`."""
    return Observation(*row)


def encode_candidate(c: Candidate) -> list:
    """A candidate as a row (its shape flattened)."""
    s = c.shape
    return [
        c.name,
        c.rank,
        c.stage_key,
        c.gain_ms,
        [s.prompt_tokens, s.output_tokens, s.context_tokens],
        c.kv_blocks,
        c.confidence,
    ]


def decode_candidate(row: list) -> Candidate:
    """The inverse of :func:`encode_candidate`."""
    name, rank, stage_key, gain_ms, shape, kv_blocks, *confidence = row  # NOTE: older journals
    return Candidate(name, rank, stage_key, gain_ms, FillShape(*shape), kv_blocks, *confidence)


def encode_receipt(r: Reservation) -> list:
    """A reservation receipt as a row (:class:`Reservation` takes it back positionally)."""
    return [r.ledger, r.reservation_id, r.coordinate, r.candidate, r.blocks, r.reserved_at]


def decode_receipt(row: list) -> Reservation:
    """The inverse of :func:`encode_receipt`."""
    return Reservation(*row)


def encode_admission(a: Admission) -> list:
    """An admission as a row, its receipt (if any) last."""
    receipt = None if a.reservation is None else encode_receipt(a.reservation)
    return [
        a.candidate,
        a.rank,
        a.p_tilde,
        a.p_sel,
        a.p_use,
        a.gain_ms,
        a.price_ms,
        a.utility_ms,
        a.reason,
        a.audit,
        a.bounded,
        receipt,
    ]


def decode_admission(row: list) -> Admission:
    """The inverse of :func:`encode_admission`."""
    *values, bounded, receipt = row
    return Admission(*values, reservation=None if receipt is None else decode_receipt(receipt),
                     bounded=bounded)


def encode_settlement(s: Settlement) -> list:
    """One settled branch return as a row."""
    r = s.ret
    return [s.coordinate, [r.saved_ms, r.setup_ms, r.fill_cost_ms, r.wait_ms]]


def decode_settlement(row: list) -> Settlement:
    """The inverse of :func:`encode_settlement`."""
    coordinate, values = row
    return Settlement(coordinate, BranchReturn(*values))


def journal_args(method: str, args: tuple) -> list:
    """A gate call's arguments (as the client passes them) as ``[call_id, journal rows]``:
    what the actor journals and runs, and what a stream lane carries."""
    if method == "generation":  # (call_id, coordinate, now)
        return [args[0], [args[1], args[2]]]
    if method == "admit":  # (call_id, coordinate, candidates, view, now)
        call_id, coordinate, candidates, view, now = args
        return [call_id, [coordinate, [encode_candidate(c) for c in candidates],
                          list(view.as_tuple()), now]]
    if method == "decide":  # (call_id, coordinate, rows, view tuple, now)
        call_id, coordinate, rows, view, now = args
        return [call_id, [coordinate, list(rows), list(view), now]]
    if method == "release":  # (reservations,)
        return [None, [[encode_receipt(r) for r in args[0]]]]
    if method == "learn":  # (call_id, observations, settlements)
        call_id, observations, settlements = args
        return [call_id, [[encode_observation(o) for o in observations],
                          [encode_settlement(s) for s in settlements]]]
    if method == "abandon":  # (call_ids,)
        return [None, [list(args[0])]]
    raise ValueError(f"{method!r} does not go through the gate lane")


def encode_reply(kind: str, reply: Any) -> Any:
    """A remembered call reply as a row (``generation``, ``admit`` and ``decide`` carry one)."""
    if kind == "generation":
        return [reply.open, reply.estimate, reply.audit]
    if kind == "admit":
        return [encode_admission(a) for a in reply]
    if kind == "decide":
        return [
            encode_reply("generation", reply.generation),
            encode_reply("admit", reply.admissions),
        ]
    return None


def decode_reply(kind: str, row: Any) -> Any:
    """The inverse of :func:`encode_reply` (an abandoned id's reply is no admission)."""
    if kind == "generation":
        return GenerationDecision(*row)
    if kind == "admit":
        return [decode_admission(a) for a in row]
    if kind == "decide":
        generation, admissions = row
        return BranchDecision(
            decode_reply("generation", generation), tuple(decode_reply("admit", admissions))
        )
    return [] if kind == "abandoned" else None


def plain(value: Any) -> Any:
    """JSON's and msgpack's fallback: numpy scalars (a virtual clock's ``now``) as Python
    numbers."""
    item = getattr(value, "item", None)
    if item is None:
        raise TypeError(f"cannot encode a {type(value).__name__}")
    return item()


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of a row or a snapshot."""
    return json.dumps(value, separators=(",", ":"), default=plain).encode()
