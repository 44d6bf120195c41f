"""BFCL from PyPI: the pinned ``bfcl-eval`` wheel, fetched without its dependencies.

BFCL's data and its executable multi-turn API classes ship in the ``bfcl-eval`` wheel on
PyPI (DESIGN.md §4, "Where data comes from"). The wheel's declared dependencies pin
``numpy==1.26.4`` and pull torch, faiss and vendor SDKs, so it is never installed:
:func:`fetch_bfcl` downloads the pinned wheel with ``pip download --no-deps``, checks its
SHA-256 and extracts only data, the API classes' source files and the package metadata that
carries the licence, into the per-user cache (:func:`dynbranch.datasets.cache_dir`).
:func:`bfcl_root` is the extracted tree the routing workload reads; ``dynbranch data bfcl``
fetches it alone.

It lives beside the routing workload, its only reader: the generic data locations
(the data directory, the cache, checksums, the registry of the other sets) are
:mod:`dynbranch.datasets`, which knows nothing of BFCL.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from dynbranch.datasets import DatasetInfo, sha256_file
from dynbranch.errors import ChecksumError, DataFetchError, DataMissingError
from workloads.routing.categories import CATEGORIES, IRRELEVANCE

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


BFCL = DatasetInfo(
    "bfcl",
    BFCL_PYPI,
    "Apache-2.0",
    tuple(f"{_BFCL_DATA}/BFCL_v4_{c}.json" for c in CATEGORIES)
    + tuple(f"{_BFCL_DATA}/possible_answer/BFCL_v4_{c}.json" for c in CATEGORIES
            if c not in IRRELEVANCE)
    + tuple(f"{_BFCL_DATA}/multi_turn_func_doc/{d}.json" for d in _BFCL_DOCS)
    + tuple(f"{_API_DIR}/{d}.py" for d in (*_BFCL_DOCS, "long_context"))
    + (_BFCL_CONFIG, _BFCL_METADATA),
)
"""BFCL as a data set: its source, licence and the files of the extracted wheel
(relative to :func:`bfcl_dir`) that DynBranch reads."""


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
    missing = [f for f in BFCL.files if f not in manifest]
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
