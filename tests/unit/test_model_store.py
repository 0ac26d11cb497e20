"""The store's real assembly, hashing and resolution code, on small files made by the test."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mythic.engine import (
    PACKAGED_MODELS,
    ChatFormat,
    ModelIntegrityError,
    ModelNotInstalledError,
    ModelStore,
    NotAGGUFError,
    PackagedModel,
    UnknownModelError,
    packaged_model,
)
from mythic.engine.models import ConcatParts, PackageFile, SingleFile
from tests.gguf_files import gguf_bytes, write_gguf

pytestmark = pytest.mark.unit

CONTENT = gguf_bytes({"general.architecture": "llama"}) + bytes(range(256)) * 64


@pytest.fixture
def part_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Three importable packages `fakeparts_1..3`, each with data/part.bin: CONTENT in thirds."""
    site = tmp_path / "site"
    third = len(CONTENT) // 3 + 1
    for i in range(3):
        pkg = site / f"fakeparts_{i + 1}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / "part.bin").write_bytes(CONTENT[i * third : (i + 1) * third])
    monkeypatch.syspath_prepend(str(site))
    yield site
    for i in range(3):
        sys.modules.pop(f"fakeparts_{i + 1}", None)


def _spec(sha256: str, size: int = len(CONTENT)) -> PackagedModel:
    return PackagedModel(
        name="tiny-test",
        title="tiny",
        packages=(),
        assembly=ConcatParts(
            tuple(PackageFile(f"fakeparts_{i}", "data/part.bin") for i in (1, 2, 3))
        ),
        size=size,
        sha256=sha256,
        chat_format=ChatFormat.CHATML,
        licence="Apache-2.0",
        context_length=512,
        role="test",
    )


GOOD = _spec(hashlib.sha256(CONTENT).hexdigest())


def test_registry_entries_are_complete() -> None:
    names = [m.name for m in PACKAGED_MODELS]
    assert len(set(names)) == len(names)
    assert {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma3-270m"} <= set(names)
    for m in PACKAGED_MODELS:
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert m.size > 0 and m.context_length > 0 and m.licence and m.packages
    assert packaged_model("gemma3-270m").chat_format is None
    assert packaged_model("smollm2-135m-instruct").size == 98_362_432


def test_concatenates_parts_in_order_and_records_the_hash(
    part_packages: Path, tmp_path: Path
) -> None:
    store = ModelStore(tmp_path / "models")
    seen: list[int] = []
    path = store.fetch(GOOD, progress=lambda done, total: seen.append(done))
    assert path.read_bytes() == CONTENT
    assert seen[-1] == len(CONTENT)
    assert store.status(GOOD).verified
    assert store.verify(GOOD).ok
    (record_file,) = (tmp_path / "models" / "verified").glob("tiny-test-*.json")
    record = json.loads(record_file.read_text())
    assert record["sha256"] == GOOD.sha256
    assert record["path"] == str(path)


def test_a_hash_mismatch_is_an_error_and_the_file_is_not_used(
    part_packages: Path, tmp_path: Path
) -> None:
    store = ModelStore(tmp_path / "models")
    bad = _spec("0" * 64)
    with pytest.raises(ModelIntegrityError, match="sha256") as info:
        store.fetch(bad)
    assert info.value.fix == "mythic models fetch tiny-test --force"
    assert not (tmp_path / "models" / "tiny-test.gguf").exists()
    assert not list((tmp_path / "models").glob("*.partial"))


def test_a_size_mismatch_is_reported(part_packages: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelIntegrityError, match="expected 12"):
        ModelStore(tmp_path / "models").fetch(_spec(GOOD.sha256, size=12))


def test_fetch_is_a_no_op_once_verified(part_packages: Path, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    path = store.fetch(GOOD)
    mtime = path.stat().st_mtime_ns
    assert store.fetch(GOOD) == path
    assert path.stat().st_mtime_ns == mtime


def test_a_tampered_file_is_rehashed_and_refused(
    part_packages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ModelStore(tmp_path / "models")
    path = store.fetch(GOOD)
    monkeypatch.setattr("mythic.engine.models.PACKAGED_MODELS", (GOOD,))
    assert store.resolve("tiny-test").path == path
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, new mtime: the record no longer matches
    os.utime(path, ns=(1, 1))
    with pytest.raises(ModelIntegrityError, match="sha256"):
        store.resolve("tiny-test")
    report = store.verify(GOOD)
    assert not report.ok and report.problem and "sha256" in report.problem


def test_an_unfetched_model_names_the_command_that_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mythic.engine.models.PACKAGED_MODELS", (GOOD,))
    with pytest.raises(ModelNotInstalledError) as info:
        ModelStore(tmp_path / "models").resolve("tiny-test")
    assert info.value.fix == "mythic models fetch tiny-test"


def test_a_missing_part_package_is_a_typed_error(tmp_path: Path) -> None:
    spec = _spec(GOOD.sha256)
    with pytest.raises(ModelNotInstalledError, match="fakeparts_1"):
        ModelStore(tmp_path / "models").fetch(spec)
    assert not list((tmp_path / "models").glob("*"))


def test_single_file_models_are_used_in_place(part_packages: Path, tmp_path: Path) -> None:
    content = (part_packages / "fakeparts_1" / "data" / "part.bin").read_bytes()
    spec = PackagedModel(
        name="one-file",
        title="one",
        packages=(),
        assembly=SingleFile(PackageFile("fakeparts_1", "data/part.bin")),
        size=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
        chat_format=ChatFormat.CHATML,
        licence="Apache-2.0",
        context_length=512,
        role="test",
    )
    store = ModelStore(tmp_path / "models")
    assert store.fetch(spec) == part_packages / "fakeparts_1" / "data" / "part.bin"


def test_resolves_a_local_gguf_path_and_detects_its_format(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "mine.gguf",
        {
            "general.architecture": "qwen2",
            "qwen2.context_length": 32768,
            "tokenizer.chat_template": "<|im_start|>",
        },
    )
    resolved = ModelStore(tmp_path).resolve(str(path))
    assert resolved.chat_format is ChatFormat.CHATML
    assert resolved.context_length == 32768
    assert resolved.spec is None
    override = ModelStore(tmp_path).resolve(str(path), chat_format="llama-3")
    assert override.chat_format is ChatFormat.LLAMA3


def test_a_path_that_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(NotAGGUFError, match="not a GGUF"):
        ModelStore(tmp_path).resolve(str(text))
    with pytest.raises(NotAGGUFError, match="does not exist"):
        ModelStore(tmp_path).resolve(str(tmp_path / "missing.gguf"))


def test_an_unknown_name_lists_the_packaged_models(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="smollm2-135m-instruct"):
        ModelStore(tmp_path).resolve("gpt-17")


def test_an_unrecorded_file_is_hashed_not_reassembled(part_packages: Path, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    path = store.fetch(GOOD)
    mtime = path.stat().st_mtime_ns
    for record in (tmp_path / "models" / "verified").iterdir():
        record.unlink()
    assert not store.status(GOOD).verified
    assert store.fetch(GOOD) == path
    assert path.stat().st_mtime_ns == mtime
    assert store.status(GOOD).verified


def test_a_corrupt_file_is_reassembled_by_fetch(part_packages: Path, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    path = store.fetch(GOOD)
    path.write_bytes(b"GGUF" + bytes(len(CONTENT) - 4))
    assert store.fetch(GOOD).read_bytes() == CONTENT
