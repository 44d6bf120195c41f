"""Arms: one flag that sets which mechanisms and baselines a run uses.

* :mod:`~dynbranch.arms.base` — :class:`Arm`, the factories of one arm's hooks and
  placement, and the shared factories every arm builds from (the store-backed reuse hook);
* :mod:`~dynbranch.arms.dynbranch_arms` — DynBranch's own arms: ``floor``, ``c1``, ``c2``,
  ``full``;
* :mod:`~dynbranch.arms.registry` — every arm by name (DynBranch's and the baselines',
  :mod:`dynbranch.baselines`), :func:`~dynbranch.arms.registry.get_arm`.

The baselines import :mod:`~dynbranch.arms.base` only, and this package's face imports
nothing, so the registry can list them without an import circle.
"""
