"""DynBranch: speculative subgraph reuse for dynamic agentic LLM serving.

The core (workflow model, orchestrator, clock, engines protocol, results) imports neither
Ray nor vLLM; Ray lives in :mod:`dynbranch.cluster` only.
"""

__version__ = "0.1.0"
