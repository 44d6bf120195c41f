"""Engines behind one protocol, chosen by name.

``sim`` (a roofline-timed continuous-batching simulator), ``zero`` (returns at once, to
measure orchestration overhead) and ``hf`` (a transformers model, greedy, on CPU or one GPU;
``profile`` is then the model's directory) are built; ``vllm`` is part of the design and not
built yet. Engine modules are imported only when their kind is made, so importing this
package never pulls in a heavy dependency.
"""

from __future__ import annotations

from dynbranch.clock import Clock
from dynbranch.engines.protocol import Engine
from dynbranch.errors import NotBuiltError, UnknownNameError

BUILT_ENGINES = ("sim", "zero", "hf")
"""The kinds :func:`make_engine` can make today."""
PLANNED_ENGINES = ("vllm",)
"""Kinds the design names that are not built yet (:class:`NotBuiltError`)."""
ENGINE_KINDS = BUILT_ENGINES + PLANNED_ENGINES
"""Every engine kind the design names."""


def make_engine(kind: str, *, profile: str, clock: Clock, engine_id: str) -> Engine:
    """A new, not yet started engine of ``kind`` serving the model of ``profile``."""
    if kind not in ENGINE_KINDS:
        raise UnknownNameError("engine", kind, list(ENGINE_KINDS))
    if kind in PLANNED_ENGINES:
        raise NotBuiltError("engine", kind, list(BUILT_ENGINES))
    if kind == "hf":
        from dynbranch.engines.hf import make_hf_engine

        return make_hf_engine(model_path=profile, clock=clock, engine_id=engine_id)
    from dynbranch.engines.profile import load_profile

    loaded = load_profile(profile)
    if kind == "sim":
        from dynbranch.engines.sim import SimEngine

        return SimEngine(loaded, clock, engine_id)
    from dynbranch.engines.zero import ZeroEngine

    return ZeroEngine(clock, engine_id, model=loaded.model.name)


__all__ = ["BUILT_ENGINES", "ENGINE_KINDS", "PLANNED_ENGINES", "make_engine"]
