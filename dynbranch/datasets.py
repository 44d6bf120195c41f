"""Where workload data comes from: the data directory, the per-user cache, and BFCL from PyPI.

Two places hold data (DESIGN.md §4, "Where data comes from"):

* the **data directory** holds the sets copied from their official sources (MuSiQue,
  HotpotQA, SGD, SWE-agent trajectories) and a ``SHA256SUMS`` file. It is the ``--data-dir``
  flag, else ``$DYNBRANCH_DATA``, else ``../shared/data`` beside a checkout (or beside the
  current directory), else ``data/`` in the per-user cache (:func:`resolve_data_dir`);
* the **cache** (``$DYNBRANCH_CACHE``, else ``~/.cache/dynbranch``) holds what DynBranch fetches
  itself: BFCL, whose data and executable multi-turn API classes ship in the ``bfcl-eval``
  wheel on PyPI. The wheel's declared dependencies pin ``numpy==1.26.4`` and pull torch,
  faiss and vendor SDKs, so it is never installed: :func:`fetch_bfcl` downloads the pinned
  wheel without dependencies, checks its SHA-256 and extracts only data, the API classes'
  source files and the package metadata that carries the licence.

No machine here can reach the other sets' official sources, so :func:`fetch` names the
source and where to put the files instead of downloading them. Pure Python, no Ray.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from dynbranch.errors import (
    ChecksumError,
    DataFetchError,
    DataMissingError,
    UnknownNameError,
)

BFCL_VERSION = "2026.3.23"
BFCL_WHEEL = f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl"
BFCL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
BFCL_PYPI = f"https://pypi.org/project/bfcl-eval/{BFCL_VERSION}/"
BFCL_DIRNAME = f"bfcl_eval-{BFCL_VERSION}"
_MANIFEST = ".dynbranch-manifest.json"
_API_DIR = "bfcl_eval/eval_checker/multi_turn_eval/func_source_code"
# NOTE: the empty package __init__ files are kept so the extracted tree has the wheel's
# layout; nothing in it is executed except the API class modules the routing workload loads.
_BFCL_INITS = frozenset(
    {
        "bfcl_eval/__init__.py",
        "bfcl_eval/constants/__init__.py",
        "bfcl_eval/eval_checker/__init__.py",
        "bfcl_eval/eval_checker/multi_turn_eval/__init__.py",
        f"{_API_DIR}/__init__.py",
    }
)
_BFCL_CONFIG = "bfcl_eval/constants/executable_backend_config.py"
# The wheel ships no LICENSE file; its METADATA carries "License: Apache 2.0".
_BFCL_METADATA = f"bfcl_eval-{BFCL_VERSION}.dist-info/METADATA"


@dataclass(frozen=True)
class DatasetInfo:
    """A data set: its official source, its licence and the files DynBranch reads.

    ``files`` are relative to the set's directory: ``<data dir>/<name>/`` for the sets in the
    data directory, the extracted wheel (:func:`bfcl_dir`) for BFCL.
    """

    name: str
    source: str
    licence: str
    files: tuple[str, ...]
    in_cache: bool = False


_BFCL_DATA = "bfcl_eval/data"
_BFCL_DOCS = (
    "gorilla_file_system",
    "math_api",
    "message_api",
    "posting_api",
    "ticket_api",
    "trading_bot",
    "travel_booking",
    "vehicle_control",
)

_MARSHMALLOW = "marshmallow-code__marshmallow-1867"
_SWEAGENT_DEMOS = (
    "function_calling_simple",
    "gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1__6e44b9"
    "__sweagenttestrepo-1c2844",
    "gpt4__swe-agent__test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1"
    "__swe-agent__test-repo-i1",
    "gpt4__swe-bench-dev-easy_first_only__default__t-0.00__p-0.95__c-3.00__install-1"
    "__pydicom__pydicom-1458",
    "human_thought__swe-bench-HumanEvalFix-python__lcb__t-0.00__p-0.95__c-4.00__install-0"
    "__humanevalfix-python-0",
    f"replay__{_MARSHMALLOW}__default__t-0.20__p-0.95__c-2.00__install-1___install_from_source"
    f"__{_MARSHMALLOW}",
    *(
        f"replay__{_MARSHMALLOW}__{variant}__t-0.20__p-0.95__c-2.00__install-1__{_MARSHMALLOW}"
        for variant in (
            "default_sys-env_cursors_window100",
            "default_sys-env_window100",
            "xml_sys-env_cursors_window100",
            "xml_sys-env_window100",
        )
    ),
    *(
        f"replay__{_MARSHMALLOW}__{variant}__{_MARSHMALLOW}"
        for variant in (
            "function_calling__install-1",
            "function_calling_replace__install-1",
            "function_calling_replace_from_source",
        )
    ),
)

DATASETS: Mapping[str, DatasetInfo] = MappingProxyType(
    {
        "bfcl": DatasetInfo(
            "bfcl",
            BFCL_PYPI,
            "Apache-2.0",
            tuple(
                f"{_BFCL_DATA}/{p}BFCL_v4_{c}.json"
                for c in ("multi_turn_base", "multiple", "parallel_multiple")
                for p in ("", "possible_answer/")
            )
            + tuple(f"{_BFCL_DATA}/multi_turn_func_doc/{d}.json" for d in _BFCL_DOCS)
            + tuple(f"{_API_DIR}/{d}.py" for d in (*_BFCL_DOCS, "long_context"))
            + (_BFCL_CONFIG, _BFCL_METADATA),
            in_cache=True,
        ),
        "musique": DatasetInfo(
            "musique",
            "https://github.com/StonyBrookNLP/musique",
            "CC BY 4.0",
            (
                "dev_2417_decompositions.json",
                "dev_200_full.jsonl",
                "dev_200_paragraph_corpus.jsonl",
                "hipporag_train_100.json",
                "hipporag_train_100_corpus.json",
                "LICENSE-MuSiQue-CC-BY-4.0.txt",
                "LICENSE-HippoRAG-MIT.txt",
            ),
        ),
        "hotpotqa": DatasetInfo(
            "hotpotqa",
            "https://hotpotqa.github.io/",
            "CC BY-SA 4.0",
            (
                "amor_test_500.jsonl",
                "tts_sampled_500.json",
                "migres_200.jsonl",
                "hotpotqa_corpus.jsonl",
            ),
        ),
        "sgd": DatasetInfo(
            "sgd",
            "https://github.com/google-research-datasets/dstc8-schema-guided-dialogue",
            "CC BY-SA 4.0",
            tuple(f"dev/dialogues_{i:03d}.json" for i in range(1, 12))
            + (
                "dev/schema.json",
                "test/schema.json",
                "offer_pick_pairs_dev_test.jsonl",
                "LICENSE.txt",
                "README.md",
                "dstc8.md",
            ),
        ),
        "swe_agent": DatasetInfo(
            "swe_agent",
            "https://github.com/SWE-agent/mini-swe-agent",
            "MIT",
            (
                "mini_swe_agent_gemini3pro_verified_commands.jsonl",
                "mini_swe_agent_gemini3pro_verified_results_summary.json",
                "mini_swe_agent_gemini3pro_verified_results_summary.csv",
                "LICENSE-mini-swe-agent-MIT.md",
                "LICENSE-SWE-agent-MIT.txt",
            )
            + tuple(
                f"mini_swe_agent_raw/{i}.traj.json"
                for i in ("astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590")
            )
            + tuple(f"sweagent_demos/{d}.traj" for d in _SWEAGENT_DEMOS),
        ),
    }
)


# -- locations ------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The per-user cache: ``$DYNBRANCH_CACHE``, else ``~/.cache/dynbranch``."""
    env = os.environ.get("DYNBRANCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dynbranch"


def data_dir_candidates(flag: str | None = None) -> list[tuple[str, Path]]:
    """Where :func:`resolve_data_dir` looks, in order, each with what pointed there.

    An explicit choice (the flag, else ``$DYNBRANCH_DATA``) is the only candidate: a data
    directory the user named but that does not exist must not silently become another one.
    """
    if flag:
        return [("--data-dir", Path(flag).expanduser())]
    env = os.environ.get("DYNBRANCH_DATA")
    if env:
        return [("$DYNBRANCH_DATA", Path(env).expanduser())]
    found: list[tuple[str, Path]] = []
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "setup.cfg").is_file() or (checkout / "pyproject.toml").is_file():
        found.append(("checkout", checkout.parent / "shared" / "data"))
    found.append(("current directory", Path.cwd().parent / "shared" / "data"))
    found.append(("cache", cache_dir() / "data"))
    unique: list[tuple[str, Path]] = []
    for why, path in found:
        if all(path.resolve() != p.resolve() for _, p in unique):
            unique.append((why, path))
    return unique


def resolve_data_dir(flag: str | None = None) -> Path | None:
    """The data directory to read: the first candidate that exists, or ``None``."""
    for _, path in data_dir_candidates(flag):
        if path.is_dir():
            return path
    return None


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` called ``name`` (:class:`UnknownNameError` otherwise)."""
    try:
        return DATASETS[name]
    except KeyError:
        raise UnknownNameError("data set", name, list(DATASETS)) from None


def require_dataset(data_dir: Path | None, name: str) -> Path:
    """The directory of data set ``name``, with every file it must have.

    Raises :class:`DataMissingError` saying where it looked and how to get the set. BFCL
    lives in the cache, not the data directory: for it this is :func:`bfcl_root`.
    """
    info = dataset_info(name)
    if info.in_cache:
        return bfcl_root(cache_dir())
    if data_dir is None:
        looked = [f"{path} ({why})" for why, path in data_dir_candidates(None)]
        raise DataMissingError(name, looked, _how_to_get(info, None))
    where = Path(data_dir) / name
    missing = [f for f in info.files if not (where / f).is_file()]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise DataMissingError(
            name, [str(where)], f"Missing: {shown}. {_how_to_get(info, Path(data_dir))}"
        )
    return where


def _how_to_get(info: DatasetInfo, data_dir: Path | None) -> str:
    target = f"{data_dir / info.name}/" if data_dir else f"<data dir>/{info.name}/"
    return (
        f"Get it from its official source {info.source} ({info.licence}) and place the "
        f"files under {target} as data/README.md describes (pass --data-dir or set "
        f"$DYNBRANCH_DATA to choose the data directory); then check them against "
        f"SHA256SUMS with `dynbranch data {info.name}`."
    )


def fetch(
    name: str,
    cache: Path | None = None,
    data_dir: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """Fetch data set ``name`` from its official source; returns its directory.

    Only BFCL can be fetched (from PyPI). The other sources are unreachable from the machines
    this was built on, so for them this raises :class:`DataFetchError` naming the source and
    where to place the files; their layout and checksums are checked by
    :func:`require_dataset` and :func:`verify_checksums`.
    """
    info = dataset_info(name)
    if info.in_cache:
        return fetch_bfcl(cache if cache is not None else cache_dir(), progress)
    raise DataFetchError(
        name,
        info.source,
        "DynBranch does not download this set itself. " + _how_to_get(info, data_dir),
    )


# -- checksums ------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_sha256sums(path: Path) -> dict[str, str]:
    """``SHA256SUMS`` (``<hex>  ./<relative path>`` per line, as ``sha256sum`` writes it)."""
    sums: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, rel = line.partition("  ")
        if not sep:
            digest, sep, rel = line.partition(" *")  # binary-mode marker
        if not sep or len(digest) != 64:
            raise ValueError(f"{path}:{n}: not a sha256sum line: {line!r}")
        sums[str(PurePosixPath(rel.strip()))] = digest.lower()
    return sums


def verify_checksums(data_dir: Path, datasets: tuple[str, ...] | None = None) -> list[str]:
    """Check the files listed in ``data_dir/SHA256SUMS``; returns the problems found.

    ``datasets`` limits the check to those sets' directories. An empty list means every
    listed file is present with the listed digest.
    """
    sums_path = Path(data_dir) / "SHA256SUMS"
    if not sums_path.is_file():
        return [f"missing: {sums_path} (cannot check anything without it)"]
    try:
        sums = read_sha256sums(sums_path)
    except ValueError as e:
        return [f"unreadable: {e}"]
    problems = []
    for rel, expected in sorted(sums.items()):
        if datasets is not None and rel.split("/", 1)[0] not in datasets:
            continue
        path = Path(data_dir) / rel
        if not path.is_file():
            problems.append(f"missing: {rel}")
        elif (actual := sha256_file(path)) != expected:
            problems.append(f"mismatch: {rel} has sha256 {actual}, expected {expected}")
    return problems


# -- BFCL from PyPI -------------------------------------------------------------------------


def bfcl_dir(cache: Path) -> Path:
    """Where the extracted wheel lives in the cache (whether or not it is there yet)."""
    return Path(cache) / "bfcl" / BFCL_DIRNAME


def bfcl_root(cache: Path) -> Path:
    """The extracted BFCL tree in ``cache``; :class:`DataMissingError` when absent or broken."""
    target = bfcl_dir(cache)
    if not _intact(target):
        raise DataMissingError(
            "bfcl",
            [str(target)],
            f"Run `dynbranch data bfcl` to fetch bfcl-eval {BFCL_VERSION} from PyPI without its "
            f"dependencies ({BFCL_PYPI}).",
        )
    return target


def fetch_bfcl(
    cache: Path, progress: Callable[[str], None] = print, wheel_source: Path | None = None
) -> Path:
    """Fetch the pinned ``bfcl-eval`` wheel into ``cache`` and extract what DynBranch reads.

    Idempotent: returns at once when the extracted tree is present and intact. Otherwise
    downloads the wheel with ``pip download --no-deps`` (or copies it from ``wheel_source``,
    a wheel file or a folder holding one), checks its SHA-256 (:class:`ChecksumError` if it
    differs), extracts into a temporary folder and renames that into place, so a reader
    never sees a half-written tree.
    """
    target = bfcl_dir(cache)
    if _intact(target):
        return target
    origin = "PyPI" if wheel_source is None else f"{wheel_source} (a copy of the PyPI wheel)"
    progress(
        f"fetching bfcl-eval {BFCL_VERSION} (BFCL data and API classes) from {origin} "
        f"without its dependencies into {target}"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        wheel = _copy_wheel(wheel_source, work) if wheel_source else _pip_download(work)
        actual = sha256_file(wheel)
        if actual != BFCL_SHA256:
            wheel.unlink()
            raise ChecksumError("bfcl", BFCL_PYPI, wheel.name, BFCL_SHA256, actual)
        staging = work / BFCL_DIRNAME
        _extract_bfcl(wheel, staging)
        if _intact(target):  # another fetch finished meanwhile
            return target
        if target.exists():  # a broken earlier tree: move it aside, it goes with `tmp`
            target.rename(work / "broken")
        try:
            staging.rename(target)
        except OSError:
            if not _intact(target):  # NOTE: losing a race to another fetch is fine
                raise
    return target


def _pip_download(dest: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``dest``; returns the wheel's path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
        f"bfcl-eval=={BFCL_VERSION}",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DataFetchError("bfcl", BFCL_PYPI, f"pip download failed: {e}") from e
    wheel = dest / BFCL_WHEEL
    if done.returncode != 0 or not wheel.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise DataFetchError(
            "bfcl", BFCL_PYPI, f"pip download exited {done.returncode}: {' | '.join(tail)}"
        )
    return wheel


def _copy_wheel(source: Path, dest: Path) -> Path:
    source = Path(source)
    wheel = source / BFCL_WHEEL if source.is_dir() else source
    if not wheel.is_file():
        raise DataFetchError("bfcl", str(source), f"no {BFCL_WHEEL} there")
    return Path(shutil.copy2(wheel, dest / BFCL_WHEEL))


def _wanted(name: str) -> bool:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        return False
    if name.startswith(f"{_BFCL_DATA}/") and not name.endswith("/"):
        return True
    if str(path.parent) == _API_DIR and path.suffix == ".py":
        return True
    return name in _BFCL_INITS or name in (_BFCL_CONFIG, _BFCL_METADATA)


def _extract_bfcl(wheel: Path, staging: Path) -> None:
    manifest: dict[str, list] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not _wanted(info.filename):
                continue
            out = staging / info.filename
            out.parent.mkdir(parents=True, exist_ok=True)
            data = zf.read(info)
            out.write_bytes(data)
            manifest[info.filename] = [hashlib.sha256(data).hexdigest(), len(data)]
    missing = [f for f in DATASETS["bfcl"].files if f not in manifest]
    if missing:
        raise DataFetchError("bfcl", BFCL_PYPI, f"the wheel lacks {missing}")
    (staging / _MANIFEST).write_text(
        json.dumps({"wheel": BFCL_WHEEL, "sha256": BFCL_SHA256, "files": manifest}, indent=1)
    )


def _intact(target: Path) -> bool:
    """Whether every file the manifest lists is there with its size (:func:`verify_bfcl`
    re-hashes them)."""
    try:
        files = json.loads((target / _MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return False
    for rel, (_, size) in files.items():
        try:
            if (target / rel).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def verify_bfcl(cache: Path) -> list[str]:
    """Re-hash every extracted BFCL file against the manifest; returns the problems."""
    target = bfcl_dir(cache)
    try:
        files = json.loads((target / _MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return [f"missing: {target / _MANIFEST}"]
    problems = []
    for rel, (digest, _) in sorted(files.items()):
        path = target / rel
        if not path.is_file():
            problems.append(f"missing: {rel}")
        elif sha256_file(path) != digest:
            problems.append(f"mismatch: {rel}")
    return problems
