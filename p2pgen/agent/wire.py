"""Core commands on the wire: validated conversion between command dataclasses and msgpack maps.

Owns: the only place where untrusted maps become core commands. Invariant kept: a map that does not
describe exactly one known command with correctly typed fields is rejected with a reason; it never
reaches the state machine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from p2pgen.core import COMMAND_TYPES, Command

_FIELD_TYPES = {"str": str, "int": int, "float": (int, float)}


def command_to_wire(command: Command) -> dict[str, Any]:
    data = dataclasses.asdict(command)
    data["type"] = type(command).__name__.lower()
    if "addrs" in data:
        data["addrs"] = [list(pair) for pair in data["addrs"]]
    return data


def command_from_wire(data: Any) -> Command:
    if not isinstance(data, dict) or data.get("type") not in COMMAND_TYPES:
        raise ValueError(f"not a command: expected a map whose 'type' is one of {sorted(COMMAND_TYPES)}")
    cls = COMMAND_TYPES[data["type"]]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields) - {"type"}
    if unknown:
        raise ValueError(f"{data['type']}: unknown field(s) {sorted(unknown)}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING:
                raise ValueError(f"{data['type']}: missing field {name!r}")
            continue
        values[name] = _convert(data["type"], name, str(f.type), data[name])
    return cls(**values)


def _convert(kind: str, name: str, annotation: str, value: Any) -> Any:
    if name == "addrs":
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value):
            raise ValueError(f"{kind}: addrs must be a list of [name, 'host:port'] pairs")
        return tuple(sorted((p[0], p[1]) for p in value))
    expected = _FIELD_TYPES[annotation]
    if isinstance(value, bool) or not isinstance(value, expected):
        raise ValueError(f"{kind}: field {name!r} must be {annotation}, got {type(value).__name__}")
    return float(value) if annotation == "float" else value
