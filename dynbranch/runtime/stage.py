"""One stage about to run, as every mechanism sees it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dynbranch.workflow import RenderedInput, StageSpec


@dataclass(frozen=True)
class StageCall:
    """One stage about to run: its identity, its complete rendered input, its lineage.

    ``reusable`` is true when the stage may be served from a record at all: declared
    speculable (deterministic, safe to run twice) and, for a tool stage, this call declared
    read-only by its tool — a call with external effects must always execute. ``upstream``
    names the records of the same request whose outputs this input was rendered from (C1's
    provenance: a write reaches this stage's record through them, by cascade). ``tenant`` is
    the tenant the serving side assigned the request (never read from its content): every
    reuse name and prefix-cache salt is scoped to it.
    """

    request_id: str
    stage: StageSpec
    fingerprint: str
    rendered: RenderedInput
    reusable: bool = False
    upstream: tuple[str, ...] = ()
    tenant: str = "default"


def upstream_of(lineage: Sequence[tuple[str, str]], text: str) -> tuple[str, ...]:
    """Reuse names of the records in ``lineage`` whose output appears verbatim in ``text``.

    NOTE: containment over-approximates what an input was rendered from (a short output may
    occur by chance), which only widens the write cascade: safe, never unsafe.
    """
    return tuple(name for name, output in lineage if output in text)
