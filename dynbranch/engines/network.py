"""A modelled network between the driver and engines on other nodes.

The paper's commodity deployment (Fig. 8c,d) serves Qwen3-8B on four RTX 4090s on separate
vast.ai nodes: every engine call crosses the network from the driver (orchestrator, gate,
tools) to a worker node and back. On the simulated engine that network is modelled here,
on the run's clock: :class:`NetworkClient` wraps an :class:`EngineClient` and delays

* a ``generate`` call by one one-way trip before the engine sees it (half the RTT plus the
  request's bytes — prompt and framing — over the bandwidth) and one after it finishes
  (half the RTT plus the reply's bytes), so the engine's own times are unchanged and the
  stage's duration carries the network;
* an ``abort`` by one one-way trip before it reaches the engine;
* a ``load`` snapshot by a round trip (a remote read).

NOTE: an in-process engine stops a cancelled call at once, where a remote one would run on
for the abort's one-way trip; that work (at most RTT/2 per cancelled fill) is not charged.

Models (:data:`NETWORKS`), each with its sources:

* ``vastai-wan`` — separate vast.ai hosts reached over the public internet, as the paper's
  "four distributed worker nodes" are: RTT **21.6 ms**, WonderProxy's measured ping between
  its Paris and Milan servers (https://wonderproxy.com/blog/miles-per-milisecond/, the
  same-continent data-centre pair of its table; Milan–Zurich 11.2 ms, Dallas–Baltimore
  35.6 ms bracket it); bandwidth **500 Mbit/s** each way, an assumption inside the range of
  the per-host ``inet_up`` / ``inet_down`` speeds (Mbit/s) that vast.ai measures and lists
  with every offer (https://vast.ai/docs; consumer hosts list ~100–1,000).
* ``vastai-cluster`` — one vast.ai physical cluster over its overlay network, as
  ``ray_cluster/`` deploys it (https://docs.vast.ai/multi-node-training-using-torch-nccl:
  "groups of machines that support fast local networking", a private virtual LAN):
  RTT **0.5 ms**, bandwidth **1 Gbit/s** — a 1 GbE LAN with the overlay's encapsulation;
  an assumption, vast.ai publishes no figure.
* ``none`` — engines on the driver's own node (the H200 box): no delay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynbranch.clock import Clock
from dynbranch.engines.client import EngineClient
from dynbranch.engines.protocol import GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.errors import UnknownNameError

FRAMING_BYTES = 512
"""Bytes of a call's envelope beyond its text (ids, sampling settings, token counts,
timestamps; Ray's serialised task spec is of this order)."""


@dataclass(frozen=True)
class NetworkModel:
    """A link between driver and worker node: round-trip time and bandwidth (each way)."""

    name: str
    rtt_s: float
    bandwidth_bytes_s: float

    def __post_init__(self) -> None:
        if self.rtt_s < 0 or self.bandwidth_bytes_s <= 0:
            raise ValueError(
                f"network {self.name}: need rtt_s >= 0 and bandwidth > 0 "
                f"(got {self.rtt_s}, {self.bandwidth_bytes_s})"
            )

    def one_way_s(self, payload_bytes: int) -> float:
        """Seconds for ``payload_bytes`` (plus framing) to cross the link once."""
        return self.rtt_s / 2 + (payload_bytes + FRAMING_BYTES) / self.bandwidth_bytes_s


MBIT = 1e6 / 8
NETWORKS: dict[str, NetworkModel | None] = {
    "none": None,
    "vastai-wan": NetworkModel("vastai-wan", 0.0216, 500 * MBIT),
    "vastai-cluster": NetworkModel("vastai-cluster", 0.0005, 1000 * MBIT),
}
"""Every network by name (see the module docstring for each one's sources)."""


def network_model(name: str) -> NetworkModel | None:
    """The network called ``name`` (``None`` for ``none``); a typed error otherwise."""
    if name not in NETWORKS:
        raise UnknownNameError("network", name, list(NETWORKS))
    return NETWORKS[name]


class NetworkClient(EngineClient):
    """An engine client whose calls cross a modelled network (see the module docstring)."""

    def __init__(self, inner: EngineClient, model: NetworkModel, clock: Clock) -> None:
        self.inner, self.model, self.clock = inner, model, clock
        self.engine_id = inner.engine_id
        self.network_s = 0.0  # total delay this client added, for reports

    async def _cross(self, payload_bytes: int) -> None:
        delay = self.model.one_way_s(payload_bytes)
        self.network_s += delay
        await self.clock.sleep(delay)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await self._cross(len(request.prompt.encode("utf-8")))
        result = await self.inner.generate(request)
        await self._cross(len(result.text.encode("utf-8")))
        return result

    async def abort(self, request_id: str) -> bool:
        await self._cross(0)
        return await self.inner.abort(request_id)

    async def promote(self, request_id: str) -> bool:
        await self._cross(0)
        return await self.inner.promote(request_id)

    async def load(self) -> LoadSnapshot:
        await self._cross(0)
        snapshot = await self.inner.load()
        await self._cross(0)
        return snapshot


def with_network(
    clients: Mapping[str, Sequence[EngineClient]], name: str, clock: Clock
) -> Mapping[str, Sequence[EngineClient]]:
    """Every client of every role behind network ``name`` (unchanged for ``none``)."""
    model = network_model(name)
    if model is None:
        return clients
    return {role: [NetworkClient(c, model, clock) for c in cs] for role, cs in clients.items()}
