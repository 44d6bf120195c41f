#!/usr/bin/env bash
# Start a Ray node that offers DynBranch engines: one `dynbranch_engine` unit per GPU.
#   ray_cluster/start_node.sh --head [ENGINES]         on the head node
#   ray_cluster/start_node.sh HEAD_IP:6379 [ENGINES]   on every other node
# ENGINES defaults to the number of GPUs nvidia-smi sees (or 4 without a GPU, for sim engines).
set -euo pipefail
role=${1:?usage: start_node.sh --head|HEAD_ADDRESS [ENGINES]}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
engines=${2:-$([ "${gpus:-0}" -gt 0 ] && echo "$gpus" || echo 4)}
resources="{\"dynbranch_engine\": ${engines}}"
ray stop >/dev/null 2>&1 || true
if [ "$role" = "--head" ]; then
  exec ray start --head --port=6379 --dashboard-host=0.0.0.0 --resources="$resources"
else
  exec ray start --address="$role" --resources="$resources"
fi
