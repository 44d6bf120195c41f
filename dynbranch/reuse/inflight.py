"""The in-flight registry: which reuse names are being executed right now, and by whom.

Pure bookkeeping with integer ticket ids and no futures: a second executor of a name
*joins* the first (gets its ticket id) instead of running the stage again, and the caller
owns whatever it waits on (see :class:`dynbranch.reuse.joins.Waiters`).
"""

from __future__ import annotations

import itertools

from dynbranch.errors import TicketError
from dynbranch.reuse.lookups import JoinInFlight, Ticket


class InFlight:
    """Open tickets by id, and the registered one of each name."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._by_name: dict[str, Ticket] = {}
        self._open: dict[int, Ticket] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        """The names with a registered execution."""
        return list(self._by_name)

    def get(self, name: str) -> Ticket | None:
        """The registered ticket executing ``name``, if any."""
        return self._by_name.get(name)

    def begin(self, name: str, key_bytes: bytes, request_id: str) -> Ticket | JoinInFlight:
        """A ticket to execute ``name``, or the execution of an equal key to join.

        NOTE: when another key holds the name (a collision) the caller still gets a ticket,
        unregistered: it must execute, and nobody can join it by that name.
        """
        held = self._by_name.get(name)
        if held is not None and held.key_bytes == key_bytes:
            return JoinInFlight(held.ticket_id, name, held.request_id)
        ticket = Ticket(next(self._ids), name, key_bytes, request_id, registered=held is None)
        if ticket.registered:
            self._by_name[name] = ticket
        self._open[ticket.ticket_id] = ticket
        return ticket

    def finish(self, ticket: Ticket) -> None:
        """Close ``ticket``; raises :class:`TicketError` if it is not open.

        NOTE: the open ticket of that id must be this one (same name, key and request): a
        restarted store shard numbers its tickets from 1 again, and a ticket of its previous
        incarnation that reaches it must be refused, not close another request's ticket.
        """
        held = self._open.get(ticket.ticket_id)
        if held is None or held != ticket:
            raise TicketError(f"ticket {ticket.ticket_id} for {ticket.name[:16]} is not open")
        del self._open[ticket.ticket_id]
        if ticket.registered:
            del self._by_name[ticket.name]

    def is_open(self, ticket: Ticket) -> bool:
        return ticket.ticket_id in self._open
