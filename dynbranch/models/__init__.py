"""Models DynBranch builds for itself (no hub access exists here).

:mod:`dynbranch.models.tiny` makes a seeded tiny Qwen3-architecture causal LM with a locally
trained byte-level BPE tokenizer, for the ``hf`` engine and its tests. Importing this package
imports neither torch nor transformers.
"""
