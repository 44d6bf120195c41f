"""Random-weight Qwen3-shaped decoder layers and their timing (for gpu_profile_check.py).

Plain PyTorch: RMSNorm, fused QKV with per-head q/k norms and rotary, grouped-query
attention over a KV cache (SDPA), SwiGLU MLP, an LM head. Decode steps are timed as CUDA
graph replays (as vLLM decodes), prefill chunks eagerly; on a CPU with perf_counter.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dynbranch.engines.profile import Profile, SeqWork

KV_LIMIT_BYTES = 40 * 2**30
"""The most KV cache one point allocates across its timed layers."""


@dataclass(frozen=True)
class Point:
    """One step shape: ``batch`` sequences computing ``new`` tokens after ``context``."""

    kind: str  # "decode" | "prefill"
    batch: int
    context: int
    new: int

    def work(self) -> list[SeqWork]:
        """The step as ``Profile.step_cost`` takes it."""
        return [SeqWork(self.context, self.new)] * self.batch


# -- the layers ------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Qwen3's RMSNorm (in float32, back to the input dtype)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Layers:
    """``count`` decoder layers of ``profile``'s model with random weights."""

    def __init__(self, profile: Profile, count: int, device: str, dtype: torch.dtype) -> None:
        m = self.model = profile.model
        self.device, self.dtype = device, dtype
        q, kv = m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(*shape: int) -> torch.Tensor:
            w = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
            return w / math.sqrt(shape[0])

        ones = lambda n: torch.ones(n, device=device, dtype=dtype)  # noqa: E731
        self.layers = [
            {
                "ln1": ones(m.hidden_size),
                "qkv": weight(m.hidden_size, q + 2 * kv),
                "q_norm": ones(m.head_dim),
                "k_norm": ones(m.head_dim),
                "o": weight(q, m.hidden_size),
                "ln2": ones(m.hidden_size),
                "gate_up": weight(m.hidden_size, 2 * m.intermediate_size),
                "down": weight(m.intermediate_size, m.hidden_size),
            }
            for _ in range(count)
        ]
        self.lm_head = weight(m.hidden_size, m.vocab_size)

    def _qkv(self, w: dict, x: torch.Tensor, pos: torch.Tensor):  # noqa: ANN202
        m = self.model
        heads, kvh, d = m.num_attention_heads, m.num_kv_heads, m.head_dim
        q, k, v = (rms_norm(x, w["ln1"]) @ w["qkv"]).split([heads * d, kvh * d, kvh * d], -1)
        freqs = pos.float()[:, None] / (1e6 ** (torch.arange(0, d, 2, device=x.device) / d))
        cos = torch.cat((freqs.cos(), freqs.cos()), -1).to(x.dtype)[:, None, :]
        sin = torch.cat((freqs.sin(), freqs.sin()), -1).to(x.dtype)[:, None, :]
        q = rotary(rms_norm(q.view(-1, heads, d), w["q_norm"]), cos, sin)
        k = rotary(rms_norm(k.view(-1, kvh, d), w["k_norm"]), cos, sin)
        return q, k, v.view(-1, kvh, d)

    def _mlp(self, w: dict, x: torch.Tensor) -> torch.Tensor:
        gate, up = (rms_norm(x, w["ln2"]) @ w["gate_up"]).chunk(2, -1)
        return x + (F.silu(gate) * up) @ w["down"]

    def head(self, x: torch.Tensor):  # noqa: ANN201
        """A call computing the logits of ``x`` (one row per sequence)."""
        norm = self.layers[0]["ln2"]
        return lambda: rms_norm(x, norm) @ self.lm_head

    def decode(self, x: torch.Tensor, caches: list, layers: int) -> torch.Tensor:
        """One decode step: ``x`` is (batch, hidden); each cache (batch, kv, context + 1, d)."""
        m = self.model
        b, group = x.shape[0], m.num_attention_heads // m.num_kv_heads
        pos = torch.full((b,), caches[0][0].shape[2] - 1, device=x.device)
        for w, (k_cache, v_cache) in zip(self.layers[:layers], caches, strict=False):
            q, k, v = self._qkv(w, x, pos)
            k_cache[:, :, -1] = k
            v_cache[:, :, -1] = v
            # NOTE: grouped-query decode without repeating K/V: a KV head's query group is
            # its "query length", so the kernel reads each cached K/V once.
            qg = q.view(b, m.num_kv_heads, group, m.head_dim)
            attn = F.scaled_dot_product_attention(qg, k_cache, v_cache)
            x = x + attn.reshape(b, -1) @ w["o"]
            x = self._mlp(w, x)
        return x

    def prefill(self, x: torch.Tensor, caches: list, layers: int, context: int) -> torch.Tensor:
        """A prefill chunk: ``x`` is (new, hidden) after ``context`` cached tokens."""
        m = self.model
        n, group = x.shape[0], m.num_attention_heads // m.num_kv_heads
        pos = torch.arange(context, context + n, device=x.device)
        mask = _causal_mask(n, context + n, x.device)
        for w, (k_cache, v_cache) in zip(self.layers[:layers], caches, strict=False):
            q, k, v = self._qkv(w, x, pos)
            k_cache[0, :, context:] = k.transpose(0, 1)
            v_cache[0, :, context:] = v.transpose(0, 1)
            keys = k_cache.repeat_interleave(group, dim=1)
            values = v_cache.repeat_interleave(group, dim=1)
            q = q.transpose(0, 1)[None]
            if mask is None:
                attn = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
            else:
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + attn[0].transpose(0, 1).reshape(n, -1) @ w["o"]
            x = self._mlp(w, x)
        return x


def _causal_mask(n: int, total: int, device: torch.device):  # noqa: ANN202
    """None for a fresh prompt (plain causal); else query i sees keys up to total - n + i."""
    if total == n:
        return None
    try:
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(n, total)
    except ImportError:  # older PyTorch: an explicit mask (a slower kernel)
        return torch.ones(n, total, dtype=torch.bool, device=device).tril(total - n)


# -- timing ----------------------------------------------------------------------------------


def _time(fn, device: str, reps: int, trials: int, graph: bool) -> tuple[float, str]:  # noqa: ANN001
    """Median seconds per call of ``fn`` (a CUDA graph replay where asked and possible)."""
    how = "eager"
    if device.startswith("cuda"):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                fn, how = g.replay, "cuda graph"
            except Exception as exc:  # noqa: BLE001 - any capture failure: time eagerly
                how = f"eager (graph capture failed: {type(exc).__name__})"
        results = []
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            results.append(start.elapsed_time(end) / 1e3 / reps)
        return statistics.median(results), how
    fn()
    results = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        results.append((time.perf_counter() - t0) / reps)
    return statistics.median(results), how


def measure(layers: Layers, point: Point, timed: int, grid) -> tuple[float, int, str]:  # noqa: ANN001
    """Seconds of one full-depth step at ``point`` (``timed`` layers, scaled), and how."""
    m, dev, dtype = layers.model, layers.device, layers.dtype
    kv_bytes = 2 * point.batch * (point.context + point.new) * m.num_kv_heads * m.head_dim
    timed = max(1, min(timed, KV_LIMIT_BYTES // max(1, kv_bytes * dtype.itemsize)))
    shape = (point.batch, m.num_kv_heads, point.context + point.new, m.head_dim)
    caches = [
        (torch.randn(shape, device=dev, dtype=dtype), torch.randn(shape, device=dev, dtype=dtype))
        for _ in range(timed)
    ]
    with torch.inference_mode():
        if point.kind == "decode":
            x = torch.randn(point.batch, m.hidden_size, device=dev, dtype=dtype)
            run = lambda: layers.decode(x, caches, timed)  # noqa: E731
            seconds, how = _time(run, dev, grid.decode_reps, grid.trials, graph=True)
        else:
            x = torch.randn(point.new, m.hidden_size, device=dev, dtype=dtype)
            run = lambda: layers.prefill(x, caches, timed, point.context)  # noqa: E731
            seconds, how = _time(run, dev, grid.prefill_reps, grid.trials, graph=False)
        head_x = torch.randn(point.batch, m.hidden_size, device=dev, dtype=dtype)
        head_s, _ = _time(layers.head(head_x), dev, grid.decode_reps, grid.trials, graph=False)
    # The model has num_layers layers, then one LM head for each sequence's last token.
    return seconds * m.num_layers / timed + head_s, timed, how
