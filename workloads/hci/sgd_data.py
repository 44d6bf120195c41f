"""Loading and validating Schema-Guided Dialogue (SGD) files: schemas, raw dialogues, offer pairs.

Three kinds of file are read from an SGD directory (``<data dir>/sgd``, or a fixture in the
same layout; ``data/README.md`` §3 and the upstream ``README.md`` describe the formats):

* ``dev/schema.json`` — the services, their intents (methods) with ``is_transactional``,
  required and optional slots;
* ``dev/dialogues_001.json`` … ``dev/dialogues_011.json`` — raw dialogues, whose SYSTEM
  frames carry ``service_call`` and the full ``service_results`` (the menus);
* ``offer_pick_pairs_dev_test.jsonl`` — one record per SYSTEM frame that offers something,
  with the next USER turn (derived from all dev and test files; only the dev files above
  have raw dialogues to join with).

Every record is checked when it is loaded, and every pair whose dialogue file is loaded is
checked against its raw dialogue (utterances, turn indices, the service call the menu came
from, the menu's size and the offered entry). The first problem raises
:class:`~dynbranch.errors.MalformedRecordError` naming the file, the record and the problem;
a missing file raises :class:`~dynbranch.errors.DataMissingError`. Nothing here runs a request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dynbranch.datasets import read_jsonl
from dynbranch.errors import DataMissingError, MalformedRecordError

SCHEMA_FILE = "dev/schema.json"
PAIRS_FILE = "offer_pick_pairs_dev_test.jsonl"
RAW_FILES = tuple(f"dialogues_{i:03d}.json" for i in range(1, 12))
SPEAKERS = ("USER", "SYSTEM")
HOW_TO_GET = "Run `dynbranch data sgd` to see where to get it (data/README.md §3)."


@dataclass(frozen=True)
class Intent:
    """A service method: whether it is transactional, and the slots it takes as parameters."""

    name: str
    transactional: bool
    required: tuple[str, ...]
    optional: tuple[str, ...]

    @property
    def parameters(self) -> frozenset[str]:
        return frozenset((*self.required, *self.optional))


@dataclass(frozen=True)
class Service:
    """A service of the schema and its intents by name."""

    name: str
    intents: Mapping[str, Intent]


@dataclass(frozen=True)
class Call:
    """A service call: the service, the method (an intent) and its canonical parameters."""

    service: str
    method: str
    parameters: Mapping[str, str]

    def key(self) -> str:
        """The canonical key of the call (services, methods and parameters compared exactly)."""
        return json.dumps(
            [self.service, self.method, dict(self.parameters)], sort_keys=True, ensure_ascii=False
        )


@dataclass(frozen=True)
class Action:
    """A dialogue act with its slot and values (``slot`` is ``""`` when it has none)."""

    act: str
    slot: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Frame:
    """One service's annotations of a turn; SYSTEM frames may carry a call and its results."""

    service: str
    actions: tuple[Action, ...]
    call: Call | None = None
    results: tuple[Mapping[str, str], ...] | None = None


@dataclass(frozen=True)
class Turn:
    speaker: str
    utterance: str
    frames: tuple[Frame, ...]

    def frame(self, service: str) -> Frame | None:
        return next((f for f in self.frames if f.service == service), None)


@dataclass(frozen=True)
class Dialogue:
    id: str
    file: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Pair:
    """An offer → next-user-turn record of ``offer_pick_pairs_dev_test.jsonl``."""

    line: int
    split: str
    file: str
    dialogue_id: str
    service: str
    system_turn: int
    user_turn: int
    system_utterance: str
    offer_acts: tuple[Action, ...]
    service_call: Call | None
    num_service_results: int
    offered_result_index: int | None
    user_utterance: str
    user_actions: tuple[Action, ...]

    @property
    def id(self) -> str:
        """A stable id: dialogue, system turn and service (unique among the pairs)."""
        return f"{self.dialogue_id}.t{self.system_turn:02d}.{self.service}"

    @property
    def offers_intent(self) -> bool:
        return any(a.act == "OFFER_INTENT" for a in self.offer_acts)


@dataclass(frozen=True)
class SGDData:
    """The loaded SGD files: schema, raw dialogues (by id) and the pairs joined to them."""

    root: Path
    services: Mapping[str, Service]
    dialogues: Mapping[str, Dialogue]
    pairs: tuple[Pair, ...]
    raw_files: tuple[str, ...]

    def joined(self) -> Iterator[Pair]:
        """The dev pairs whose raw dialogue file is loaded, in file order."""
        loaded = set(self.raw_files)
        return (p for p in self.pairs if p.split == "dev" and p.file in loaded)


def load_sgd(root: Path, raw_files: Sequence[str] | None = None) -> SGDData:
    """Load and validate the SGD directory ``root``.

    ``raw_files`` names the dialogue files under ``dev/`` to read; by default each of
    :data:`RAW_FILES` that exists (at least one must). Pairs of other files are validated
    but have no raw dialogue to join with.
    """
    root = Path(root)
    if raw_files is None:
        raw_files = tuple(f for f in RAW_FILES if (root / "dev" / f).is_file())
        if not raw_files:
            raise DataMissingError("sgd", [str(root / "dev" / RAW_FILES[0])], HOW_TO_GET)
    services = load_schema(root / SCHEMA_FILE)
    dialogues: dict[str, Dialogue] = {}
    for name in raw_files:
        path = root / "dev" / name
        for d in load_dialogues(path, services):
            if d.id in dialogues:
                raise MalformedRecordError(
                    str(path), d.id, f"dialogue id also in {dialogues[d.id].file}"
                )
            dialogues[d.id] = d
    pairs = load_pairs(root / PAIRS_FILE)
    data = SGDData(
        root, MappingProxyType(services), MappingProxyType(dialogues), pairs, tuple(raw_files)
    )
    for pair in data.joined():
        check_join(root / PAIRS_FILE, pair, dialogues, services)
    return data


# -- schema -----------------------------------------------------------------------------------


def load_schema(path: Path) -> dict[str, Service]:
    """The services of a ``schema.json`` by name."""
    raw = _json(path)
    if not isinstance(raw, list):
        raise MalformedRecordError(str(path), "file", "expected a JSON array of services")
    services: dict[str, Service] = {}
    for n, entry in enumerate(raw):
        rid = entry.get("service_name", f"service {n}") if isinstance(entry, dict) else n
        name = _field(path, rid, entry, "service_name", str)
        intents = {}
        for i, raw_intent in enumerate(_field(path, rid, entry, "intents", list)):
            intent = _intent(path, f"{rid} intent {i}", raw_intent)
            intents[intent.name] = intent
        if name in services:
            raise MalformedRecordError(str(path), name, "duplicate service_name")
        services[name] = Service(name, MappingProxyType(intents))
    return services


def _intent(path: Path, where: str, raw: Any) -> Intent:
    required = _field(path, where, raw, "required_slots", list)
    optional = _field(path, where, raw, "optional_slots", dict)
    return Intent(
        _field(path, where, raw, "name", str),
        _field(path, where, raw, "is_transactional", bool),
        tuple(_strings(path, where, required, "required_slots")),
        tuple(_strings(path, where, list(optional), "optional_slots")),
    )


# -- raw dialogues ----------------------------------------------------------------------------


def load_dialogues(path: Path, services: Mapping[str, Service]) -> list[Dialogue]:
    """The dialogues of one raw ``dialogues_NNN.json`` file, validated."""
    raw = _json(path)
    if not isinstance(raw, list):
        raise MalformedRecordError(str(path), "file", "expected a JSON array of dialogues")
    out = []
    for n, entry in enumerate(raw):
        rid = entry.get("dialogue_id", f"dialogue {n}") if isinstance(entry, dict) else n
        did = _field(path, rid, entry, "dialogue_id", str)
        turns = tuple(
            _turn(path, did, t, turn, services)
            for t, turn in enumerate(_field(path, did, entry, "turns", list))
        )
        out.append(Dialogue(did, path.name, turns))
    return out


def _turn(path: Path, did: str, t: int, raw: Any, services: Mapping[str, Service]) -> Turn:
    where = f"turn {t}"
    if not isinstance(raw, dict):
        raise MalformedRecordError(str(path), did, f"{where} is not a JSON object")
    speaker = _field(path, did, raw, "speaker", str, where)
    if speaker not in SPEAKERS:
        raise MalformedRecordError(
            str(path), did, f"{where}: speaker {speaker!r} not in {SPEAKERS}"
        )
    frames = []
    for f, frame in enumerate(_field(path, did, raw, "frames", list, where)):
        frames.append(_frame(path, did, f"{where} frame {f}", frame, services))
    return Turn(speaker, _field(path, did, raw, "utterance", str, where), tuple(frames))


def _frame(path: Path, did: str, where: str, raw: Any, services: Mapping[str, Service]) -> Frame:
    if not isinstance(raw, dict):
        raise MalformedRecordError(str(path), did, f"{where} is not a JSON object")
    service = _field(path, did, raw, "service", str, where)
    actions = _actions(path, did, _field(path, did, raw, "actions", list, where), where)
    call = results = None
    if "service_call" in raw:
        call = _call(path, did, service, raw["service_call"], where, services)
        res = _field(path, did, raw, "service_results", list, where)
        results = tuple(_result(path, did, r, f"{where} result {i}") for i, r in enumerate(res))
    return Frame(service, actions, call, results)


def _result(path: Path, rid: str, raw: Any, where: str) -> Mapping[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise MalformedRecordError(str(path), rid, f"{where} is not a map of slot to text")
    return raw


# -- pairs ------------------------------------------------------------------------------------


def load_pairs(path: Path) -> tuple[Pair, ...]:
    """Every record of ``offer_pick_pairs_dev_test.jsonl``, validated (not yet joined)."""
    pairs, seen = [], {}
    for n, raw in read_jsonl(path, "sgd", HOW_TO_GET):
        pair = _pair(path, n, raw)
        key = (pair.split, pair.id)
        if key in seen:
            raise MalformedRecordError(
                str(path), f"line {n}", f"same dialogue, turn and service as line {seen[key]}"
            )
        seen[key] = n
        pairs.append(pair)
    return tuple(pairs)


def _pair(path: Path, n: int, raw: Mapping[str, Any]) -> Pair:
    rid = f"line {n}"

    def get(name: str, kind: type | tuple[type, ...]) -> Any:
        return _field(path, rid, raw, name, kind)

    service = get("service", str)
    call = get("service_call", (dict, type(None)))
    offered = get("offered_result_index", (int, type(None)))
    pair = Pair(
        n,
        get("split", str),
        get("file", str),
        get("dialogue_id", str),
        service,
        get("system_turn_index", int),
        get("user_turn_index", int),
        get("system_utterance", str),
        _actions(path, rid, get("offer_acts", list), "offer_acts"),
        None if call is None else _call(path, rid, service, call, "service_call", None),
        get("num_service_results", int),
        offered,
        get("user_utterance", str),
        _actions(path, rid, get("user_actions", list), "user_actions"),
    )
    if pair.user_turn != pair.system_turn + 1:
        raise MalformedRecordError(
            str(path),
            rid,
            f"user_turn_index {pair.user_turn} does not "
            f"follow system_turn_index {pair.system_turn}",
        )
    if pair.system_turn < 0 or pair.num_service_results < 0:
        raise MalformedRecordError(str(path), rid, "turn indices and counts must be >= 0")
    if not any(a.act in ("OFFER", "OFFER_INTENT") for a in pair.offer_acts):
        raise MalformedRecordError(str(path), rid, "offer_acts has no OFFER or OFFER_INTENT")
    return pair


def check_join(
    path: Path, pair: Pair, dialogues: Mapping[str, Dialogue], services: Mapping[str, Service]
) -> None:
    """Check a dev pair against its raw dialogue; :class:`MalformedRecordError` if they disagree."""
    rid = f"line {pair.line}"

    def bad(problem: str) -> MalformedRecordError:
        return MalformedRecordError(str(path), rid, f"dialogue {pair.dialogue_id}: {problem}")

    d = dialogues.get(pair.dialogue_id)
    if d is None or d.file != pair.file:
        raise bad(f"not in {pair.file}")
    if pair.service not in services:
        raise bad(f"service {pair.service!r} is not in the schema")
    if pair.user_turn >= len(d.turns):
        raise bad(f"has {len(d.turns)} turns, no turn {pair.user_turn}")
    system, user = d.turns[pair.system_turn], d.turns[pair.user_turn]
    if (system.speaker, user.speaker) != SPEAKERS[::-1]:
        raise bad(f"turns {pair.system_turn}, {pair.user_turn} are not SYSTEM, USER")
    if (system.utterance, user.utterance) != (pair.system_utterance, pair.user_utterance):
        raise bad("utterances differ from the raw dialogue")
    if system.frame(pair.service) is None:
        raise bad(f"turn {pair.system_turn} has no {pair.service} frame")
    menu_frame = latest_call(d, pair.service, pair.system_turn)
    recorded = menu_frame.call if menu_frame else None
    if recorded != pair.service_call:
        raise bad("service_call differs from the latest call in the raw dialogue")
    size = len(menu_frame.results) if menu_frame else 0
    if size != pair.num_service_results:
        raise bad(f"num_service_results {pair.num_service_results}, the raw menu has {size}")
    index = best_match(menu_frame.results, pair.offer_acts) if menu_frame else None
    if index != pair.offered_result_index:
        raise bad(f"offered_result_index {pair.offered_result_index}, the raw menu gives {index}")


def latest_call(dialogue: Dialogue, service: str, upto: int) -> Frame | None:
    """The latest SYSTEM frame of ``service`` with a service call, at or before turn ``upto``."""
    for turn in reversed(dialogue.turns[: upto + 1]):
        frame = turn.frame(service) if turn.speaker == "SYSTEM" else None
        if frame is not None and frame.call is not None:
            return frame
    return None


def best_match(results: Sequence[Mapping[str, str]], acts: Sequence[Action]) -> int | None:
    """The result with the most OFFER slot values equal (case-insensitively) to its own.

    Ties go to the lower index; ``None`` when nothing matches. This is the rule that derived
    ``offered_result_index`` (data/README.md §3).
    """
    best, best_score = None, 0
    for i, result in enumerate(results):
        score = sum(
            1
            for a in acts
            if a.act == "OFFER"
            and a.slot in result
            and any(same(v, result[a.slot]) for v in a.values)
        )
        if score > best_score:
            best, best_score = i, score
    return best


def same(a: str, b: str) -> bool:
    """Slot values compare case-insensitively, ignoring surrounding space."""
    return a.strip().casefold() == b.strip().casefold()


# -- helpers ----------------------------------------------------------------------------------


def _json(path: Path) -> Any:
    if not path.is_file():
        raise DataMissingError("sgd", [str(path)], HOW_TO_GET)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise MalformedRecordError(str(path), "file", f"not JSON: {e}") from None


def _field(
    path: Path, rid: Any, raw: Any, name: str, kind: type | tuple[type, ...], where: str = ""
) -> Any:
    at = f"{where}: " if where else ""
    if not isinstance(raw, dict):
        raise MalformedRecordError(str(path), rid, f"{at}not a JSON object")
    if name not in raw:
        raise MalformedRecordError(str(path), rid, f"{at}missing field {name!r}")
    value = raw[name]
    bad_bool = isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,)
    )
    if not isinstance(value, kind) or bad_bool:
        expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise MalformedRecordError(
            str(path), rid, f"{at}field {name!r} is {type(value).__name__}, expected {expected}"
        )
    return value


def _strings(path: Path, rid: Any, values: list, name: str) -> list[str]:
    if not all(isinstance(v, str) for v in values):
        raise MalformedRecordError(str(path), rid, f"{name} must be a list of text")
    return values


def _actions(path: Path, rid: Any, raw: list, where: str) -> tuple[Action, ...]:
    out = []
    for i, a in enumerate(raw):
        at = f"{where} action {i}"
        values = _strings(path, rid, _field(path, rid, a, "values", list, at), f"{at} values")
        slot = a.get("slot") or ""
        if not isinstance(slot, str):
            raise MalformedRecordError(str(path), rid, f"{at}: field 'slot' is not text")
        out.append(Action(_field(path, rid, a, "act", str, at), slot, tuple(values)))
    return tuple(out)


def _call(
    path: Path, rid: Any, service: str, raw: Any, where: str, services: Mapping[str, Service] | None
) -> Call:
    method = _field(path, rid, raw, "method", str, where)
    params = _field(path, rid, raw, "parameters", dict, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise MalformedRecordError(str(path), rid, f"{where}: parameters must map slot to text")
    if services is not None:
        known = services.get(service)
        if known is None or method not in known.intents:
            raise MalformedRecordError(
                str(path), rid, f"{where}: {service}.{method} is not in the schema"
            )
    return Call(service, method, MappingProxyType(dict(params)))
