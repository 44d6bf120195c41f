#!/usr/bin/env bash
# GPU smoke test of the vLLM engine, in at most five minutes on a machine with one GPU:
#
#   1. install this repository with vLLM (.[vllm]) into a venv of its own (reused next time);
#   2. build the tiny model (head size 64, which vLLM's GPU attention kernels support; its
#      40,960-token context holds BFCL's longest prompts);
#   3. run the engine contract against vLLM on the GPU (tests/test_vllm_engine.py);
#   4. replay 10 routing requests with --engine vllm --model DIR --backend ray, through the
#      engine settings flags (--max-model-len, --gpu-memory-utilization, --enforce-eager);
#   5. print the summary and check that every request completed (none too long).
#
#   scripts/gpu_smoke.sh
#
# Settings (environment): VLLM_VERSION (default 0.33.0), GPU_SMOKE_VENV (default
# .venv-gpu-smoke in the repository root), GPU_SMOKE_OUT (default runs/gpu-smoke),
# GPU_SMOKE_BUDGET_S (default 300), PYTHON (default python3, >= 3.11).
# Any failure stops the script with "gpu_smoke.sh: FAILED: ..." and a non-zero status.
set -euo pipefail

VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPU_SMOKE_VENV:-$ROOT/.venv-gpu-smoke}"
OUT="${GPU_SMOKE_OUT:-$ROOT/runs/gpu-smoke}"
BUDGET_S="${GPU_SMOKE_BUDGET_S:-300}"
PYTHON="${PYTHON:-python3}"
MODEL="$OUT/tiny-h64"
PHASE="start"

fail() { echo "gpu_smoke.sh: FAILED in phase '$PHASE': $*" >&2; exit 1; }
trap 'fail "command failed (line $LINENO, status $?)"' ERR

# Runs "$@" within what is left of the budget; a phase that runs past it fails the smoke.
within_budget() {
    local left=$((BUDGET_S - SECONDS))
    [ "$left" -gt 0 ] || fail "the ${BUDGET_S}s budget is spent"
    local status=0
    timeout "$left" "$@" || status=$?
    [ "$status" -ne 124 ] || fail "ran past the ${BUDGET_S}s budget (after ${SECONDS}s)"
    return "$status"
}

phase() { PHASE="$1"; echo "== [${SECONDS}s] $1"; }

phase "check the GPU"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this smoke test needs a GPU"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
    || fail "nvidia-smi sees no GPU"

phase "install .[vllm] (vllm==$VLLM_VERSION) into $VENV"
STAMP="$VENV/.installed-vllm-$VLLM_VERSION"
if [ ! -f "$STAMP" ]; then
    [ -x "$VENV/bin/python" ] || within_budget "$PYTHON" -m venv "$VENV"
    echo '*' > "$VENV/.gitignore"
    within_budget "$VENV/bin/python" -m pip install -q --upgrade pip
    within_budget "$VENV/bin/python" -m pip install -q -e "${ROOT}[vllm,hf,dev]" \
        "vllm==$VLLM_VERSION"
    touch "$STAMP"
fi
PY="$VENV/bin/python"
export HF_HUB_OFFLINE=1
"$PY" - <<'EOF' || fail "vLLM does not import or torch sees no CUDA device"
import torch, vllm
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
EOF

phase "build the tiny model in $MODEL"
rm -rf "$MODEL" "$OUT/replay"
mkdir -p "$OUT"
within_budget "$VENV/bin/dynbranch" model make-tiny "$MODEL" --hidden 128 --heads 2 --kv-heads 1

# NOTE: the routing data (the bfcl-eval wheel from PyPI) is fetched while the contract runs.
"$VENV/bin/dynbranch" data bfcl > "$OUT/data.log" 2>&1 &
DATA_PID=$!

phase "engine contract on the GPU"
cd "$ROOT"
within_budget "$PY" -m pytest -m vllm_cpu tests/test_vllm_engine.py -k test_engine_contract \
    -q -rA -p no:cacheprovider 2>&1 | tee "$OUT/contract.log"
grep -q "1 passed" "$OUT/contract.log" || fail "the contract test did not pass (see above)"

phase "fetch the routing data"
wait "$DATA_PID" || { cat "$OUT/data.log" >&2; fail "dynbranch data bfcl failed"; }

phase "replay 10 routing requests on vLLM through the Ray backend"
# NOTE: a replay whose requests fail still exits 0 (the summary counts them, checked below);
# any other status means the run itself broke.
within_budget "$VENV/bin/dynbranch" replay --workload routing --engine vllm --model "$MODEL" \
    --backend ray --workers 1 --requests 10 --rate 2 --max-model-len 40960 \
    --gpu-memory-utilization 0.5 --enforce-eager --out "$OUT/replay" \
    || fail "dynbranch replay exited with status $?"

phase "check the summary"
"$PY" - "$OUT/replay" <<'EOF' || fail "the replay's results are not what a smoke run needs"
import json, sys
import pandas as pd
out = sys.argv[1]
s = json.load(open(f"{out}/summary.json"))
keys = ("engine", "backend", "requests", "completed", "failed", "accuracy", "mean_latency_s",
        "p99_latency_s", "prompt_tokens", "output_tokens", "errors", "wall_s")
print(json.dumps({k: s.get(k) for k in keys}, indent=2))
requests = pd.read_parquet(f"{out}/requests.parquet")
assert (s["engine"], s["backend"]) == ("vllm", "ray"), (s["engine"], s["backend"])
assert s["requests"] == len(requests) == 10 and s["completed"] + s["failed"] == 10
assert s["completed"] >= 1, "no request completed"
assert s["engine_config"]["max_model_len"] == 40960, s["engine_config"]
# NOTE: Ray names a remote error "RayTaskError(PromptTooLongError)". The tiny model's context
# holds every BFCL prompt, so no request may be refused as too long, and the engine may not
# fail or break its protocol; a tool that rejects a garbage call is a typed request failure.
inner = {k.split("(")[-1].rstrip(")"): v for k, v in s["errors"].items()}
broken = {k: v for k, v in inner.items()
          if k in ("EngineError", "VLLMAPIError", "PromptTooLongError")}
assert not broken, f"engine failures: {broken}"
assert not requests.error.str.startswith("unexpected").any(), "an untyped failure"
assert s["output_tokens"] > 0, "the engine generated nothing"
print(f"smoke OK: {s['completed']} completed, {s['failed']} failed with typed errors")
EOF

echo "== [${SECONDS}s] gpu smoke passed; results in $OUT/"
