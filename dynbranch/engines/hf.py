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
:meth:`HFEngine.start`, never at module import.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynbranch.clock import Clock
from dynbranch.engines.profile import kv_blocks_for
from dynbranch.engines.protocol import (
    SPECULATIVE,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.engines.queued import DONE, RUNNING, WAITING, QueuedEngine
from dynbranch.errors import EngineError, ModelNotFoundError, PromptTooLongError

if TYPE_CHECKING:
    import torch

BLOCK_SIZE = 16
"""Tokens per KV block in :meth:`HFEngine.load` (vLLM's default block size)."""
DTYPES = ("float32", "bfloat16", "float16")

KVCache = tuple[tuple["torch.Tensor", "torch.Tensor"], ...]
"""One request's KV cache: (keys, values) per layer, each ``[1, kv_heads, tokens, head_dim]``."""


# -- text ------------------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Turns sampled token ids into text deltas that never split a UTF-8 character.

    Byte-level tokens can end inside a multi-byte character; such a tail decodes to U+FFFD.
    Tokens are held back until their text no longer ends in U+FFFD, then released together.
    NOTE: a run of bytes that is invalid UTF-8 is held until a valid character follows it or
    :meth:`flush` is called at the end; it then appears as U+FFFD, as in a full decode.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._pending: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (maybe empty)."""
        self._pending.append(token_id)
        piece = self._decode()
        if piece.endswith("\ufffd"):
            return ""
        return self._release(piece)

    def flush(self) -> str:
        """Release whatever is held (at the end of the output)."""
        return self._release(self._decode()) if self._pending else ""

    def _decode(self) -> str:
        return self._tokenizer.decode(
            self._pending, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def _release(self, piece: str) -> str:
        self._pending.clear()
        self.text += piece
        return piece


# -- the model side of a step (worker thread) -----------------------------------------------


class _Runner:
    """Runs one step's forward passes; touches no engine state, so it may run in a thread."""

    def __init__(self, model: Any, device: str) -> None:
        self.device = device
        # NOTE: decoder and head apart, so prefill can take logits at each row's last token.
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.pad_id = model.config.pad_token_id or 0

    def step(
        self, prompts: Sequence[Sequence[int]], decodes: Sequence[tuple[int, KVCache]]
    ) -> tuple[list[tuple[int, KVCache]], list[tuple[int, KVCache]]]:
        """(next token, grown cache) for each prompt to prefill and each cache to extend."""
        import torch

        with torch.inference_mode():
            return self._prefill(prompts), self._decode(decodes)

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> list[tuple[int, KVCache]]:
        import torch

        if not prompts:
            return []
        lens = [len(p) for p in prompts]
        ids = torch.full((len(prompts), max(lens)), self.pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        out = self.decoder(input_ids=ids.to(self.device), use_cache=True)
        rows = torch.arange(len(prompts), device=self.device)
        last = torch.tensor(lens, device=self.device) - 1
        # NOTE: the head sees only each row's last real position, as generate() computes only
        # the last position's logits: the same product shape alone, so the same rounding.
        tokens = self.head(out.last_hidden_state[rows, last]).argmax(-1).tolist()
        layers = out.cache.layers
        return [
            (
                tokens[b],
                tuple((lay.keys[b : b + 1, :, :n], lay.values[b : b + 1, :, :n]) for lay in layers),
            )
            for b, n in enumerate(lens)
        ]

    def _decode(self, items: Sequence[tuple[int, KVCache]]) -> list[tuple[int, KVCache]]:
        import torch
        from transformers import DynamicCache

        if not items:
            return []
        lens = [cache[0][0].shape[-2] for _, cache in items]
        width = max(lens)
        mask = torch.zeros((len(items), width + 1), dtype=torch.long)
        for b, n in enumerate(lens):
            mask[b, width - n :] = 1
        out = self.decoder(
            input_ids=torch.tensor([[tok] for tok, _ in items], device=self.device),
            attention_mask=mask.to(self.device),
            position_ids=torch.tensor([[n] for n in lens], device=self.device),
            cache=DynamicCache(ddp_cache_data=_left_padded(items, lens, width)),
            use_cache=True,
        )
        tokens = self.head(out.last_hidden_state[:, -1]).argmax(-1).tolist()
        layers = out.cache.layers
        return [
            (
                tokens[b],
                tuple(
                    (lay.keys[b : b + 1, :, width - n :], lay.values[b : b + 1, :, width - n :])
                    for lay in layers
                ),
            )
            for b, n in enumerate(lens)
        ]


def _left_padded(
    items: Sequence[tuple[int, KVCache]], lens: Sequence[int], width: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, every request's keys and values stacked, zero-padded on the left."""
    batched = []
    for layer in range(len(items[0][1])):
        k0 = items[0][1][layer][0]
        shape = (len(items), k0.shape[1], width, k0.shape[3])
        keys, values = k0.new_zeros(shape), k0.new_zeros(shape)
        for b, ((_, cache), n) in enumerate(zip(items, lens, strict=True)):
            keys[b, :, width - n :] = cache[layer][0][0]
            values[b, :, width - n :] = cache[layer][1][0]
        batched.append((keys, values))
    return batched


def _set_threads(threads: int | None) -> None:
    """Set the calling thread's intra-op thread count (``None`` keeps torch's default).

    NOTE: with torch's OpenMP backend the count is per calling thread, so this changes only the
    engine's worker. One thread is the fastest for tiny models: their matrices are too small
    to split, and spinning OpenMP workers slow everything down on a busy machine (10x here).
    """
    import torch

    if threads is not None:
        torch.set_num_threads(threads)


def _load(model_path: Path, device: str, dtype: str) -> tuple[Any, Any]:
    """Tokenizer and model from a local directory (never the hub)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, local_files_only=True, dtype=getattr(torch, dtype)
    )
    return tokenizer, model.to(device).eval()


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

    @property
    def priority(self) -> int:
        return self.request.priority

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
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"engine {engine_id}: max_batch must be >= 1, got {max_batch}")
        if dtype not in DTYPES:
            raise ValueError(f"engine {engine_id}: dtype must be one of {DTYPES}, got {dtype!r}")
        if kv_blocks is not None and kv_blocks < 1:
            raise ValueError(f"engine {engine_id}: kv_blocks must be >= 1, got {kv_blocks}")
        if threads is not None and threads < 1:
            raise ValueError(f"engine {engine_id}: threads must be >= 1, got {threads}")
        self.model_path, self.clock = Path(model_path), clock
        self.engine_id, self.model = engine_id, self.model_path.name
        self.max_batch, self.device, self.dtype = max_batch, device, dtype
        self._kv_blocks, self._threads = kv_blocks, threads
        self._tokenizer: Any = None
        self._runner: _Runner | None = None
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
        if not (self.model_path / "config.json").is_file():
            raise ModelNotFoundError(
                str(self.model_path),
                "Build the tiny test model with `python -m dynbranch.models.tiny DIR`.",
            )
        loop = asyncio.get_running_loop()
        # NOTE: one worker thread: forward passes never overlap, and shutdown has one to join.
        self._executor = ThreadPoolExecutor(
            1,
            thread_name_prefix=self.engine_id,
            initializer=_set_threads,
            initargs=(self._threads,),
        )
        try:
            self._tokenizer, model = await loop.run_in_executor(
                self._executor, _load, self.model_path, self.device, self.dtype
            )
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise
        self._runner = _Runner(model, self.device)
        self._eos_ids = _eos_ids(model, self._tokenizer)
        self._max_len = model.config.max_position_embeddings
        self._wake = asyncio.Event()
        self._loop_task = loop.create_task(self._step_loop(), name=f"{self.engine_id}-steps")

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


def make_hf_engine(*, model_path: str | Path, clock: Clock, engine_id: str) -> HFEngine:
    """A new, not yet started :class:`HFEngine` for the registry in ``dynbranch.engines``."""
    return HFEngine(model_path, clock, engine_id)


__all__ = ["BLOCK_SIZE", "HFEngine", "IncrementalDetokenizer", "make_hf_engine"]
