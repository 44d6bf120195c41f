"""Versions of external resources: what C1's freshness guard compares read-sets against.

A resource is any external state a stage can read ("routing-00042/GorillaFileSystem",
"corpus:musique", "sgd:Restaurants_2"). Its versions are opaque strings reported by the
resource's owner; the table keeps the latest one reported. Versions have no order: a read
is fresh iff it saw exactly the current version.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

# NOTE: a write whose new version the owner did not report gets a token no real version can
# equal (owners never report strings starting with NUL), so every earlier read turns stale
# and no later read can be taken as fresh until the owner reports the version it is at.
_UNKNOWN_PREFIX = "\x00unknown:"

StaleReads = dict[str, tuple[str, str | None]]


class VersionTable:
    """The latest known version of every external resource."""

    def __init__(self) -> None:
        self._current: dict[str, str] = {}
        self._unknown = itertools.count()

    def __len__(self) -> int:
        return len(self._current)

    def observe(self, resource: str, version: str) -> bool:
        """The owner reports ``resource`` is at ``version``; returns whether that changed it."""
        if self._current.get(resource) == version:
            return False
        self._current[resource] = version
        return True

    def write(self, resource: str, new_version: str | None) -> set[str]:
        """A write moved ``resource`` to ``new_version`` (``None``: changed, version unknown).

        Returns the resources whose version changed: ``{resource}`` or the empty set.
        """
        if new_version is None:
            new_version = f"{_UNKNOWN_PREFIX}{next(self._unknown)}"
        return {resource} if self.observe(resource, new_version) else set()

    def resources(self) -> list[str]:
        """Every resource whose version is known."""
        return list(self._current)

    def current(self, resource: str) -> str | None:
        """The latest known version of ``resource``, ``None`` if never reported."""
        return self._current.get(resource)

    def learn(self, read_set: Mapping[str, str]) -> None:
        """Adopt the versions of resources never seen before; known ones are left alone.

        NOTE: a stage's read report says what the version *was* when it read, and it may
        arrive after a write (a slow fill), so it never overrides a known version.
        """
        for resource, version in read_set.items():
            self._current.setdefault(resource, version)

    def stale(self, read_set: Mapping[str, str]) -> StaleReads:
        """The reads of ``read_set`` that are not current: ``{resource: (recorded, current)}``.

        A resource the table has never seen counts as stale (nothing vouches for it).
        """
        current = self._current
        out: StaleReads = {}
        for resource, version in read_set.items():
            now = current.get(resource)
            if now != version:
                out[resource] = (version, now)
        return out

    def is_fresh(self, read_set: Mapping[str, str]) -> bool:
        """Whether every read of ``read_set`` saw the current version."""
        current = self._current
        return all(current.get(r) == v for r, v in read_set.items())
