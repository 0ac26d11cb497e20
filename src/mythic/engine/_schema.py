"""Make a JSON schema's constraints enforceable by a grammar, or refuse it.

llama.cpp's schema-to-GBNF converter ignores numeric bounds: an intent schema saying
`urgency: 1..5` would let the model write 12. Small integer ranges become enums (which the
grammar enforces); constraints no grammar here can enforce are refused with `GrammarError`
before the request is queued, so a constrained reply that finishes always validates.
"""

from __future__ import annotations

import math
from typing import Any

from mythic.engine._errors import GrammarError

MAX_ENUM_RANGE = 256
"""Widest integer range turned into an enum."""

_NESTED_SCHEMAS = ("items", "additionalProperties", "not", "contains")
_NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def enforceable_schema(schema: Any, path: str = "#", depth: int = 0) -> Any:
    """A copy of `schema` whose every constraint the grammar enforces.

    Raises:
        GrammarError: a constraint cannot be enforced (a wide or unbounded numeric range,
            multipleOf, a bound on a non-integer), a $ref is remote, or the schema nests
            absurdly deep.
    """
    if depth > 64:
        raise GrammarError(f"the JSON schema nests more than 64 levels deep at {path}")
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        # The converter would fetch a remote $ref over the network while the caller waits.
        raise GrammarError(f"{path}: only local $refs ('#/...') are allowed, not {ref!r}")
    out = dict(schema)
    for key in _NESTED_SCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = enforceable_schema(out[key], f"{path}/{key}", depth + 1)
    for key in _NESTED_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [
                enforceable_schema(item, f"{path}/{key}/{i}", depth + 1)
                for i, item in enumerate(out[key])
            ]
    for key in _NESTED_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {
                name: enforceable_schema(sub, f"{path}/{key}/{name}", depth + 1)
                for name, sub in out[key].items()
            }
    if "multipleOf" in out:
        raise GrammarError(f"{path}: multipleOf cannot be enforced by the grammar")
    if any(bound in out for bound in _BOUNDS):
        out = _bounded_integer(out, path)
    return out


def _bounded_integer(schema: dict[str, Any], path: str) -> dict[str, Any]:
    if schema.get("type") != "integer":
        raise GrammarError(
            f"{path}: numeric bounds are only enforced on integers (as an enum of at most "
            f"{MAX_ENUM_RANGE} values)",
            fix="use an integer range or an enum",
        )
    low, high = -math.inf, math.inf
    try:
        if "minimum" in schema:
            low = max(low, math.ceil(schema["minimum"]))
        if "exclusiveMinimum" in schema:
            low = max(low, math.floor(schema["exclusiveMinimum"]) + 1)
        if "maximum" in schema:
            high = min(high, math.floor(schema["maximum"]))
        if "exclusiveMaximum" in schema:
            high = min(high, math.ceil(schema["exclusiveMaximum"]) - 1)
    except (TypeError, ValueError, OverflowError) as exc:
        raise GrammarError(f"{path}: a bound is not a number: {exc}") from exc
    if not (math.isfinite(low) and math.isfinite(high)) or high - low >= MAX_ENUM_RANGE:
        raise GrammarError(
            f"{path}: the integer range must be bounded on both sides and hold at most "
            f"{MAX_ENUM_RANGE} values to be enforced",
            fix="narrow the range, or drop the bounds and check the value yourself",
        )
    if high < low:
        raise GrammarError(f"{path}: no integer satisfies the bounds")
    values = list(range(int(low), int(high) + 1))
    if "enum" in schema:
        values = [v for v in schema["enum"] if v in values]
    out = {k: v for k, v in schema.items() if k not in _BOUNDS and k != "type"}
    out["enum"] = values
    return out
