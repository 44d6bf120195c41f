"""Writing a profile as TOML, proven by parsing it back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dynbranch.engines.profile import (
    Profile,
    parse_profile,
)

# -- writing a profile ---------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)


def profile_toml(profile: Profile, header: Sequence[str] = ()) -> str:
    """``profile`` in the schema of ``dynbranch/engines/profiles/*.toml``."""
    lines = [f"# {h}".rstrip() for h in header]
    lines += ["", f"version = {profile.version}"]
    for section in ("model", "gpu", "scheduler", "calibration"):
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in asdict(getattr(profile, section)).items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_profile(profile: Profile, path: str | Path, header: Sequence[str] = ()) -> Profile:
    """Write ``profile`` as TOML to ``path`` and return it parsed back (a round-trip check)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = profile_toml(profile, header)
    back = parse_profile(path.stem, text, str(path))
    for section in ("model", "gpu", "scheduler", "calibration"):
        if getattr(back, section) != getattr(profile, section):
            raise AssertionError(f"profile [{section}] does not survive a TOML round trip")
    path.write_text(text, encoding="utf-8")
    return back


