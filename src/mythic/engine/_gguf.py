"""A small, defensive reader for the header and metadata of a GGUF file.

Used to reject files that are not GGUF before they reach llama.cpp, and to read the chat
template and context length of a user's own model. Every length read from the file is bounded,
so a corrupt or hostile file yields `NotAGGUFError`, never a crash or a huge allocation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from mythic.engine._errors import NotAGGUFError

GGUF_MAGIC = b"GGUF"
_MAX_STRING = 16 * 1024 * 1024  # chat templates are a few KB; tokenizer entries are tiny
_MAX_ARRAY = 1 << 24
_MAX_KV = 1 << 16

# GGUF value types (gguf spec): scalar struct formats, 8 = string, 9 = array.
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(slots=True)
class GGUFInfo:
    """What the header says about a GGUF model file."""

    path: Path
    version: int
    tensor_count: int
    metadata: dict[str, object] = field(default_factory=dict)

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def context_length(self) -> int | None:
        arch = self.architecture
        value = self.metadata.get(f"{arch}.context_length") if arch else None
        return value if isinstance(value, int) else None

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None


class _Reader:
    def __init__(self, fh: BinaryIO, path: Path) -> None:
        self._fh = fh
        self._path = path

    def _fail(self, why: str) -> NotAGGUFError:
        return NotAGGUFError(f"{self._path} is not a valid GGUF file: {why}")

    def exact(self, n: int) -> bytes:
        data = self._fh.read(n)
        if len(data) != n:
            raise self._fail("truncated header")
        return data

    def unpack(self, fmt: str) -> object:
        value: object = struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]
        return value

    def u32(self) -> int:
        return int(struct.unpack("<I", self.exact(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.exact(8))[0])

    def string(self) -> str:
        n = self.u64()
        if n > _MAX_STRING:
            raise self._fail(f"string of {n} bytes in the metadata")
        try:
            return self.exact(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail("metadata string is not UTF-8") from exc

    def value(self, vtype: int) -> object:
        """Read one value; arrays (token lists, merges) are skipped and read as None."""
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.u32()
            n = self.u64()
            if n > _MAX_ARRAY:
                raise self._fail(f"array of {n} items in the metadata")
            if item_type in _SCALARS:
                self._fh.seek(n * struct.calcsize(_SCALARS[item_type]), 1)
            else:
                for _ in range(n):
                    self.value(item_type)
            return None
        raise self._fail(f"unknown metadata value type {vtype}")


def read_gguf_info(path: str | Path, *, metadata: bool = True) -> GGUFInfo:
    """Read a GGUF file's header and, with `metadata`, its scalar metadata.

    Raises:
        NotAGGUFError: the path is missing, not a file, or not a GGUF v2/v3 file.
    """
    p = Path(path)
    if not p.is_file():
        raise NotAGGUFError(f"{p} does not exist or is not a file")
    try:
        with p.open("rb") as fh:
            reader = _Reader(fh, p)
            magic = fh.read(4)
            if magic != GGUF_MAGIC:
                raise NotAGGUFError(
                    f"{p} is not a GGUF model file (it starts with {magic!r}, not b'GGUF')"
                )
            version = reader.u32()
            if version not in (2, 3):
                raise reader._fail(f"unsupported GGUF version {version}")
            tensor_count = reader.u64()
            kv_count = reader.u64()
            if kv_count > _MAX_KV:
                raise reader._fail(f"{kv_count} metadata entries")
            values: dict[str, object] = {}
            for _ in range(kv_count if metadata else 0):
                key = reader.string()
                vtype = reader.u32()
                value = reader.value(vtype)
                if value is not None:
                    values[key] = value
    except OSError as exc:
        raise NotAGGUFError(f"cannot read {p}: {exc.strerror or exc}") from exc
    return GGUFInfo(path=p, version=version, tensor_count=tensor_count, metadata=values)
