#!/usr/bin/env bash
# Start a Ray node that offers DynBranch engines (one `dynbranch_engine` unit per GPU), with
# token authentication always on and the dashboard (and its job API) on localhost only.
#
#   ray_cluster/start_node.sh --head [ENGINES] [options] [-- RAY_START_ARGS...]
#   ray_cluster/start_node.sh HEAD_IP:PORT [ENGINES] --token-file FILE [options] [-- ...]
#
# ENGINES defaults to the number of GPUs nvidia-smi sees (4 without a GPU, for sim engines).
# Options:
#   --token-file FILE   the cluster's token. Head: created there (mode 0600) when missing;
#                       default $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token. Workers need the
#                       head's token as a file: copy it over (scp), never paste it on a
#                       command line, where `ps` and shell history would show it.
#   --node-ip IP        the address other nodes reach this one at (a private or overlay IP)
#   --node-ip-in NET    the same, found among this node's addresses in the subnet NET (e.g.
#                       a vast.ai overlay's 10.0.0.0/24): one command serves every node
#   --port PORT         the head's GCS port (default 6379)
#   --dashboard-port P  the head's dashboard and job API port (default 8265, on 127.0.0.1)
#   --block             stay in the foreground; stopping the script (Ctrl-C, SIGTERM) stops
#                       exactly the Ray processes it started
#   --dry-run           print the `ray start` command instead of running it (no token made)
#
# NOTE: this script never runs `ray stop`, which ends EVERY Ray instance on the machine
# (other users' included). A port already taken makes `ray start` fail with a message; stop
# your own instance by ending its `--block` process, or with `ray stop` only when you know it
# is the only one.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
fail() { echo "start_node.sh: $*" >&2; exit 1; }

[ $# -ge 1 ] || usage
role=$1; shift
case "$role" in -h|--help) usage ;; -*) [ "$role" = "--head" ] || fail "unknown role $role" ;; esac
engines=""
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then engines=$1; shift; fi
token_file="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
node_ip="" subnet="" port=6379 dashboard_port=8265 block="" dry=""
while [ $# -gt 0 ]; do
  case "$1" in
    --token-file) token_file=${2:?--token-file needs a path}; shift 2 ;;
    --node-ip) node_ip=${2:?--node-ip needs an address}; shift 2 ;;
    --node-ip-in) subnet=${2:?--node-ip-in needs a subnet}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --dashboard-port) dashboard_port=${2:?--dashboard-port needs a number}; shift 2 ;;
    --block) block="--block"; shift ;;
    --dry-run) dry="echo"; shift ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) fail "unknown option $1 (see --help)" ;;
  esac
done

if [ -z "$engines" ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  engines=$([ "${gpus:-0}" -gt 0 ] && echo "$gpus" || echo 4)
fi
resources="{\"dynbranch_engine\": ${engines}}"
if [ -n "$subnet" ]; then
  node_ip=$(ip -4 -o addr show 2>/dev/null | python3 -c '
import ipaddress, sys
net = ipaddress.ip_network(sys.argv[1], strict=False)
found = [f.split()[f.split().index("inet") + 1] for f in sys.stdin if " inet " in f]
hits = [str(ipaddress.ip_interface(a).ip) for a in found if ipaddress.ip_interface(a).ip in net]
sys.exit(0 if hits and print(hits[0]) is None else 1)' "$subnet") \
    || fail "no address of this node is in $subnet (see: ip -4 -o addr show)"
fi
ip_args=()
[ -n "$node_ip" ] && ip_args=(--node-ip-address="$node_ip")

# Ray reads the token from the file RAY_AUTH_TOKEN_PATH names; RAY_AUTH_MODE=token makes every
# process of this node (raylet, workers, this script's `ray` calls) require and send it.
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$token_file"
unset RAY_AUTH_TOKEN  # NOTE: the file is the one source; a stray variable would override it

if [ "$role" = "--head" ]; then
  if [ -n "$dry" ]; then
    :  # NOTE: a dry run shows the command only; it writes no token
  elif [ ! -s "$token_file" ]; then
    mkdir -p "$(dirname "$token_file")"
    # NOTE: Ray's own generator (256 random bits), written under umask 077: owner-only.
    (umask 077 && python3 -c 'import secrets, sys; sys.stdout.write(secrets.token_hex(32))' \
        > "$token_file") || fail "could not write a token to $token_file"
    echo "start_node.sh: generated a new cluster token in $token_file (mode 0600)" >&2
  fi
  [ -n "$dry" ] || chmod 600 "$token_file"
  echo "start_node.sh: head with ${engines} dynbranch_engine, token auth on, dashboard and" \
       "job API on 127.0.0.1:${dashboard_port} (reach it through an SSH tunnel)" >&2
  exec $dry ray start --head $block --port="$port" "${ip_args[@]}" \
    --dashboard-host=127.0.0.1 --dashboard-port="$dashboard_port" \
    --resources="$resources" "$@"
fi

[ -n "$dry" ] || [ -s "$token_file" ] || fail "no token at $token_file: copy the head's token file here \
(e.g. scp HEAD:~/.ray/auth_token $token_file; chmod 600 $token_file) or pass --token-file"
[ -n "$dry" ] || chmod 600 "$token_file"
exec $dry ray start $block --address="$role" "${ip_args[@]}" --resources="$resources" "$@"
