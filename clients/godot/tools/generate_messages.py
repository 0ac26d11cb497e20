"""Generates the Godot addon's message definitions from the JSON Schema the server exports
(`mythic schema export --out DIR`): `addons/mythic/generated/messages.gd`, the message types,
their required fields, enum values, field rules and cross-field rules the addon validates
outgoing (and incoming) messages with.

No maintained JSON Schema to GDScript generator exists, so this one is small and reads only
the keywords the v1 schema uses; any other keyword fails the generation instead of being
dropped quietly. The output is checked in; `tests/integration/test_sdk_godot.py` regenerates it
and fails when it differs.

    python clients/godot/tools/generate_messages.py --schema DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "addons" / "mythic" / "generated" / "messages.gd"

# The keywords a field rule may hold; each becomes a key of the GDScript rule.
_RULE_KEYS = {
    "const": "const",
    "enum": "enum",
    "minLength": "min_length",
    "maxLength": "max_length",
    "pattern": "pattern",
    "minimum": "minimum",
    "maximum": "maximum",
    "minItems": "min_items",
    "maxItems": "max_items",
    "uniqueItems": "unique_items",
}
# Keywords that say nothing a client checks (documentation, defaults, the encoding of pcm:
# its pattern checks it).
_IGNORED = {"title", "description", "default", "contentEncoding"}
# The keywords of a message's definition; `allOf` holds its cross-field rules.
_DEFINITION_KEYS = {"type", "additionalProperties", "required", "properties", "allOf"}
# The JSON type of a `const` that comes without one (`{"const": true}` in a rule's `if`): the
# addon compares a value with the const only once it has the const's type.
_CONST_TYPES = {bool: "boolean", str: "string", int: "integer", float: "number"}
_SIMPLE_PATTERN = re.compile(r"\^((?:\[[^\]\\]+\](?:\{\d+(?:,\d+)?\})?)+)\$")
_SEGMENT = re.compile(r"\[([^\]\\]+)\](?:\{(\d+)(?:,(\d+))?\})?")


class SchemaError(ValueError):
    """The schema uses something this generator does not translate."""


def _charset(spec: str) -> str:
    """The characters of a regex class body without escapes (`A-Za-z0-9_.:-`), spelled out."""
    chars: list[str] = []
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            chars.extend(chr(c) for c in range(ord(spec[i]), ord(spec[i + 2]) + 1))
            i += 3
        else:
            chars.append(spec[i])
            i += 1
    return "".join(dict.fromkeys(chars))


def _segments(pattern: str) -> list[list[Any]] | None:
    """A pattern that is a run of character classes anchored at both ends, as
    [characters, min, max] segments a GDScript loop checks without RegEx; None otherwise."""
    whole = _SIMPLE_PATTERN.fullmatch(pattern)
    if whole is None or "^" in whole.group(1):
        return None
    segments: list[list[Any]] = []
    for found in _SEGMENT.finditer(whole.group(1)):
        low = int(found.group(2) or 1)
        high = int(found.group(3) or found.group(2) or 1)
        segments.append([_charset(found.group(1)), low, high])
    # The addon matches each run greedily, which is exact only when no character a run of
    # variable length may take could also start a later run: else RegEx checks the pattern.
    for i, (chars, low, high) in enumerate(segments):
        if low != high and any(set(chars) & set(later[0]) for later in segments[i + 1 :]):
            return None
    return segments


def _rule(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """One alternative of a field: its JSON type and the constraints on it."""
    if "$ref" in schema:
        return {"ref": schema["$ref"].rsplit("/", 1)[-1]}
    rule: dict[str, Any] = {"type": schema.get("type", "any")}
    if "type" not in schema and type(schema.get("const")) in _CONST_TYPES:
        rule["type"] = _CONST_TYPES[type(schema["const"])]
    for key, value in schema.items():
        if key in _IGNORED or key == "type":
            continue
        if key in _RULE_KEYS:
            rule[_RULE_KEYS[key]] = value
            if key == "pattern" and (segments := _segments(value)) is not None:
                rule["segments"] = segments
        elif key == "items":
            rule["items"] = _alternatives(value, f"{where}[]")
        elif key == "additionalProperties" and schema.get("type") == "object" and value is True:
            continue  # a free-form object (`args`, `result`): any keys
        else:
            raise SchemaError(f"{where}: the keyword {key!r} is not translated")
    return rule


def _alternatives(schema: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A field's rules: a value is valid when it matches one of them (`anyOf`)."""
    if "anyOf" in schema:
        extra = set(schema) - {"anyOf"} - _IGNORED
        if extra:
            raise SchemaError(f"{where}: {sorted(extra)} next to anyOf are not translated")
        return [_rule(option, where) for option in schema["anyOf"]]
    return [_rule(schema, where)]


def _refuse_unknown(schema: dict[str, Any], known: set[str], where: str) -> None:
    if unknown := sorted(set(schema) - known):
        raise SchemaError(f"{where}: the keyword {unknown[0]!r} is not translated")


def _definition(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        raise SchemaError(f"{name}: a message is an object with additionalProperties false")
    _refuse_unknown(schema, _DEFINITION_KEYS | _IGNORED, name)
    return {
        "required": schema.get("required", []),
        "fields": {
            field: _alternatives(rule, f"{name}.{field}")
            for field, rule in schema.get("properties", {}).items()
        },
    }


def _part(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """One part of a cross-field rule: the fields it requires, and the rules a field's value
    must match when the field is there (JSON Schema's `required` and `properties`)."""
    _refuse_unknown(schema, {"required", "properties"}, where)
    return {
        "required": schema.get("required", []),
        "fields": {
            field: _alternatives(rule, f"{where}.{field}")
            for field, rule in schema.get("properties", {}).items()
        },
    }


def _cross_field_rules(name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's `allOf` of `if`/`then`/`else` rules: when it meets `if`, it must meet
    `then`, else `else` (when there is one)."""
    rules: list[dict[str, Any]] = []
    for i, rule in enumerate(schema.get("allOf", [])):
        where = f"{name}.allOf[{i}]"
        _refuse_unknown(rule, {"if", "then", "else"}, where)
        if "if" not in rule or not {"then", "else"} & set(rule):
            raise SchemaError(f"{where}: a rule is an if with a then or an else")
        rules.append(
            {
                key: _part(rule[key], f"{where}.{key}")
                for key in ("if", "then", "else")
                if key in rule
            }
        )
    return rules


def _types(schema: dict[str, Any]) -> list[str]:
    return sorted(schema["discriminator"]["mapping"])


def _gd(value: Any) -> str:
    """A GDScript literal on one line: JSON's syntax is GDScript's for these values (null,
    true, dicts, arrays, strings with \\uXXXX escapes)."""
    return json.dumps(value, ensure_ascii=True)


def _gd_table(table: dict[str, Any], levels: int, indent: int = 1) -> str:
    """A dictionary literal with one key per line for `levels` levels of nested dictionaries;
    below that, each value on its line."""
    rows = [
        "\t" * indent
        + f"{_gd(key)}: "
        + (
            _gd_table(value, levels - 1, indent + 1)
            if levels > 1 and isinstance(value, dict)
            else _gd(value)
        )
        + ","
        for key, value in table.items()
    ]
    return "{\n" + "\n".join(rows) + "\n" + "\t" * (indent - 1) + "}"


def _gd_lists(table: dict[str, list[Any]]) -> str:
    """A dictionary literal of lists, one item a line."""
    rows = [
        f"\t{_gd(key)}: [\n" + "".join(f"\t\t{_gd(item)},\n" for item in items) + "\t],"
        for key, items in table.items()
    ]
    return "{\n" + "\n".join(rows) + "\n}"


def _enums(defs: dict[str, Any]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for name, definition in defs.items():
        for field, alternatives in definition["fields"].items():
            for rule in alternatives:
                if "enum" in rule:
                    found[f"{name}.{field}"] = rule["enum"]
    return found


def generate(schema_dir: Path) -> str:
    """The GDScript source of the message definitions for the schema in `schema_dir`."""
    protocol = json.loads((schema_dir / "mythic-v1.schema.json").read_text())
    client = json.loads((schema_dir / "mythic-v1-client.schema.json").read_text())
    server = json.loads((schema_dir / "mythic-v1-server.schema.json").read_text())
    defs = {name: _definition(name, s) for name, s in sorted(protocol["$defs"].items())}
    rules = {
        name: found
        for name, s in sorted(protocol["$defs"].items())
        if (found := _cross_field_rules(name, s))
    }
    versions = {
        d["fields"]["schema_version"][0]["const"]
        for d in defs.values()
        if "schema_version" in d["fields"]
    }
    if len(versions) != 1:
        raise SchemaError(f"one schema_version expected, found {sorted(versions)}")
    lines = [
        "# GENERATED by clients/godot/tools/generate_messages.py from `mythic schema export`",
        "# (mythic-v1.schema.json, mythic-v1-client and -server.schema.json): do not edit.",
        "extends Reference",
        "",
        "# The protocol version these definitions are of.",
        f"const SCHEMA_VERSION = {_gd(versions.pop())}",
        "",
        "# The message types a game client sends.",
        f"const CLIENT_TYPES = {_gd(_types(client))}",
        "",
        "# The message types the server sends.",
        f"const SERVER_TYPES = {_gd(_types(server))}",
        "",
        "# The values of each enum field, by `Message.field`.",
        f"const ENUMS = {_gd_table(_enums(defs), 1)}",
        "",
        "# Every message and nested object: its required fields, and per field the rules a",
        "# value may match (one of them): `type` (string, integer, number, boolean, object, array,",
        "# null), `const`, `enum`, `min_length`, `max_length`, `pattern` (and `segments`, the same",
        "# pattern as [characters, min, max] runs), `minimum`, `maximum`, `items`, `max_items`, or",
        "# `ref` (another definition). No field outside `fields` is allowed.",
        f"const DEFS = {_gd_table(defs, 3)}",
        "",
        "# The cross-field rules of a message or nested object (the schema's `allOf` of",
        "# `if`/`then`/`else`): when it meets `if`, it must meet `then`, else `else` (when there",
        "# is one). A part holds `required` fields and `fields`, the rules (as in DEFS) a field's",
        "# value must match when the field is there.",
        f"const RULES = {_gd_lists(rules)}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schema", type=Path, required=True, help="`mythic schema export` dir")
    parser.add_argument("--out", type=Path, default=OUT, help=f"default {OUT}")
    args = parser.parse_args(argv)
    try:
        source = generate(args.schema)
    except SchemaError as exc:
        print(f"cannot generate: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
