"""Reading one YAML configuration file strictly: types, keys and errors that say where.

`load_yaml` reads a file with ``yaml.safe_load`` (nothing in it can run code), refuses a key
repeated inside one mapping (``safe_load`` would silently keep the last) and checks the top-level
keys; a `Reader` then checks each value's type, allowed values and range. Every error is a
`ConfigError` naming the file, the dotted key path and the allowed values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from collage_farm.config.schema import SCHEMA_VERSION
from collage_farm.core.target import ConfigError

__all__ = ["KIND_ALLOWED", "Reader", "check_name", "check_schema", "check_type",
           "find_duplicate_key", "join_key", "load_yaml"]

#: how a missing value of each kind is described in an error's allowed values
KIND_ALLOWED = {"bool": ["true", "false"], "int": ["<integer>"], "number": ["<number>"],
                "str": ["<string>"]}
_KIND_WORDS = {"bool": "true or false", "int": "an integer", "number": "a number",
               "str": "a non-empty string"}


class Reader:
    """Type and key checks for one file, with errors that name the file and the dotted key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, key: str, message: str, allowed: Iterable[object] | None = None
              ) -> ConfigError:
        return ConfigError(message, file=self.file, key=key or "<top>", allowed=allowed)

    def mapping(self, value: object, key: str, allowed: Sequence[str] | None,
                what: str = "a mapping") -> dict[str, Any]:
        """``value`` as a mapping with string keys out of ``allowed`` (None: any); ``{}`` for
        a missing value."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key, f"expected {what}, got {type(value).__name__}",
                             allowed)
        for k in value:
            if not isinstance(k, str):
                raise self.error(key, f"keys must be strings, got {k!r}", allowed)
            if allowed is not None and k not in allowed:
                raise self.error(join_key(key, k), f"unknown key {k!r}", allowed)
        return value

    def value(self, m: Mapping[str, Any], key: str, path: str, kind: str, *,
              default: object = None, required: bool = False,
              choices: Sequence[object] | None = None, minimum: float | None = None,
              positive: bool = False, nullable: bool = False) -> Any:
        """``m[key]`` checked as ``kind`` ("bool", "int", "number", "str"), else ``default``."""
        full = join_key(path, key)
        if key not in m:
            if required:
                raise self.error(full, "missing required key",
                                 choices if choices is not None else KIND_ALLOWED[kind])
            return default
        v = m[key]
        if v is None and nullable:
            return None
        check_type(self, full, v, kind, choices, minimum, positive)
        return v


def join_key(path: str, key: str) -> str:
    """The dotted key path of ``key`` under ``path``."""
    return f"{path}.{key}" if path else key


def _type_ok(v: object, kind: str) -> bool:
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if kind == "str":
        return isinstance(v, str) and v != ""
    raise AssertionError(kind)


def check_type(r: Reader, key: str, v: object, kind: str,
               choices: Sequence[object] | None, minimum: float | None, positive: bool) -> None:
    """Raise `ConfigError` unless ``v`` is a ``kind`` within ``choices`` and the bounds."""
    if not _type_ok(v, kind):
        raise r.error(key, f"expected {_KIND_WORDS[kind]}, got {v!r}",
                      choices if choices is not None else KIND_ALLOWED[kind])
    if choices is not None and v not in choices:
        raise r.error(key, f"{v!r} is not allowed", choices)
    if minimum is not None and v < minimum:  # type: ignore[operator]
        raise r.error(key, f"{v!r} is below the minimum", [f">= {minimum:g}"])
    if positive and not v > 0:  # type: ignore[operator]
        raise r.error(key, f"{v!r} must be positive", ["> 0"])


def find_duplicate_key(text: str) -> tuple[str, int] | None:
    """(key, line) of the first key repeated inside one mapping (safe_load keeps the last)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        return k.value, k.start_mark.line + 1
                    seen.add(k.value)
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def load_yaml(source: str | Path, top_keys: Sequence[str], label: str | None = None
              ) -> tuple[dict[str, Any], str]:
    """(the file's top-level mapping, the name errors use for it); keys out of ``top_keys``,
    malformed YAML, a repeated key or an unreadable file raise `ConfigError`."""
    path = Path(source)
    name = label or str(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", file=name) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e}", file=name) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"malformed YAML: {problem}; expected a mapping with top-level keys",
                          file=name, key=where, allowed=top_keys) from None
    dup = find_duplicate_key(text)
    if dup is not None:
        raise ConfigError(f"key {dup[0]!r} appears twice in one mapping (line {dup[1]})",
                          file=name, key=dup[0], allowed=["each key once"])
    if data is None:
        data = {}
    r = Reader(name)
    return r.mapping(data, "", top_keys, "a YAML mapping at the top level"), name


def check_schema(r: Reader, top: Mapping[str, Any]) -> None:
    """The file's ``schema:`` is a version this reader knows (or absent)."""
    r.value(top, "schema", "", "int", choices=(SCHEMA_VERSION,))


def check_name(r: Reader, key: str, name: object, what: str) -> str:
    """``name`` as a system, device, target or variant name (no commas or spaces)."""
    if not isinstance(name, str) or not name or any(c in name for c in ", \t\n"):
        raise r.error(key, f"bad {what} name {name!r}: use letters, digits, '-', '_', '.'",
                      ["<name without commas or spaces>"])
    return name
