"""Typed, validated plugin parameters (scikit-learn style: declared once, checked on construction)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from bench.errors import ConfigError

_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", list: "list"}


@dataclass(frozen=True)
class Param:
    """One parameter of a plugin: a type, a default, an optional range or set of choices."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    nullable: bool = False
    item_type: type | None = None  # for list parameters

    def describe(self) -> str:
        parts = [f"{self.name}: {_TYPE_NAMES.get(self.type, self.type.__name__)} = {self.default!r}"]
        if self.choices:
            parts.append(f"one of {list(self.choices)}")
        if self.low is not None or self.high is not None:
            lo = "(" if not self.low_inclusive else "["
            hi = ")" if not self.high_inclusive else "]"
            parts.append(f"in {lo}{self.low if self.low is not None else '-inf'}, "
                         f"{self.high if self.high is not None else 'inf'}{hi}")
        if self.help:
            parts.append(f"— {self.help}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": _TYPE_NAMES.get(self.type, self.type.__name__), "default": self.default,
            "help": self.help, "choices": list(self.choices) if self.choices else None,
            "low": self.low, "high": self.high,
        }

    def validate(self, value: Any, owner: str) -> Any:
        where = f"{owner}: parameter '{self.name}'"
        if value is None:
            if self.nullable:
                return None
            raise ConfigError(f"{where} must not be null: give a {_TYPE_NAMES.get(self.type)} (default {self.default!r})")
        value = self._coerce(value, where)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{where} is {value!r}: use one of {list(self.choices)}")
        if self.type in (int, float):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where} is {value!r}: use a finite number")
            if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
                raise ConfigError(f"{where} is {value!r}: it must be {'>=' if self.low_inclusive else '>'} {self.low}")
            if self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive)):
                raise ConfigError(f"{where} is {value!r}: it must be {'<=' if self.high_inclusive else '<'} {self.high}")
        return value

    def _coerce(self, value: Any, where: str) -> Any:
        t = self.type
        if t is bool:
            if isinstance(value, bool):
                return value
            raise ConfigError(f"{where} is {value!r} ({type(value).__name__}): use true or false")
        if t is int:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    return int(value)
                raise ConfigError(f"{where} is {value!r} ({type(value).__name__}): use an integer")
            return value
        if t is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                if isinstance(value, str):
                    try:
                        return float(value)  # YAML reads 1e-4 as a string
                    except ValueError:
                        pass
                raise ConfigError(f"{where} is {value!r} ({type(value).__name__}): use a number")
            return float(value)
        if t is str:
            if not isinstance(value, str):
                raise ConfigError(f"{where} is {value!r} ({type(value).__name__}): use a string")
            return value
        if t is list:
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{where} is {value!r}: use a list")
            if self.item_type is not None:
                inner = Param(self.name, self.item_type, None)
                return [inner._coerce(v, where) for v in value]
            return list(value)
        return value


def validate_params(owner: str, specs: tuple[Param, ...], given: dict[str, Any] | None) -> dict[str, Any]:
    """Check ``given`` against ``specs``: unknown names get a suggestion, values are coerced and range-checked."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ConfigError(f"{owner}: parameters must be a mapping of name: value (got {type(given).__name__})")
    given = dict(given)
    by_name = {p.name: p for p in specs}
    for key in given:
        if key not in by_name:
            close = difflib.get_close_matches(str(key), list(by_name), n=1)
            hint = f"did you mean '{close[0]}'?" if close else (
                f"known parameters: {', '.join(by_name) or 'none'}")
            raise ConfigError(f"{owner}: unknown parameter '{key}': {hint}")
    out = {}
    for p in specs:
        if p.name in given:
            out[p.name] = p.validate(given[p.name], owner)
        else:
            try:
                out[p.name] = p.validate(p.default, owner) if p.default is not None or not p.nullable else None
            except ConfigError as exc:  # the plugin's own default is broken: that is the plugin's bug
                from bench.errors import PluginError
                raise PluginError(f"{exc} (this is the plugin's declared default: fix the plugin)") from None
    return out
