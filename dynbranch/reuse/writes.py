"""Writes in progress: which resources are being written right now, and under which receipt.

C1's write protocol has two steps. A mutating stage **announces** the resources it may
write before its effect can be observed (:meth:`WriteMarks.announce` hands back a
:class:`~dynbranch.reuse.lookups.WriteReceipt`); from then on each of them counts as being
written: a lookup of a record that read one misses, and a record that read one is refused.
When the stage's charged time is over it **commits** the versions it left behind (the store
applies them, with their invalidation), which consumes the receipt and lifts the marks. A
failed or aborted write commits whatever the tool really changed (possibly nothing), so
every receipt is consumed exactly once.

Two writes of one resource whose windows overlap are **contended**: their effects may land
in either order while their commits arrive in another, so neither reported version can be
trusted to be the last, and each commits an unknown version instead (every read of the
resource turns stale until a later write, alone in its window, reports one).

Pure bookkeeping, like :class:`~dynbranch.reuse.inflight.InFlight`: no versions, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from dynbranch.errors import TicketError
from dynbranch.reuse.lookups import WriteReceipt


class WriteMarks:
    """Open write receipts, and how many of them mark each resource."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._open: dict[int, WriteReceipt] = {}
        self._marks: dict[str, int] = {}
        self._unbounded = 0  # open receipts that may write any resource
        self._contended: dict[int, set[str]] = {}  # receipt id -> resources another shared
        self._contended_all: set[int] = set()  # receipts that shared every resource

    def __len__(self) -> int:
        return len(self._open)

    def __bool__(self) -> bool:
        return bool(self._open)

    def announce(self, resources: Iterable[str] | None, request_id: str) -> WriteReceipt:
        """Mark ``resources`` (``None``: every resource) as being written; the receipt lifts
        the marks when :meth:`release` consumes it."""
        names = None if resources is None else frozenset(resources)
        receipt = WriteReceipt(next(self._ids), names, request_id)
        for other in self._open.values():
            if names is None and other.resources is None:
                self._contended_all.update((receipt.receipt_id, other.receipt_id))
                continue
            shared = (
                other.resources
                if names is None
                else names
                if other.resources is None
                else names & other.resources
            )
            for rid in (receipt.receipt_id, other.receipt_id):
                self._contended.setdefault(rid, set()).update(shared)
        self._open[receipt.receipt_id] = receipt
        if names is None:
            self._unbounded += 1
        else:
            for resource in names:
                self._marks[resource] = self._marks.get(resource, 0) + 1
        return receipt

    def check(self, receipt: WriteReceipt) -> None:
        """Raise :class:`TicketError` unless ``receipt`` is open here."""
        if self._open.get(receipt.receipt_id) != receipt:
            raise TicketError(
                f"write receipt {receipt.receipt_id} of {receipt.request_id} "
                "is not open (committed twice, or announced elsewhere)"
            )

    def release(self, receipt: WriteReceipt) -> None:
        """Consume ``receipt`` and lift its marks; raises :class:`TicketError` if not open."""
        self.check(receipt)
        del self._open[receipt.receipt_id]
        self._contended.pop(receipt.receipt_id, None)
        self._contended_all.discard(receipt.receipt_id)
        if receipt.resources is None:
            self._unbounded -= 1
            return
        for resource in receipt.resources:
            left = self._marks[resource] - 1
            if left:
                self._marks[resource] = left
            else:
                del self._marks[resource]

    def contend(self, resource: str) -> None:
        """A write of ``resource`` outside any receipt: the open ones covering it are
        contended on it."""
        for receipt in self._open.values():
            if receipt.covers(resource):
                self._contended.setdefault(receipt.receipt_id, set()).add(resource)

    def contended(self, receipt: WriteReceipt, resource: str) -> bool:
        """Whether another write of ``resource`` overlapped ``receipt``'s window."""
        return receipt.receipt_id in self._contended_all or resource in self._contended.get(
            receipt.receipt_id, ()
        )

    def writing(self, resources: Iterable[str]) -> list[str]:
        """The resources of ``resources`` that are being written now."""
        if not self._open:
            return []
        if self._unbounded:
            return list(resources)
        return [r for r in resources if r in self._marks]
