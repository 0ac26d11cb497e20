"""The Unity package's `.meta` files (`tools/unity_meta.py`): one per asset, none left over,
GUIDs stable and unique."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tools.unity_meta import PACKAGE, assets, differences, guid, meta

pytestmark = pytest.mark.unit


def test_every_asset_of_the_package_has_its_meta_file_and_no_meta_is_left_over() -> None:
    stale = differences()
    assert not stale, (
        f"{sorted(str(p.relative_to(PACKAGE)) for p in stale)}: run `python tools/unity_meta.py`"
    )


def test_guids_are_unique_and_what_unity_reads() -> None:
    found = [re.search(r"^guid: (\w+)$", meta(p), re.MULTILINE) for p in assets()]
    guids = [m.group(1) for m in found if m is not None]
    assert len(guids) == len(found) == len(set(guids))
    assert all(re.fullmatch(r"[0-9a-f]{32}", g) for g in guids)
    assert guid("Runtime/MythicClient.cs") == guid("Runtime/MythicClient.cs")
    assert guid("Runtime/MythicClient.cs") != guid("Runtime/Turn.cs")


def test_a_new_file_gets_a_meta_an_orphan_is_removed_and_hidden_folders_are_skipped(
    tmp_path: Path,
) -> None:
    (tmp_path / "Runtime").mkdir()
    (tmp_path / "Runtime" / "New.cs").write_text("class New {}")
    (tmp_path / "Samples~").mkdir()
    (tmp_path / "Samples~" / "Sample.cs").write_text("class Sample {}")
    (tmp_path / ".build").mkdir()
    (tmp_path / "Gone.cs.meta").write_text("fileFormatVersion: 2\n")
    changes = differences(tmp_path)
    assert set(changes) == {
        tmp_path / "Runtime.meta",
        tmp_path / "Runtime" / "New.cs.meta",
        tmp_path / "Gone.cs.meta",
    }
    assert changes[tmp_path / "Gone.cs.meta"] is None
    written = changes[tmp_path / "Runtime" / "New.cs.meta"]
    assert written is not None and "MonoImporter:" in written
    assert "folderAsset: yes" in (changes[tmp_path / "Runtime.meta"] or "")
