"""Atomic KV reservations for fills: a ledger that hands out receipts and takes them back.

A fill may start only with a :class:`Reservation` for the KV blocks it will allocate; the
ledger never lets the reserved total exceed its capacity (a reservation that does not fit
is refused whole, never granted in part). Releasing consumes the receipt: releasing the
same receipt again is a harmless no-op, while a receipt the ledger did not issue in that
form (another ledger's, a forged or edited copy) is an error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynbranch.errors import DynBranchError

RECENTLY_RELEASED = 4096
"""Released receipts remembered to catch a *different* receipt released under their id."""


class ReservationError(DynBranchError):
    """A receipt released that this ledger did not issue in that form."""


@dataclass(frozen=True)
class Reservation:
    """The receipt for ``blocks`` KV blocks reserved for one fill."""

    ledger: str
    reservation_id: int
    coordinate: str
    candidate: str
    blocks: int
    reserved_at: float


class KvLedger:
    """Speculative KV blocks reserved against a fixed capacity."""

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"ledger capacity must be >= 0 blocks, got {capacity}")
        self.name, self.capacity = name, capacity
        self.reserved = 0
        self._next_id = 0
        self._outstanding: dict[int, Reservation] = {}
        self._released: OrderedDict[int, Reservation] = OrderedDict()
        # NOTE: each released receipt's state row, and that row encoded (encode_rows_with),
        # built once when it is released, in the order of _released: the gate actor writes
        # all of them in every snapshot, and no call is answered while it builds one
        self._rows: dict[int, list[Any]] = {}
        self._encoded: dict[int, Any] = {}
        self._encode: Callable[[list[Any]], Any] | None = None

    @property
    def free(self) -> int:
        return self.capacity - self.reserved

    @property
    def held(self) -> int:
        """How many receipts are outstanding."""
        return len(self._outstanding)

    @property
    def outstanding(self) -> list[Reservation]:
        """Receipts not yet released, oldest first."""
        return list(self._outstanding.values())

    def try_reserve(
        self, coordinate: str, candidate: str, blocks: int, now: float
    ) -> Reservation | None:
        """Reserve ``blocks`` blocks, or return None (and reserve nothing) if they do not fit."""
        if blocks < 0:
            raise ValueError(f"cannot reserve {blocks} blocks for {candidate!r}")
        if blocks > self.free:
            return None
        receipt = Reservation(self.name, self._next_id, coordinate, candidate, blocks, now)
        self._next_id += 1
        self._outstanding[receipt.reservation_id] = receipt
        self.reserved += blocks
        return receipt

    def release(self, receipt: Reservation) -> bool:
        """Free the receipt's blocks; True if they were held, False if already released."""
        rid = receipt.reservation_id
        if receipt.ledger != self.name or not 0 <= rid < self._next_id:
            raise ReservationError(
                f"ledger {self.name!r} never issued reservation {rid} "
                f"(receipt from ledger {receipt.ledger!r})"
            )
        held = self._outstanding.get(rid)
        if held is None:
            earlier = self._released.get(rid)
            if earlier is not None and earlier != receipt:
                raise ReservationError(
                    f"reservation {rid} was released as {earlier}, not {receipt}"
                )
            return False  # NOTE: idempotent: a fill ending twice must not free blocks twice
        if held != receipt:
            raise ReservationError(f"reservation {rid} is {held}, not {receipt}")
        del self._outstanding[rid]
        self.reserved -= receipt.blocks
        self._remember(receipt)
        return True

    def _remember(self, receipt: Reservation) -> None:
        rid = receipt.reservation_id
        self._released[rid] = receipt
        self._rows[rid] = row = _row(receipt)
        if self._encode is not None:
            self._encoded[rid] = self._encode(row)
        if len(self._released) > RECENTLY_RELEASED:
            oldest, _ = self._released.popitem(last=False)
            del self._rows[oldest]
            self._encoded.pop(oldest, None)

    # -- serialisation ---------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """The ledger as plain data; each receipt a row ``[id, coordinate, candidate, blocks,
        reserved_at]`` (every receipt it holds or remembers is its own, so its name once).

        NOTE: rows, not dictionaries: the gate actor's snapshot holds up to
        :data:`RECENTLY_RELEASED` released receipts, and as ``asdict`` dictionaries they
        took half of a snapshot's time, during which the actor answers no call. The released
        rows are the ones :meth:`release` built, shared with the ledger (not to be edited):
        building them here took 0.5 ms of a 3.9 ms snapshot (and see
        :meth:`encode_rows_with`).
        """
        return {
            "name": self.name,
            "capacity": self.capacity,
            "next_id": self._next_id,
            "outstanding": [_row(r) for r in self._outstanding.values()],
            "released": list(self._rows.values()),
        }

    def encode_rows_with(self, encode: Callable[[list[Any]], Any]) -> None:
        """Keep each released receipt's state row also as ``encode`` makes it, from now on
        and for those remembered already (:meth:`encoded_released`).

        NOTE: for the gate actor, whose snapshot writes every remembered receipt: encoding
        each once, as it is released, leaves a snapshot only the encoded rows to join, where
        packing 4,096 rows took 0.6 ms while no call was answered. ``encode`` must be pure
        (a row is encoded once, and never again if it does not change).
        """
        self._encode = encode
        self._encoded = {rid: encode(row) for rid, row in self._rows.items()}

    def encoded_released(self) -> list[Any]:
        """The released rows of :meth:`to_state`, in its order, as :meth:`encode_rows_with`'s
        ``encode`` made them."""
        if self._encode is None:
            raise RuntimeError("encoded_released() needs encode_rows_with() first")
        return list(self._encoded.values())

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> KvLedger:
        name = state["name"]
        ledger = cls(name, state["capacity"])
        ledger._next_id = state["next_id"]
        for r in state["outstanding"]:
            receipt = _receipt(name, r)
            ledger._outstanding[receipt.reservation_id] = receipt
            ledger.reserved += receipt.blocks
        for r in state["released"]:
            ledger._remember(_receipt(name, r))
        return ledger


def _row(r: Reservation) -> list[Any]:
    return [r.reservation_id, r.coordinate, r.candidate, r.blocks, r.reserved_at]


def _receipt(ledger: str, row: list[Any] | dict[str, Any]) -> Reservation:
    """The receipt of a :func:`_row` (or of the dictionary earlier states kept)."""
    if isinstance(row, dict):
        return Reservation(**row)
    return Reservation(ledger, *row)
