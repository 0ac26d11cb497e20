"""Small GGUF files written byte by byte, to test the reader and the store without a model."""

from __future__ import annotations

import struct
from pathlib import Path


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(metadata: dict[str, object], *, version: int = 3, tensors: int = 0) -> bytes:
    """A GGUF header with `metadata`: str, int (u32), float, bool, or list[str] / list[int]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, tensors, len(metadata)))
    for key, value in metadata.items():
        out += _string(key)
        if isinstance(value, bool):
            out += struct.pack("<I?", 7, value)
        elif isinstance(value, int):
            out += struct.pack("<II", 4, value)
        elif isinstance(value, float):
            out += struct.pack("<If", 6, value)
        elif isinstance(value, str):
            out += struct.pack("<I", 8) + _string(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i", *value)
        else:
            raise TypeError(value)
    return bytes(out)


def write_gguf(path: Path, metadata: dict[str, object] | None = None, **kwargs: int) -> Path:
    path.write_bytes(gguf_bytes(metadata or {}, **kwargs))
    return path
