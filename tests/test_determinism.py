"""A replay's results do not depend on where its objects land in memory or on string hashing.

Two processes replay the same ReAct drafter run (the drafter renders evidence into a prompt,
so anything address-dependent there shows up in engine times) on the shipped MuSiQue fixture:
one with ``PYTHONHASHSEED=0``, the other with another hash seed and 50,000 objects allocated
first. Their request and stage tables must be equal to the bit.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUSIQUE = Path(__file__).parent / "fixtures" / "musique"

SCRIPT = """
import hashlib, json, sys
junk = [{"k": i, "v": [i] * 3} for i in range(int(sys.argv[2]))]
from dynbranch.driver import ReplayConfig, prepare, run_replay
cfg = ReplayConfig(workload="react", arm="c2", backend="local", clock="virtual", requests=12,
                   rate=0.5, gate="fixed-threshold", p_star=0.3, predictor="drafter",
                   data_dir=sys.argv[3], out=sys.argv[1], progress=False)
result = run_replay(prepare(cfg, progress=lambda m: None), keep_log=False)
import pandas as pd
digests = {}
for name in ("requests", "stages"):
    frame = pd.read_parquet(f"{sys.argv[1]}/{name}.parquet")
    digests[name] = hashlib.sha256(frame.to_json().encode()).hexdigest()
print(json.dumps({"mean": result.summary["mean_latency_s"], **digests}))
"""


def _replay(out: Path, hash_seed: int, junk: int) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(junk), str(MUSIQUE)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_drafter_replay_is_the_same_whatever_the_heap_and_the_hash_seed(tmp_path):
    first = _replay(tmp_path / "a", 0, 0)
    second = _replay(tmp_path / "b", 12345, 50_000)
    assert first == second
