"""The transformers engine: greedy decoding of a real causal LM, batched step by step.

One asyncio task runs the step loop. Each step it admits waiting requests in queue order
(priority, canonical before speculative, then arrival) while fewer than ``max_batch`` run and
their worst-case KV fits the budget, then runs the model once in a worker thread, so the event
loop stays responsive:

* **prefill** for the requests admitted this step: their prompts right-padded into one batch.
  No attention mask is needed: every pad sits after every real token of its row, so causal
  attention already hides it.
* **decode** for the others: each request's last sampled token against its own KV cache. The
  caches are left-padded to a common length, the pads masked out, and each token gets its
  own position, so a request computes exactly what it would compute alone.

Every request then takes its next token greedily (argmax) and streams its text delta. KV caches
are kept per request between steps (gathered into a batch and split again each step), so
requests join and leave the batch at any step; that copy is the price of simplicity, and cheap
for the tiny models this engine is for.

Greedy output equals ``model.generate(do_sample=False)`` token for token, alone or batched.
NOTE: batching changes only the shapes of the matrix products, which can move a logit by a
rounding error; in float32 that flips an argmax only on an exact near-tie. The tests check
equality on the tiny model; use ``dtype="float32"`` (the default) wherever equality matters.

A request ends on an EOS token of the model's generation config (``stop``; EOS counts as an
output token, as in vLLM's usage, but adds no text) or after ``max_tokens`` tokens
(``length``). An abort (or a consumer that cancels its stream) ends the request at once with
``abort`` and frees its batch slot and KV; a forward pass already in flight still computes its
token, which is dropped when the step returns. Sampling parameters (``temperature``, ``top_p``,
``seed``) are ignored: this engine is greedy. torch and transformers are imported by
:meth:`HFEngine.start`, never at module import. The model side of a step (forward passes,
detokenizing, loading) is in :mod:`dynbranch.engines.hf_model`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynbranch.clock import Clock
from dynbranch.engines.config import EngineConfig
from dynbranch.engines.hf_model import IncrementalDetokenizer, KVCache, Runner, load, set_threads
from dynbranch.engines.model_ref import resolve_model
from dynbranch.engines.profile import kv_blocks_for
from dynbranch.engines.protocol import (
    CANONICAL,
    SPECULATIVE,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.engines.queued import DONE, RUNNING, WAITING, QueuedEngine
from dynbranch.errors import EngineError, PromptTooLongError

BLOCK_SIZE = 16
"""Tokens per KV block in :meth:`HFEngine.load` (vLLM's default block size)."""
DTYPES = ("float32", "bfloat16", "float16")


# -- one request inside the engine ----------------------------------------------------------


@dataclass(eq=False)
class _Seq:
    """A request's state in the engine."""

    request: GenerateRequest
    prompt_ids: list[int]
    max_new: int  # max_tokens, cut to what the context and the KV budget can hold
    reserved_blocks: int  # worst-case KV blocks, held from admission to the end
    arrived_at: float
    queue_key: tuple[int, int]
    detok: IncrementalDetokenizer
    chunks: asyncio.Queue[GenerateChunk | None] = field(default_factory=asyncio.Queue)
    state: str = WAITING
    output_ids: list[int] = field(default_factory=list)
    cache: KVCache | None = None
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    promoted: bool = False  # a speculative call a canonical stage now waits on

    @property
    def priority(self) -> int:
        return CANONICAL if self.promoted else self.request.priority

    @property
    def kv_blocks(self) -> int:
        """Blocks of KV this request holds now."""
        return 0 if self.cache is None else kv_blocks_for(self.cache[0][0].shape[-2], BLOCK_SIZE)


# -- the engine -----------------------------------------------------------------------------


class HFEngine(QueuedEngine):
    """Greedy decoding of a local transformers causal LM (see the module doc).

    ``kv_blocks`` is the KV budget in blocks of :data:`BLOCK_SIZE` tokens; a request is
    admitted only when its worst case (prompt + ``max_tokens``) fits beside those running, so
    nothing is ever preempted. By default the budget holds ``max_batch`` full contexts.
    ``threads`` is the worker thread's intra-op thread count (``None``: torch's default).
    """

    def __init__(
        self,
        model_path: str | Path,
        clock: Clock,
        engine_id: str = "hf-0",
        *,
        max_batch: int = 8,
        device: str = "cpu",
        dtype: str = "float32",
        kv_blocks: int | None = None,
        threads: int | None = 1,
        max_model_len: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"engine {engine_id}: max_batch must be >= 1, got {max_batch}")
        if dtype not in DTYPES:
            raise ValueError(f"engine {engine_id}: dtype must be one of {DTYPES}, got {dtype!r}")
        if kv_blocks is not None and kv_blocks < 1:
            raise ValueError(f"engine {engine_id}: kv_blocks must be >= 1, got {kv_blocks}")
        if threads is not None and threads < 1:
            raise ValueError(f"engine {engine_id}: threads must be >= 1, got {threads}")
        if max_model_len is not None and max_model_len < 1:
            raise ValueError(f"engine {engine_id}: max_model_len must be >= 1, got {max_model_len}")
        self.model_ref, self.max_model_len = str(model_path), max_model_len
        self.model_path, self.clock = Path(model_path), clock
        self.engine_id, self.model = engine_id, self.model_path.name
        self.max_batch, self.device, self.dtype = max_batch, device, dtype
        self._kv_blocks, self._threads = kv_blocks, threads
        self._tokenizer: Any = None
        self._runner: Runner | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._max_len = 0
        self._seqs: dict[str, _Seq] = {}
        self._waiting: list[_Seq] = []  # sorted by queue_key
        self._running: list[_Seq] = []  # in admission order
        self._reserved = 0
        self._arrivals = 0
        self._executor: ThreadPoolExecutor | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False

    @property
    def kv_blocks_total(self) -> int:
        """The KV budget in blocks (known once the model is loaded, without ``kv_blocks``)."""
        if self._kv_blocks is not None:
            return self._kv_blocks
        return self.max_batch * kv_blocks_for(self._max_len, BLOCK_SIZE)

    # -- the protocol ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.engine_id} was shut down")
        if self._loop_task is not None:
            return
        # NOTE: a hub id is fetched into this node's Hugging Face cache once (see model_ref).
        self.model_path = resolve_model(self.model_ref)
        loop = asyncio.get_running_loop()
        # NOTE: one worker thread: forward passes never overlap, and shutdown has one to join.
        self._executor = ThreadPoolExecutor(
            1,
            thread_name_prefix=self.engine_id,
            initializer=set_threads,
            initargs=(self._threads,),
        )
        try:
            self._tokenizer, model = await loop.run_in_executor(
                self._executor, load, self.model_path, self.device, self.dtype
            )
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise
        self._runner = Runner(model, self.device)
        self._eos_ids = _eos_ids(model, self._tokenizer)
        self._max_len = min(
            model.config.max_position_embeddings,
            self.max_model_len or model.config.max_position_embeddings,
        )
        self._wake = asyncio.Event()
        self._loop_task = loop.create_task(self._step_loop(), name=f"{self.engine_id}-steps")

    async def promote(self, request_id: str) -> bool:
        seq = self._seqs.get(request_id)
        if seq is None or seq.priority < SPECULATIVE or seq.state not in (WAITING, RUNNING):
            return False
        seq.promoted = True
        if seq.state == WAITING:  # NOTE: it queues among canonical requests by its arrival
            self._waiting.remove(seq)
            seq.queue_key = (CANONICAL, seq.queue_key[1])
            bisect.insort(self._waiting, seq, key=lambda s: s.queue_key)
        return True

    def load(self) -> LoadSnapshot:
        spec_running = [s for s in self._running if s.priority >= SPECULATIVE]
        return LoadSnapshot(
            engine_id=self.engine_id,
            time=self.clock.now(),
            running=len(self._running),
            waiting=len(self._waiting),
            kv_blocks_used=sum(s.kv_blocks for s in self._running),
            kv_blocks_total=self.kv_blocks_total,
            spec_running=len(spec_running),
            spec_waiting=sum(1 for s in self._waiting if s.priority >= SPECULATIVE),
            spec_kv_blocks=sum(s.kv_blocks for s in spec_running),
        )

    async def health(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done() and self._failure is None

    async def shutdown(self) -> None:
        self._closed = True
        for seq in list(self._seqs.values()):
            self._end(seq, "abort")
        task, self._loop_task = self._loop_task, None
        if task is not None:
            assert self._wake is not None
            self._wake.set()
            # NOTE: the loop exits at its next step boundary, after any forward in flight, so
            # no worker thread outlives the engine; a failure was already sent to the callers.
            with contextlib.suppress(Exception):
                await task
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self._runner = None

    # -- arrival and departure ------------------------------------------------------------

    def _submit(self, request: GenerateRequest) -> _Seq:
        if self._loop_task is None or self._closed or self._failure is not None:
            raise EngineError(f"engine {self.engine_id} is not running (start() it first)")
        if request.request_id in self._seqs:
            raise EngineError(f"engine {self.engine_id}: request {request.request_id} is in flight")
        prompt_ids = list(self._tokenizer(request.prompt)["input_ids"])
        if not prompt_ids:
            raise EngineError(f"request {request.request_id}: the prompt is empty")
        capacity = min(self._max_len, self.kv_blocks_total * BLOCK_SIZE)
        if len(prompt_ids) >= capacity:
            raise PromptTooLongError(
                f"request {request.request_id}: {len(prompt_ids)} prompt tokens cannot fit "
                f"engine {self.engine_id} even alone (context {self._max_len} tokens, "
                f"KV budget {self.kv_blocks_total * BLOCK_SIZE} tokens)"
            )
        max_new = min(request.max_tokens, capacity - len(prompt_ids))
        self._arrivals += 1
        seq = _Seq(
            request=request,
            prompt_ids=prompt_ids,
            max_new=max_new,
            # NOTE: the last sampled token is never fed back, so its KV is never computed.
            reserved_blocks=kv_blocks_for(len(prompt_ids) + max_new - 1, BLOCK_SIZE),
            arrived_at=self.clock.now(),
            queue_key=(request.priority, self._arrivals),
            detok=IncrementalDetokenizer(self._tokenizer),
        )
        self._seqs[request.request_id] = seq
        bisect.insort(self._waiting, seq, key=lambda s: s.queue_key)
        assert self._wake is not None
        self._wake.set()
        return seq

    def _end(self, seq: _Seq, reason: str, delta: str = "") -> None:
        """Finish ``seq`` (done or aborted): free its slot and KV, send its last chunk."""
        if seq.state == RUNNING:
            self._running.remove(seq)
            self._reserved -= seq.reserved_blocks
        elif seq.state == WAITING:
            self._waiting.remove(seq)
        seq.state, seq.cache = DONE, None
        del self._seqs[seq.request.request_id]
        seq.chunks.put_nowait(
            GenerateChunk(seq.request.request_id, delta, self._result(seq, reason))
        )

    def _result(self, seq: _Seq, reason: str) -> GenerateResult:
        now = self.clock.now()
        # NOTE: a call aborted before it was scheduled (or before its first token) reports
        # those instants as its end, so every field stays a number on the engine clock.
        return GenerateResult(
            request_id=seq.request.request_id,
            text=seq.detok.text,
            prompt_tokens=len(seq.prompt_ids),
            output_tokens=len(seq.output_ids),
            cached_prompt_tokens=0,
            finish_reason=reason,
            arrived_at=seq.arrived_at,
            first_scheduled_at=now if seq.first_scheduled_at is None else seq.first_scheduled_at,
            first_token_at=now if seq.first_token_at is None else seq.first_token_at,
            finished_at=now,
            engine_id=self.engine_id,
        )

    # -- the step loop --------------------------------------------------------------------

    async def _step_loop(self) -> None:
        assert self._wake is not None and self._runner is not None
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                self._admit()
                if not self._running:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                prefills = [s for s in self._running if s.cache is None]
                decodes = [s for s in self._running if s.cache is not None]
                new, grown = await loop.run_in_executor(
                    self._executor,
                    self._runner.step,
                    [s.prompt_ids for s in prefills],
                    [(s.output_ids[-1], s.cache) for s in decodes],
                )
                self._apply(prefills + decodes, new + grown)
        except Exception as exc:
            # NOTE: a failing model fails the calls in flight instead of hanging them.
            self._failure = exc
            for seq in self._seqs.values():
                seq.chunks.put_nowait(None)
            raise

    def _admit(self) -> None:
        now = self.clock.now()
        while self._waiting and len(self._running) < self.max_batch:
            seq = self._waiting[0]
            # NOTE: strict queue order: a head that does not fit blocks those behind it, so
            # small fills never overtake a canonical request waiting for memory.
            if self._reserved + seq.reserved_blocks > self.kv_blocks_total:
                break
            self._waiting.pop(0)
            self._running.append(seq)
            self._reserved += seq.reserved_blocks
            seq.state, seq.first_scheduled_at = RUNNING, now
        # NOTE: an idle engine always admits its head: every request fits the budget alone.
        assert self._running or not self._waiting

    def _apply(self, seqs: Sequence[_Seq], outputs: Sequence[tuple[int, KVCache]]) -> None:
        """The step has run: each request still running takes its token and grown cache."""
        now = self.clock.now()
        for seq, (token, cache) in zip(seqs, outputs, strict=True):
            if seq.state != RUNNING:
                continue  # aborted while the step ran
            seq.cache = cache
            seq.output_ids.append(token)
            if seq.first_token_at is None:
                seq.first_token_at = now
            self._emit(seq, token)

    def _emit(self, seq: _Seq, token: int) -> None:
        """Stream ``token``'s text; end the request on EOS or at its token limit."""
        if token in self._eos_ids:
            self._end(seq, "stop", seq.detok.flush())
            return
        delta = seq.detok.push(token)
        if len(seq.output_ids) >= seq.max_new:
            self._end(seq, "length", delta + seq.detok.flush())
        else:
            seq.chunks.put_nowait(GenerateChunk(seq.request.request_id, delta))


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids generation stops on: the generation config's, else the model's or tokenizer's."""
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else eos)
    if tokenizer.eos_token_id is None:
        raise EngineError("the model names no EOS token; greedy decoding could never stop")
    return frozenset([tokenizer.eos_token_id])


def make_hf_engine(
    *, model_path: str | Path, clock: Clock, engine_id: str, config: EngineConfig | None = None
) -> HFEngine:
    """A new, not yet started :class:`HFEngine` for the registry in ``dynbranch.engines``.

    Of ``config`` it honours ``dtype`` (``auto``: float32, where greedy outputs are exact)
    and ``max_model_len``; :func:`~dynbranch.engines.config.check_engine_config` refuses the
    vLLM-only settings before a run starts.
    """
    config = config or EngineConfig()
    dtype = "float32" if config.dtype == "auto" else config.dtype
    return HFEngine(model_path, clock, engine_id, dtype=dtype, max_model_len=config.max_model_len)


__all__ = ["BLOCK_SIZE", "HFEngine", "IncrementalDetokenizer", "make_hf_engine"]
