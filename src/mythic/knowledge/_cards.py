"""YAML cards validated by pydantic, with errors that name the file, the line and the field."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from mythic._errors import MythicError

Card = TypeVar("Card", bound=BaseModel)

MAX_CARD_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class WorldProblem:
    """One thing wrong in a world folder."""

    file: Path
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else f"{self.file}"
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


class WorldLoadError(MythicError):
    """A world folder or one of its cards is malformed; nothing of the world is loaded."""

    def __init__(self, problems: list[WorldProblem]) -> None:
        lines = "\n".join(f"  {p}" for p in problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"world not loaded, {len(problems)} {noun}:\n{lines}")
        self.problems = problems


def _field_lines(node: yaml.Node) -> dict[str, int]:
    """Top-level keys of a YAML mapping node -> 1-based line of the key."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    lines: dict[str, int] = {}
    for key, _value in node.value:
        if isinstance(key, yaml.ScalarNode):
            lines[str(key.value)] = key.start_mark.line + 1
    return lines


def _item_line(node: yaml.Node, loc: tuple[int | str, ...]) -> int | None:
    """The line of the value at `loc` inside a mapping node, as deep as it can be followed."""
    line: int | None = None
    current: yaml.Node | None = node
    for part in loc:
        if isinstance(current, yaml.MappingNode):
            nxt = None
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line, nxt = key.start_mark.line + 1, value
                    break
            current = nxt
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int):
            if part < len(current.value):
                current = current.value[part]
                line = current.start_mark.line + 1
            else:
                current = None
        else:
            break
        if current is None:
            break
    return line


def read_text_file(
    path: Path, limit: int = MAX_CARD_BYTES
) -> tuple[str | None, list[WorldProblem]]:
    """Read a small UTF-8 text file of a world, or say why it cannot be used.

    Only regular files are read, and never more than `limit` bytes: a card that is a link to a
    device or a huge file is a problem to report, not a read that never ends.
    """
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return None, [WorldProblem(path, None, None, "not a regular file")]
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        return None, [WorldProblem(path, None, None, f"cannot read: {exc.strerror or exc}")]
    if len(raw) > limit:
        size = max(st.st_size, len(raw))
        return None, [WorldProblem(path, None, None, f"{size} bytes; the limit is {limit} bytes")]
    try:
        return raw.decode("utf-8"), []
    except UnicodeDecodeError:
        return None, [WorldProblem(path, None, None, "not UTF-8 text")]


def load_card(
    path: Path,
    model: type[Card],
    *,
    context: dict[str, object] | None = None,
    limit: int = MAX_CARD_BYTES,
) -> tuple[Card | None, list[WorldProblem]]:
    """Parse and validate one YAML card of at most `limit` bytes; return the card or the
    problems found.

    `context` is handed to the model's validators (e.g. the zones a world declares).
    """
    text, problems = read_text_file(path, limit)
    if text is None:
        return None, problems
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        why = exc.problem or exc.context or "invalid YAML"
        return None, [WorldProblem(path, line, None, f"invalid YAML: {why}")]
    except yaml.YAMLError as exc:
        return None, [WorldProblem(path, None, None, f"invalid YAML: {exc}")]
    except RecursionError:
        return None, [WorldProblem(path, None, None, "invalid YAML: nested too deeply")]
    if not isinstance(data, dict) or node is None:
        kind = "empty" if data is None else f"a {type(data).__name__}"
        return None, [WorldProblem(path, 1, None, f"expected a mapping of fields, got {kind}")]
    try:
        return model.model_validate(data, context=context), []
    except ValidationError as exc:
        field_lines = _field_lines(node)
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            field = ".".join(str(p) for p in loc) or None
            line = _item_line(node, loc) if loc else None
            if line is None:
                line = field_lines.get(str(loc[0])) if loc else None
            problems.append(WorldProblem(path, line or node.start_mark.line + 1, field, err["msg"]))
        return None, problems
