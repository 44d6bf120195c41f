"""The model side of the transformers engine: text deltas, batched forward passes, loading.

:class:`IncrementalDetokenizer` turns sampled ids into UTF-8-safe text deltas;
:class:`Runner` runs one step's prefill and decode forward passes and touches no engine
state, so :class:`~dynbranch.engines.hf.HFEngine` can run it in a worker thread. torch and
transformers are imported inside the functions that need them, never at module import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

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


class Runner:
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


def set_threads(threads: int | None) -> None:
    """Set the calling thread's intra-op thread count (``None`` keeps torch's default).

    NOTE: with torch's OpenMP backend the count is per calling thread, so this changes only the
    engine's worker. One thread is the fastest for tiny models: their matrices are too small
    to split, and spinning OpenMP workers slow everything down on a busy machine (10x here).
    """
    import torch

    if threads is not None:
        torch.set_num_threads(threads)


def load(model_path: Path, device: str, dtype: str) -> tuple[Any, Any]:
    """Tokenizer and model from a local directory (never the hub)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, local_files_only=True, dtype=getattr(torch, dtype)
    )
    return tokenizer, model.to(device).eval()


__all__ = ["IncrementalDetokenizer", "KVCache", "Runner", "load", "set_threads"]
