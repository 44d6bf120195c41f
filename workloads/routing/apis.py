"""BFCL's executable multi-turn API classes: loading them, and per-request state.

The ``bfcl-eval`` wheel ships eight stateful stand-ins of real services as plain Python
classes (file system, math, messaging, posting, tickets, trading, travel, vehicle). They need
only the standard library and ``mpmath``. :func:`load_api_suite` imports exactly those modules
from an extracted tree (their module files, nothing else of ``bfcl_eval``); the package
``bfcl_eval.eval_checker.multi_turn_eval.func_source_code`` is registered with the tree's
folder on its path only so that their own ``from ...long_context import`` resolves.

Each request gets its own instances, loaded with the record's ``initial_config`` by BFCL's
``_load_scenario`` (:class:`ApiState`). Determinism: the classes that draw random numbers
(messaging ids, trading timestamps, travel ids, vehicle sensors) draw them from an instance
``random.Random`` seeded by the scenario (``random_seed``, else a class default), so the same
calls give the same results; ``File`` records ``datetime.now()`` in a private attribute that
no result or state check reads. ``MathAPI.logarithm`` and ``square_root`` set process-global
precision (``mpmath.mp.dps``, the decimal context); every call runs under one lock that saves
and restores both.

Which calls may be speculated is **declared** per class and method in
:mod:`workloads.routing.effects`, never inferred at run time.
"""

from __future__ import annotations

import ast
import copy
import decimal
import functools
import hashlib
import importlib.util
import inspect
import random
import sys
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynbranch.canonical import digest
from dynbranch.errors import DataMissingError, MalformedRecordError
from workloads.routing.calls import ParsedCall, to_jsonable
from workloads.routing.effects import READ_ONLY, declared_read_only

API_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
API_DIR = Path(*API_PACKAGE.split("."))
BACKEND_CONFIG = Path("bfcl_eval/constants/executable_backend_config.py")

# NOTE: the multi-turn suite. The wheel's config also lists web search and memory classes,
# which need requests/bs4/faiss/sentence-transformers: they are never loaded.
SUITE_CLASSES = tuple(READ_ONLY)


# -- loading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiSuite:
    """The API classes of one extracted tree, with BFCL's class → doc-file mapping."""

    root: Path
    classes: Mapping[str, type]
    doc_files: Mapping[str, str]
    stateless: frozenset[str]

    def new_instance(self, cls: str, config: Mapping[str, Any], long_context: bool = False) -> Any:
        """A fresh instance of ``cls`` loaded with ``config`` (BFCL's ``_load_scenario``;
        ``long_context`` for the ``multi_turn_long_context`` category, as BFCL loads it)."""
        instance = self.classes[cls]()
        if cls not in self.stateless:
            instance._load_scenario(copy.deepcopy(dict(config)), long_context=long_context)
        return instance


def backend_config(root: Path) -> tuple[dict[str, str], dict[str, str], frozenset[str]]:
    """Class → module, class → doc file and stateless classes from BFCL's backend config.

    The config is read with :mod:`ast`, not imported.
    """
    path = Path(root) / BACKEND_CONFIG
    if not path.is_file():
        raise DataMissingError("bfcl", [str(path)], "Run `dynbranch data bfcl`.")
    assigns: dict[str, ast.expr] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            assigns[node.targets[0].id] = node.value
    try:
        docs = ast.literal_eval(assigns["MULTI_TURN_FUNC_DOC_FILE_MAPPING"])
        stateless = frozenset(ast.literal_eval(assigns.get("STATELESS_CLASSES", ast.List([]))))
        modules = {}
        for key, value in zip(
            assigns["CLASS_FILE_PATH_MAPPING"].keys,
            assigns["CLASS_FILE_PATH_MAPPING"].values,
            strict=True,
        ):
            # values are f"{BACKEND_PATH_PREFIX}.<module>": keep the last dotted part
            tail = value.values[-1] if isinstance(value, ast.JoinedStr) else value
            modules[ast.literal_eval(key)] = ast.literal_eval(tail).rsplit(".", 1)[-1]
    except (KeyError, ValueError, AttributeError, TypeError, SyntaxError) as e:
        raise MalformedRecordError(str(path), "class mappings", f"cannot read: {e!r}") from None
    return modules, docs, stateless


_LOAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def load_api_suite(root: Path) -> ApiSuite:
    """Import the suite's API classes from the extracted tree at ``root`` (once per root)."""
    root = Path(root).resolve()
    modules, docs, stateless = backend_config(root)
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:10]
    classes: dict[str, type] = {}
    with _LOAD_LOCK:
        _register_packages(root)
        for cls in SUITE_CLASSES:
            if cls not in modules:
                continue
            path = root / API_DIR / f"{modules[cls]}.py"
            name = f"_dynbranch_bfcl_{tag}.{modules[cls]}"
            module = sys.modules.get(name) or _import_file(name, path)
            classes[cls] = getattr(module, cls)
    return ApiSuite(
        root,
        types.MappingProxyType(classes),
        types.MappingProxyType({c: docs[c] for c in classes if c in docs}),
        frozenset(stateless & classes.keys()),
    )


def _register_packages(root: Path) -> None:
    parts = API_PACKAGE.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        folder = str(root.joinpath(*parts[:i]))
        package = sys.modules.get(name)
        if package is None:
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
        if folder not in package.__path__:
            package.__path__.append(folder)


def _import_file(name: str, path: Path) -> types.ModuleType:
    if not path.is_file():
        raise DataMissingError("bfcl", [str(path)], "Run `dynbranch data bfcl`.")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# -- per-request state ------------------------------------------------------------------------

_GLOBAL_PRECISION_LOCK = threading.Lock()
_SIGNATURES: dict[tuple[type, str], inspect.Signature] = {}
"""(API class, method) -> the bound method's signature (the same for every instance)."""
_SNAPSHOTS: dict[tuple[Path, str, str], dict[str, Any]] = {}
"""(suite root, API class, lineage) -> a deep copy of that state's public attributes, oldest
first (:meth:`ApiState.public_state`)."""
_SNAPSHOTS_MAX = 8192


class ApiState:
    """One request's API instances and the version of each (C1's read-set).

    A method name resolves to the involved class that has it (BFCL's convention); a call
    declared mutating bumps its class's version.
    """

    def __init__(
        self, suite: ApiSuite, classes: tuple[str, ...], initial_config: Mapping[str, Any],
        long_context: bool = False,
    ) -> None:
        self.instances = {c: suite.new_instance(c, initial_config.get(c, {}), long_context)
                          for c in classes}
        self.suite_root = suite.root
        self.versions = dict.fromkeys(classes, 0)
        # NOTE: a class's *lineage* names its state as a value: its initial configuration and
        # every mutating call applied since. Equal lineages are equal states (the APIs are
        # deterministic; RNG draws are declared mutating), so results computed on one
        # lineage stay exact for any request whose state has that lineage.
        self.lineage = {c: digest({"class": c, "config": initial_config.get(c, {}),
                                   **({"long_context": True} if long_context else {})})[:16]
                        for c in classes}
        self._owner: dict[str, str] = {}
        for cls, instance in self.instances.items():
            for name, _ in inspect.getmembers(instance, inspect.ismethod):
                if not name.startswith("_"):
                    self._owner[name] = cls

    def owner(self, method: str) -> str | None:
        """The involved class that has ``method``, or ``None``."""
        return self._owner.get(method)

    def bind(self, call: ParsedCall) -> tuple[str, inspect.BoundArguments]:
        """The owning class and the call's arguments bound to the method's signature.

        Raises ``LookupError`` (no involved class has it) or ``TypeError`` (bad arguments).
        """
        cls = self.owner(call.name)
        if cls is None:
            raise LookupError(
                f"no involved class ({', '.join(self.instances)}) has a method {call.name!r}"
            )
        instance = self.instances[cls]
        key = (type(instance), call.name)
        signature = _SIGNATURES.get(key)
        if signature is None:  # NOTE: read once per API class, not per request or call
            signature = _SIGNATURES[key] = inspect.signature(getattr(instance, call.name))
        return cls, signature.bind(*call.args, **call.kwargs)

    def execute(self, cls: str, call: ParsedCall, bound: inspect.BoundArguments) -> Any:
        """Run the call and return a JSON-able copy of its value; exceptions propagate.

        A call declared mutating bumps its class's version even when it raises: it may have
        changed the state before raising.
        """
        method = getattr(self.instances[cls], call.name)
        mutating = not declared_read_only(cls, call.name, bound.arguments)
        with _GLOBAL_PRECISION_LOCK:
            dps, ctx = _mp_dps(), decimal.getcontext().copy()
            try:
                return to_jsonable(method(*bound.args, **bound.kwargs))
            finally:
                _set_mp_dps(dps)
                decimal.setcontext(ctx)
                if mutating:
                    self.versions[cls] += 1
                    self.lineage[cls] = digest([self.lineage[cls], call.name,
                                                repr(sorted(bound.arguments.items()))])[:16]

    def public_state(self) -> dict[str, dict[str, Any]]:
        """A deep copy of every instance's public attributes (what BFCL's state check reads).

        Each class's attributes are a dict of their own, but the values in it are shared
        with every other request whose class has the same lineage: read them, never change
        them.

        NOTE: equal lineages are equal states (see :meth:`__init__`), so each class's copy is
        kept by its lineage (:data:`_SNAPSHOTS`): BFCL's check reads a state at every turn of
        every request and of its ground truth, mostly one seen before (a repeated request,
        a read-only turn), and deep-copying them all was 3 % of a 10,000-request Routing
        replay's time under cProfile (less in fact: ``scripts/BENCHMARKS.md``). Checked:
        over a 3,000-request Routing replay every one of 7,913 kept copies equalled a fresh
        copy of its state.
        """
        states = {}
        for cls, inst in self.instances.items():
            key = (self.suite_root, cls, self.lineage[cls])
            state = _SNAPSHOTS.get(key)
            if state is None:
                state = {k: copy.deepcopy(v) for k, v in vars(inst).items()
                         if not k.startswith("_")}
                _SNAPSHOTS[key] = state
                if len(_SNAPSHOTS) > _SNAPSHOTS_MAX:
                    _SNAPSHOTS.pop(next(iter(_SNAPSHOTS)), None)  # the oldest
            states[cls] = dict(state)
        return states


def _mp_dps() -> int | None:
    mpmath = sys.modules.get("mpmath")
    return mpmath.mp.dps if mpmath is not None else None


def _set_mp_dps(dps: int | None) -> None:
    if dps is not None:
        sys.modules["mpmath"].mp.dps = dps


# NOTE: scratch attributes no result reads: a wall-clock stamp, a description, and
# TravelAPI's flight-cost cache (refilled by book_flight before every read).
SCRATCH_ATTRIBUTES = frozenset({"_last_modified", "_api_description", "_flight_cost_lookup"})


def state_snapshot(obj: Any, _path: tuple[int, ...] = ()) -> Any:
    """A deep, comparable snapshot of an instance's state, private attributes included.

    Stricter than BFCL's public-attribute check: the current directory and the seeded RNG's
    position count as state. Back-references (a directory's parent) become a marker.
    """
    if id(obj) in _path:
        return "<back-reference>"
    path = (*_path, id(obj))
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, random.Random):
        return ("Random", obj.getstate())
    if isinstance(obj, Mapping):
        return {
            "__map__": sorted(
                ((repr(k), state_snapshot(v, path)) for k, v in obj.items()), key=lambda kv: kv[0]
            )
        }
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [state_snapshot(v, path) for v in obj]
        return sorted(items, key=repr) if isinstance(obj, (set, frozenset)) else items
    if hasattr(obj, "__dict__"):
        return (
            type(obj).__name__,
            state_snapshot(
                {k: v for k, v in vars(obj).items() if k not in SCRATCH_ATTRIBUTES}, path
            ),
        )
    return repr(obj)
