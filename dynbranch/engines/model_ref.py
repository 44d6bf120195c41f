"""Where a real engine's model comes from: a local directory or a Hugging Face model id.

``--model`` may name a directory (it must hold ``config.json``) or a hub id such as
``Qwen/Qwen3-8B``. An id is looked up in the node's Hugging Face cache (``$HF_HOME``, by
default ``~/.cache/huggingface``) and downloaded there once when it is missing: every engine
on a node resolves the same id to the same snapshot directory, and ``huggingface_hub``'s file
locks make concurrent engines share one download. On a Ray cluster each node resolves on its
own, when its engines start, so weights never travel through the driver.

A model that cannot be had is a typed error before the engine starts:
:class:`~dynbranch.errors.ModelNotFoundError` for a directory that is not there (or has no
``config.json``), :class:`ModelUnavailableError` for an id that is neither cached nor
downloadable (offline, unknown, gated), naming the id, the cache and how to get it.
"""

from __future__ import annotations

import re
from pathlib import Path

from dynbranch.errors import ConfigError, ModelNotFoundError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
"""``owner/name``: the form of a Hugging Face model id (no leading ``/``, ``.`` or ``~``)."""
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
"""Files fetched for an id: config, safetensors weights, tokenizer (no ``.bin``/``.pt``)."""
MAKE_TINY = "Build a tiny test model with `dynbranch model make-tiny DIR`."


class ModelUnavailableError(ConfigError):
    """A hub model id that is neither in the node's Hugging Face cache nor downloadable."""

    def __init__(self, model_id: str, cache: str, problem: str) -> None:
        self.model_id, self.cache, self.problem = model_id, cache, problem
        super().__init__(
            f"model {model_id!r} is not in the Hugging Face cache at {cache} and could not "
            f"be downloaded: {problem}. Fetch it once per node with `hf download {model_id}` "
            f"(or `huggingface-cli download {model_id}`; set HF_TOKEN for a gated model), "
            f"or pass --model a local directory"
        )


def is_hub_id(model: str) -> bool:
    """Whether ``model`` reads as a hub id rather than a path (and no such path exists)."""
    return bool(HUB_ID.match(model)) and not Path(model).exists()


def check_model_ref(model: str) -> None:
    """Refuse a ``--model`` that is neither an existing model directory nor a hub id.

    Checks the form only (no download): the engines resolve a hub id where they run.
    """
    if is_hub_id(model):
        return
    if not (Path(model).expanduser() / "config.json").is_file():
        raise ModelNotFoundError(model, MAKE_TINY)


def resolve_model(model: str, *, revision: str | None = None, download: bool = True) -> Path:
    """The local directory of ``model``: itself, or the cached (downloaded) snapshot of an id."""
    if not is_hub_id(model):
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(str(model), MAKE_TINY)
        return path
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ConfigError(
            f"--model {model} is a Hugging Face id, which needs huggingface_hub "
            f"(pip install '.[hf]' or '.[vllm]'); or pass a local directory"
        ) from None
    cache = str(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception as cached_miss:  # NOTE: huggingface_hub's own errors; any means "not cached"
        miss = cached_miss
    offline = bool(constants.HF_HUB_OFFLINE)
    if not download or offline:
        why = "HF_HUB_OFFLINE is set" if offline else "downloads are off (download = false)"
        raise ModelUnavailableError(model, cache, f"{why} ({type(miss).__name__})")
    try:
        path = snapshot_download(model, revision=revision, allow_patterns=WEIGHT_PATTERNS)
    except Exception as e:
        raise ModelUnavailableError(model, cache, f"{type(e).__name__}: {e}") from e
    if not (Path(path) / "config.json").is_file():
        raise ModelUnavailableError(model, cache, "the snapshot has no config.json")
    return Path(path)


__all__ = ["ModelUnavailableError", "check_model_ref", "is_hub_id", "resolve_model"]
