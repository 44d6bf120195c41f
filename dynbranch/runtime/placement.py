"""Placement policies: which engine of a role serves a call.

A policy is a small object that picks an index from the engines' outstanding-call counts
(kept by the pool, so picking costs no round trip to the engines): for a fill all their open
calls, for a canonical call their open canonical calls plus each open fill at the pool's
weight (half a call by default; :data:`dynbranch.runtime.pool.FILL_LOAD` says what other
weights did), so a count may be fractional. Arms choose a policy by name; cache-aware arms
add their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial

from dynbranch.engines.protocol import CANONICAL, GenerateRequest

Noting = Callable[[int], None]
"""What a policy notes of a call it placed, given the engine the call was sent to."""


class PlacementPolicy(ABC):
    """Chooses an engine for a call."""

    name: str

    @abstractmethod
    def choose(self, outstanding: Sequence[float], request: GenerateRequest) -> int:
        """Index of the engine to send ``request`` to, given each engine's open calls (and
        what the policy notes of the call, as if it went there at once)."""

    def place(self, outstanding: Sequence[float],
              request: GenerateRequest) -> tuple[int, Noting | None]:
        """:meth:`choose`, with what the policy notes of the call left for later: the engine,
        and a function to call with the engine the call went to once it is sent (``None``:
        nothing is left). The pool calls it in the same step of the event loop, so the next
        placement sees the note, as after :meth:`choose`; only the send comes before it.
        """
        return self.choose(outstanding, request), None


class NotingPlacement(PlacementPolicy):
    """A policy that remembers the calls it placed (a session's home, the prompt blocks an
    engine holds): it decides in :meth:`place` and remembers in the note, so what it
    remembers is where each call was sent, even where the pool overrode its pick."""

    @abstractmethod
    def place(self, outstanding: Sequence[float],
              request: GenerateRequest) -> tuple[int, Noting | None]:
        """The engine for ``request``, and what notes the call once it is sent there."""

    def choose(self, outstanding: Sequence[float], request: GenerateRequest) -> int:
        chosen, note = self.place(outstanding, request)
        if note is not None:
            note(chosen)
        return chosen


class LeastOutstanding(PlacementPolicy):
    """The engine with the fewest open calls; ties go to the lowest index (deterministic)."""

    name = "least-outstanding"

    def choose(self, outstanding: Sequence[float], request: GenerateRequest) -> int:
        return min(range(len(outstanding)), key=lambda i: (outstanding[i], i))


class SessionAffinity(NotingPlacement):
    """Keep a workflow request's canonical calls on one engine; send its fills elsewhere.

    A request's consecutive LLM stages share long prompt prefixes (a router's prompt grows
    turn by turn), and the engine that served the last one holds them in its prefix cache:
    moving a call to another engine re-prefills thousands of tokens. So each request gets a
    *home* engine (the least loaded when it first calls) and stays there unless home has
    more than ``slack`` open calls beyond the least loaded engine (then it re-homes there).
    Speculative calls (fills) prefer any engine but home, least loaded first, so they
    overlap the request's own decoding on other workers instead of slowing it.
    """

    name = "session-affinity"

    def __init__(self, slack: int = 2, max_sessions: int = 65_536) -> None:
        self.slack, self.max_sessions = slack, max_sessions
        self._home: OrderedDict[str, int] = OrderedDict()

    def place(self, outstanding: Sequence[float],
              request: GenerateRequest) -> tuple[int, Noting | None]:
        n = len(outstanding)
        home = self._home.get(request.session) if request.session else None
        if home is not None and home >= n:
            home = None
        if request.priority > CANONICAL:
            others = [i for i in range(n) if i != home] or list(range(n))
            return min(others, key=lambda i: (outstanding[i], i)), None
        least = min(range(n), key=lambda i: (outstanding[i], i))
        if home is None or outstanding[home] > outstanding[least] + self.slack:
            home = least
        return home, (partial(self._settle, request.session) if request.session else None)

    def _settle(self, session: str, engine: int) -> None:
        """Make ``engine``, which a call of ``session`` was sent to, the session's home."""
        self._home[session] = engine
        self._home.move_to_end(session)
        if len(self._home) > self.max_sessions:
            self._home.popitem(last=False)
