#!/usr/bin/env bash
# One multi-GPU machine (the 4xH200 box): start a Ray head with one `dynbranch_engine` per GPU
# and token auth on, then submit a replay on the vLLM engine through the job API.
#
#   ray_cluster/single_box.sh [options] [-- EXTRA_REPLAY_FLAGS...]
#
# Options (defaults in brackets):
#   --model ID|DIR        [Qwen/Qwen3-32B] fetched once into this machine's HF cache
#   --engine-config FILE  [ray_cluster/engines/qwen3-32b@h200.toml]
#   --workload W --arm A --requests N --rate R   [routing full 30 1.0]
#   --out DIR             [runs/single-box] (the replay's result directory, absolute or not)
#   --gpus N              [what nvidia-smi counts] engines, one per GPU
#   --port P --dashboard-port P   [6390 8266] this head's ports (not Ray's defaults, so an
#                         instance someone else started on 6379/8265 is left alone)
#   --keep                leave the head running after the replay (stop it: kill HEAD_PID)
#   --dry-run             print the commands, run none
#
# Needs `pip install -e '.[vllm]'` in the Python that runs `ray`. The head stops when the
# script ends (unless --keep): it runs `start_node.sh --block`, so only its own Ray processes
# stop; nothing here runs `ray stop`. The token is ~/.ray/auth_token (made on first use).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="Qwen/Qwen3-32B" config="$ROOT/ray_cluster/engines/qwen3-32b@h200.toml"
workload=routing arm=full requests=30 rate=1.0 out="runs/single-box" gpus=""
port=6390 dashboard_port=8266 keep="" dry=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --engine-config) config=$2; shift 2 ;;
    --workload) workload=$2; shift 2 ;;
    --arm) arm=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dashboard-port) dashboard_port=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "single_box.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "single_box.sh: FAILED: $*" >&2; exit 1; }
run() { if [ -n "$dry" ]; then printf '%q ' "$@"; echo; else "$@"; fi; }

if [ -z "$gpus" ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "${gpus:-0}" -gt 0 ] || fail "nvidia-smi sees no GPU (pass --gpus N to override)"
fi
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac  # NOTE: a job runs in an uploaded copy
token="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$token"

if [ -z "$dry" ]; then
  python3 -c 'import vllm, dynbranch' 2>/dev/null \
    || fail "this Python lacks vLLM or DynBranch: pip install -e '$ROOT[vllm]'"
fi
echo "== fetch $model and the $workload data (once; cached afterwards)"
run python3 -m dynbranch model fetch "$model"
run python3 -m dynbranch data bfcl

echo "== start the head: $gpus dynbranch_engine, token auth on, dashboard on 127.0.0.1"
if [ -n "$dry" ]; then
  run bash "$ROOT/ray_cluster/start_node.sh" --head "$gpus" --port "$port" \
    --dashboard-port "$dashboard_port" --block
else
  bash "$ROOT/ray_cluster/start_node.sh" --head "$gpus" --port "$port" \
    --dashboard-port "$dashboard_port" --block &
  HEAD_PID=$!
  [ -n "$keep" ] || trap 'kill "$HEAD_PID" 2>/dev/null; wait "$HEAD_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 120); do
    ray job list --address "http://127.0.0.1:$dashboard_port" >/dev/null 2>&1 && break
    kill -0 "$HEAD_PID" 2>/dev/null || fail "the head did not start (see its output above)"
    sleep 2
  done
  ray job list --address "http://127.0.0.1:$dashboard_port" >/dev/null \
    || fail "the job API on 127.0.0.1:$dashboard_port did not answer within 240 s"
  echo "head running (pid $HEAD_PID)"
fi

echo "== replay: $requests $workload requests, arm $arm, on $gpus vLLM engines"
cd "$ROOT"
run ray job submit --address "http://127.0.0.1:$dashboard_port" --working-dir . -- \
  python -m dynbranch replay --workload "$workload" --arm "$arm" --engine vllm \
  --model "$model" --engine-config "$config" --workers "$gpus" --requests "$requests" \
  --rate "$rate" --address auto --out "$out" "$@"
[ -n "$dry" ] || echo "== results in $out (summary.json, requests.parquet, stages.parquet)"
