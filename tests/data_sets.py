"""The shared data sets a real-data test reads, or a skip that says which one is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynbranch.datasets import DataMissingError, require_dataset, resolve_data_dir


def shared_data(*names: str) -> Path:
    """The data directory holding every set in ``names`` with every file it must have;
    otherwise the test skips, naming the missing set and where it was looked for."""
    found = resolve_data_dir(None)
    for name in names:
        try:
            require_dataset(found, name)
        except DataMissingError as e:
            pytest.skip(f"the shared data set {name!r} is absent: {e}")
    assert found is not None
    return found
