"""The runtime's vocabulary and machinery, beneath every mechanism.

* :mod:`~dynbranch.runtime.run` — :class:`RunContext` and the typed options of each concern
  (:class:`FillOptions` for C2, :class:`GateOptions` for C3), their defaults in one place;
* :mod:`~dynbranch.runtime.stage` — :class:`StageCall`, one stage about to run, and C1's
  provenance helper :func:`upstream_of`;
* :mod:`~dynbranch.runtime.runlog` — the typed rows of the run log (stages, branches,
  requests) and the :class:`RunLog` that holds them;
* :mod:`~dynbranch.runtime.placement` — which engine of a role serves a call;
* :mod:`~dynbranch.runtime.pool` — the engines of each model role;
* :mod:`~dynbranch.runtime.execution` — rendering a stage into a :class:`StageCall` and
  running it on an engine or a tool: the one place canonical and speculative stages build
  their engine request and their log row.

C1 (:mod:`dynbranch.reuse`), C2 (:mod:`dynbranch.fill`), C3 (:mod:`dynbranch.gate`) and the
orchestrator build on this package; it imports none of them.
"""
