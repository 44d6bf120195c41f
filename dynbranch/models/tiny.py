"""A seeded tiny Qwen3-architecture causal LM with a locally trained tokenizer.

No model hub can be reached here, so the ``hf`` engine and its tests run on a model built from
scratch: a transformers ``Qwen3ForCausalLM`` with small dimensions and random weights drawn from
``seed``, plus a byte-level BPE tokenizer trained with the ``tokenizers`` library on the fixed
:data:`CORPUS` below. The directory :func:`make_tiny` writes loads back with
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` offline, like any
hub checkpoint. The same arguments write byte-identical weights and tokenizer files.

Random weights alone make a poor test subject: greedy decoding wanders through raw bytes and
control characters and almost never reaches EOS. Two changes to the readout make the model
behave like a (nonsensical) chat model instead, without touching the architecture:

* **A bias channel.** Residual dimension 0 holds the constant 1 at every position (every token's
  embedding sets it; no layer writes it), so the LM head's column 0 acts as a per-token logit
  bias (scaled by the final RMSNorm).
* **Readable output that ends.** Through that channel, tokens whose text is not printable and
  the special tokens other than EOS are suppressed, and EOS gets a bias (``eos_bias``) so that
  greedy outputs end after a few to a few tens of tokens (median about 5 to 10 on short
  prompts with the default 2.0). A greedy loop that never passes EOS still runs to
  ``max_tokens`` (finish reason ``length``), as a real model's can; a large negative
  ``eos_bias`` makes a model that never stops, which tests use to hold requests running.

The context (``max_positions``, default :data:`MAX_POSITIONS` = 40,960 tokens, Qwen3's own)
holds the workloads' longest prompts under this tokenizer: its 512-token vocabulary spends
about 1.7 characters per token, so a BFCL multi-turn router prompt (function docs of up to
29 k characters) takes up to 17 k tokens. The positions cost nothing until used: rotary
embeddings have no learned table, and the engines size KV by the tokens actually held.

Run ``python -m dynbranch.models.tiny OUT_DIR [--seed N]`` to write one.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NOTE: torch and transformers are imported only when a model is built.
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

PAD_TOKEN = "<|endoftext|>"
"""Padding (and, as in Qwen3's config, the nominal BOS; no BOS is ever prepended)."""
IM_START_TOKEN = "<|im_start|>"
"""Opens a chat turn (kept for Qwen3 compatibility; never generated)."""
EOS_TOKEN = "<|im_end|>"
"""Ends a chat turn: the token greedy decoding stops on."""
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN)
MAX_POSITIONS = 40_960
"""The default context of a tiny model, in tokens (Qwen3's ``max_position_embeddings``)."""

BIAS_DIM = 0
"""The residual dimension that carries the constant 1 (see the module doc)."""
SUPPRESS_BIAS = 50.0
"""Logit bias (before the final norm's scaling) that keeps a token from ever being greedy."""

CORPUS = """\
An agentic request is a workflow: model stages, tool stages and human waits, joined by branches
whose outcome is known only when a stage finishes. A router decodes which handler to call; a
search step decodes which entity to look up next; a user picks a menu item after thinking.
Most of the latency of such a request is this serial chain of decisions.

The scheduler shortens the chain three ways. First, exact reuse: a stage whose rendered input,
model and parameters match an earlier execution is served from the record, if every resource
the record read is still at the version it read. Second, early fill: at a branch, a predictor
proposes the likely next stages, and the cheapest of them run speculatively before the branch
resolves. Third, load-priced admission: every fill is priced in milliseconds against the load
it adds, so that speculation never slows the canonical traffic it is meant to help.

def get_weather(city: str, unit: str = "celsius") -> dict:
    \"\"\"Return the current weather for a city.\"\"\"
    return {"city": city, "temperature": 18, "unit": unit, "sky": "sunny"}

def book_flight(origin: str, destination: str, date: str) -> dict:
    \"\"\"Book one seat on the first flight of the day.\"\"\"
    return {"status": "booked", "from": origin, "to": destination, "date": date}

User: What is the weather in Paris today?
Assistant: Call get_weather(city="Paris") then answer: 18 degrees and sunny.
User: Book me a flight from Berlin to Lisbon on 2024-05-17.
Assistant: book_flight(origin="Berlin", destination="Lisbon", date="2024-05-17")
User: List the files in the current directory, then read notes.txt.
Assistant: ls() then cat(file_name="notes.txt")

{"name": "search", "arguments": {"query": "Who directed the film about the lighthouse keeper?"}}
{"name": "lookup", "arguments": {"entity": "lighthouse", "page": 2}}
{"role": "tool", "content": "The film was directed by a Norwegian director born in 1971."}

The engine batches every running request into one step. Each step, requests that are waiting
are admitted in priority order, their prompts are prefilled, and every running request decodes
one more token. A request ends when it samples the end of its turn or reaches its token limit;
a request that is aborted ends at the next step boundary and frees its cache.

Café au lait, crème brûlée, naïve façade, jalapeño, smörgåsbord, Zürich, São Paulo, Kraków.
Grüße aus München! ¿Dónde está la estación? Ça va très bien, merci. Ελληνικά, русский, 日本語.
Prices: 12 € for the menu, 3 £ for tea, 250 ¥ for a snack; the temperature fell to −5 °C.
Symbols → ⇒ ≤ ≥ ≠ ∞ • … — “quoted” ‘single’ « guillemets » and an emoji or two: 🚀 🌍 ✅.

Numbers and codes: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 3.14159 2.71828 -17 +8 1e-6 0x1F.
Identifiers: request_id, max_tokens, finish_reason, prompt_tokens, output_tokens, engine_id,
kv_blocks_used, kv_blocks_total, first_token_at, arrived_at, priority, speculative, canonical.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How
vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards
jump quickly. Jackdaws love my big sphinx of quartz.

A branch coordinate names one decision in a workflow template, such as the router at step two.
The gate learns, per coordinate, whether running the predictor there pays for itself. A fill
that is not needed when its branch resolves is cancelled, and its result is dropped unread.
Speculation may change latency, never values: a promoted result equals what the canonical
execution returns, and every request completes or fails with a typed error.
"""
"""The fixed text the tokenizer is trained on (part prose, part code, some non-ASCII)."""


@dataclass(frozen=True)
class TinySpec:
    """The shape of a tiny model: every field has a small default and a checked range."""

    seed: int = 0
    vocab_size: int = 512
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = MAX_POSITIONS
    eos_bias: float = 2.0

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (all bytes + specials), "
                f"got {self.vocab_size}"
            )
        if self.hidden < 8 or self.hidden % self.heads:
            raise ValueError(
                f"hidden must be >= 8 and divisible by heads; got {self.hidden}, {self.heads}"
            )
        if self.max_positions < 16:
            raise ValueError(f"max_positions must be >= 16, got {self.max_positions}")
        if self.layers < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(
                f"need layers >= 1 and heads divisible by kv_heads; got layers={self.layers}, "
                f"heads={self.heads}, kv_heads={self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def make_tiny(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    eos_bias: float = 2.0,
    max_positions: int = MAX_POSITIONS,
) -> Path:
    """Write a tiny Qwen3 model (config, safetensors weights, tokenizer) to ``out_dir``."""
    spec = TinySpec(seed, vocab_size, hidden, layers, heads, kv_heads, max_positions, eos_bias)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size, spec.max_positions)
    model = build_model(spec, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train_tokenizer(vocab_size: int, max_length: int = MAX_POSITIONS) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on :data:`CORPUS`; every byte string round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # NOTE: the full byte alphabet, so that text the corpus never saw still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=PAD_TOKEN,
        # NOTE: no clean-up, so decoding a prefix of the ids gives a prefix of the text.
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )


def build_model(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """The tiny model for ``tokenizer``: seeded random weights plus the bias channel."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    pad, eos = tokenizer.convert_tokens_to_ids([PAD_TOKEN, EOS_TOKEN])
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=3 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False,
        pad_token_id=pad,
        bos_token_id=pad,
        eos_token_id=eos,
        dtype="float32",
    )
    # NOTE: fork the global RNG so that building a model never perturbs the caller's seeds;
    # every weight is redrawn from a private generator below anyway.
    with torch.random.fork_rng(devices=[]):
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, do_sample=False
    )
    with torch.no_grad():
        _draw_weights(model, spec.seed)
        _install_bias_channel(model, _suppressed_ids(tokenizer), eos, spec.eos_bias)
    return model.eval()


def _draw_weights(model: Qwen3ForCausalLM, seed: int) -> None:
    """Norms at 1, embeddings ~ N(0, 1), projections ~ N(0, 1/fan_in), in name order."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if param.ndim == 1:
            param.fill_(1.0)
            continue
        scale = 1.0 if name.endswith("embed_tokens.weight") else 1.0 / math.sqrt(param.shape[1])
        param.copy_(torch.randn(param.shape, generator=generator) * scale)


def _install_bias_channel(
    model: Qwen3ForCausalLM, suppressed: list[int], eos: int, eos_bias: float
) -> None:
    """Make residual dim :data:`BIAS_DIM` a constant and read it as per-token logit biases."""
    model.model.embed_tokens.weight[:, BIAS_DIM] = 1.0
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight[BIAS_DIM] = 0.0
        layer.mlp.down_proj.weight[BIAS_DIM] = 0.0
    head = model.lm_head.weight
    head[:, BIAS_DIM] = 0.0
    head[suppressed, BIAS_DIM] = -SUPPRESS_BIAS
    head[eos, BIAS_DIM] = eos_bias


def _suppressed_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Ids greedy decoding should never pick: non-EOS specials and unprintable tokens."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    out = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        printable = text.replace("\n", "").replace("\t", "").isprintable()
        if token_id != eos and (
            token_id in tokenizer.all_special_ids or not text or "\ufffd" in text or not printable
        ):
            out.append(token_id)
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m dynbranch.models.tiny OUT_DIR [--seed N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m dynbranch.models.tiny", description=main.__doc__
    )
    parser.add_argument("out_dir", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = parser.parse_args(argv)
    from transformers.utils import logging

    logging.disable_progress_bar()  # NOTE: the files are written in milliseconds
    print(make_tiny(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
