"""``dynbranch calibrate``: fit a profile's ``[calibration]`` knobs to measurements.

A profile's facts (model shapes, datasheet) are public; its four step-time knobs
(``bandwidth_efficiency``, ``mfu``, ``step_overhead_ms``, ``seq_overhead_us``) are what a fit
sets. Two sources of measurements, one solver:

* **Contention (paper Fig. 5b).** :func:`measure_contention` times a fixed-shape canonical
  request among co-resident fills on any engine; :func:`fit_contention` runs it on the sim
  engine (virtual clock) and fits knobs so the sim reproduces at most two of the paper's
  points (DESIGN.md §5), then reports every point.
* **A real engine.** :func:`measure_engine` times a real engine's prefill against prompt
  length and its decode step against batch size and context; :func:`fit_profile` fits the
  knobs so :meth:`Profile.step_cost` reproduces each measured step. For a local transformers
  model no shipped profile matches, so :func:`profile_from_hf` derives one from the model's
  config and a CPU "datasheet" measured by :func:`measure_cpu`.

:func:`write_profile` writes the result as a profile TOML file and proves it parses back.
The solver is a small Levenberg–Marquardt in log-knob space with bounds (no SciPy here).

Two more things live here because they drive engines, which the pure gate must not:
:func:`calibrate_price` checks C3's contention price (:class:`~dynbranch.gate.ContentionModel`)
against the sim engine and fits its ``scale``; :class:`FillerText` is the one source of the
random prompts and the requests every measurement above submits.
"""

from __future__ import annotations

from dynbranch.calibrate.cli import (
    GRIDS,
    QUICK_GRIDS,
    add_arguments,
    main,
)
from dynbranch.calibrate.contention import (
    FIG5B_FIT,
    FIG5B_TARGETS,
    FIXED_CONTEXT_WORDS,
    ContentionCurve,
    ContentionFit,
    ContentionSample,
    ContentionShape,
    ContentionTarget,
    PointError,
    fit_contention,
    measure_contention,
    sim_contention,
)
from dynbranch.calibrate.engine import (
    ProfileFit,
    StepMeasurement,
    fit_profile,
    measure_cpu,
    measure_engine,
    profile_from_hf,
)
from dynbranch.calibrate.filler import FillerText
from dynbranch.calibrate.price import (
    FILL_COUNTS,
    PriceCalibration,
    PricePoint,
    calibrate_price,
)
from dynbranch.calibrate.profile_io import (
    profile_toml,
    write_profile,
)
from dynbranch.calibrate.solver import (
    CONTENTION_KNOBS,
    KNOB_BOUNDS,
    MAX_CONTENTION_TARGETS,
    STEP_KNOBS,
    LsqResult,
    least_squares,
)

__all__ = [
    "CONTENTION_KNOBS",
    "ContentionCurve",
    "ContentionFit",
    "ContentionSample",
    "ContentionShape",
    "ContentionTarget",
    "FIG5B_FIT",
    "FIG5B_TARGETS",
    "FILL_COUNTS",
    "FIXED_CONTEXT_WORDS",
    "FillerText",
    "GRIDS",
    "KNOB_BOUNDS",
    "LsqResult",
    "MAX_CONTENTION_TARGETS",
    "PointError",
    "PriceCalibration",
    "PricePoint",
    "ProfileFit",
    "QUICK_GRIDS",
    "STEP_KNOBS",
    "StepMeasurement",
    "add_arguments",
    "calibrate_price",
    "fit_contention",
    "fit_profile",
    "least_squares",
    "main",
    "measure_contention",
    "measure_cpu",
    "measure_engine",
    "profile_from_hf",
    "profile_toml",
    "sim_contention",
    "write_profile",
]
