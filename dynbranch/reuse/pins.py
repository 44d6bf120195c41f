"""Pins: which stored records must not be evicted right now, under which receipts.

Pure bookkeeping, like :class:`~dynbranch.reuse.inflight.InFlight`: the store checks that a
record exists before pinning it and forgets a record's pins when the record leaves.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from dynbranch.reuse.lookups import PinReceipt


class Pins:
    """Open pin receipts, by the name they protect."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._held: dict[str, set[int]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._held

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def pin(self, name: str) -> PinReceipt:
        """A receipt protecting ``name`` until :meth:`unpin` consumes it."""
        receipt = PinReceipt(next(self._ids), name)
        self._held.setdefault(name, set()).add(receipt.receipt_id)
        return receipt

    def unpin(self, receipt: PinReceipt) -> bool:
        """Release ``receipt``; ``False`` if it was released, or its name forgotten, already."""
        held = self._held.get(receipt.name)
        if not held or receipt.receipt_id not in held:
            return False
        held.discard(receipt.receipt_id)
        if not held:
            del self._held[receipt.name]
        return True

    def forget(self, name: str) -> None:
        """``name`` left the store: its pins are void."""
        self._held.pop(name, None)
