from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mythic.engine import ChatFormat, NotAGGUFError, read_gguf_info
from tests.gguf_files import gguf_bytes, write_gguf

pytestmark = pytest.mark.unit

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"


def test_reads_scalars_and_skips_token_arrays(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "m.gguf",
        {
            "general.architecture": "llama",
            "general.name": "tiny",
            "llama.context_length": 2048,
            "tokenizer.ggml.tokens": ["<s>", "a", "b"],
            "tokenizer.ggml.token_type": [1, 1, 1],
            "tokenizer.chat_template": CHATML,
            "general.quantized": True,
            "x.scale": 0.5,
        },
        tensors=7,
    )
    info = read_gguf_info(path)
    assert (info.version, info.tensor_count) == (3, 7)
    assert info.architecture == "llama"
    assert info.context_length == 2048
    assert ChatFormat.detect(info.chat_template) is ChatFormat.CHATML
    assert "tokenizer.ggml.tokens" not in info.metadata
    assert info.metadata["general.quantized"] is True


def test_header_only_mode_reads_no_metadata(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", {"general.architecture": "llama"})
    assert read_gguf_info(path, metadata=False).metadata == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"name: not a model\n", "not a GGUF model file"),
        (b"", "not a GGUF model file"),
        (b"GGUF\x03\x00", "truncated header"),
        (b"GGUF" + struct.pack("<IQQ", 99, 0, 0), "unsupported GGUF version 99"),
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40), "string of"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40), "metadata entries"),
        (gguf_bytes({"k": "v"})[:-1], "truncated header"),
        (gguf_bytes({"k": "v"}).replace(struct.pack("<I", 8), struct.pack("<I", 42)), "type 42"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"\xff", "not UTF-8"),
    ],
)
def test_malformed_files_get_a_typed_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(NotAGGUFError, match=message):
        read_gguf_info(path)


def test_missing_file_and_folder_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(NotAGGUFError, match="does not exist"):
        read_gguf_info(tmp_path / "nope.gguf")
    with pytest.raises(NotAGGUFError, match="not a file"):
        read_gguf_info(tmp_path)
