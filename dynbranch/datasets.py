"""Where workload data comes from: the data directory, the per-user cache, checksums.

Two places hold data (DESIGN.md §4, "Where data comes from"):

* the **data directory** holds the sets copied from their official sources (MuSiQue,
  HotpotQA, SGD, SWE-agent trajectories; :data:`DATASETS`) and a ``SHA256SUMS`` file. It is
  the ``--data-dir`` flag, else ``$DYNBRANCH_DATA``, else ``../shared/data`` beside a
  checkout (or beside the current directory), else ``data/`` in the per-user cache
  (:func:`resolve_data_dir`);
* the **cache** (:func:`cache_dir`: ``$DYNBRANCH_CACHE``, else ``~/.cache/dynbranch``) holds
  what DynBranch fetches itself: BFCL, from the ``bfcl-eval`` wheel on PyPI. Fetching and
  reading that wheel is the routing workload's (:mod:`workloads.routing.bfcl_wheel`); the
  core knows only where the cache is.

No machine here can reach the data directory sets' official sources, so :func:`fetch` names
the source and where to put the files instead of downloading them. :func:`read_jsonl` is
the one JSON Lines reader of every loader. Pure Python, no Ray.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from dynbranch.errors import (
    DataFetchError,
    DataMissingError,
    MalformedRecordError,
    UnknownNameError,
)


@dataclass(frozen=True)
class DatasetInfo:
    """A data set: its official source, its licence and the files DynBranch reads.

    ``files`` are relative to the set's directory: ``<data dir>/<name>/`` for the sets in the
    data directory (BFCL's are relative to its extracted wheel).
    """

    name: str
    source: str
    licence: str
    files: tuple[str, ...]


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
    """The directory of data set ``name`` in ``data_dir``, with every file it must have.

    Raises :class:`DataMissingError` saying where it looked and how to get the set. BFCL is
    not a data directory set: it lives in the cache
    (:func:`workloads.routing.bfcl_wheel.bfcl_root`).
    """
    info = dataset_info(name)
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
        f"SHA256SUMS with `dynbranch data {info.name} --check`."
    )


def fetch(name: str, data_dir: Path | None = None) -> Path:
    """Fetch data set ``name`` from its official source into ``data_dir``.

    The sources of the data directory sets are unreachable from the machines this was built
    on, so this raises :class:`DataFetchError` naming the source and where to place the
    files; their layout and checksums are checked by :func:`require_dataset` and
    :func:`verify_checksums`. (BFCL, which PyPI serves, is fetched by
    :func:`workloads.routing.bfcl_wheel.fetch_bfcl`.)
    """
    info = dataset_info(name)
    raise DataFetchError(
        name,
        info.source,
        "DynBranch does not download this set itself. " + _how_to_get(info, data_dir),
    )


# -- reading --------------------------------------------------------------------------------

MISSING_FILE = "The file is missing."
"""What :func:`read_jsonl` says about a missing file unless its caller knows better."""


def read_jsonl(
    path: Path, what: str, how: str = MISSING_FILE
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each non-blank line of the JSON Lines file ``path``.

    ``what`` names the data set the file belongs to. A missing file raises
    :class:`~dynbranch.errors.DataMissingError` (``what``, the path, and ``how`` to get it);
    a line that is not JSON, or not a JSON object, raises
    :class:`~dynbranch.errors.MalformedRecordError` naming the file and ``line n``. Line
    numbers count from 1 and include blank lines, so they match an editor's. NOTE: the file
    is read line by line, split at line ends only, not at the other separators
    ``str.splitlines`` knows (such as U+2028), which a record's strings may hold.
    """
    path = Path(path)
    if not path.is_file():
        raise DataMissingError(what, [str(path)], how)
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise MalformedRecordError(str(path), f"line {n}", f"not JSON: {e}") from None
            if not isinstance(record, dict):
                raise MalformedRecordError(str(path), f"line {n}", "not a JSON object")
            yield n, record


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
