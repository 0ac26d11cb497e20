"""The `.meta` files of the Unity package (`clients/unity`).

Unity keeps an asset's identity (its GUID) and importer settings in a `.meta` file beside it.
A package installed from git or a registry is read-only, so Unity cannot write them: an asset
without one is ignored ("has no meta file, but it's in an immutable folder"). They are
committed, with GUIDs derived from the asset's path in the package, so that running this again
gives the same files and a moved file gets a new identity.

    python tools/unity_meta.py          # write the missing or stale .meta files, delete orphans
    python tools/unity_meta.py --check  # exit 1 and list what differs (a test runs this)

Hidden names (`.build`) and folders ending in `~` (`Samples~`, `Generator~`) are skipped, as
Unity skips them.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "unity"

# Unity writes these keys with a space after the colon and no value.
_TAIL = "".join(f"  {key}: \n" for key in ("userData", "assetBundleName", "assetBundleVariant"))

_IMPORTERS = {
    ".cs": """MonoImporter:
  externalObjects: {}
  serializedVersion: 2
  defaultReferences: []
  executionOrder: 0
  icon: {instanceID: 0}
""",
    ".asmdef": """AssemblyDefinitionImporter:
  externalObjects: {}
""",
    ".md": """TextScriptImporter:
  externalObjects: {}
""",
    ".json": """TextScriptImporter:
  externalObjects: {}
""",
}
_DEFAULT = """DefaultImporter:
  externalObjects: {}
"""
_MANIFEST = """PackageManifestImporter:
  externalObjects: {}
"""


def guid(relative: str) -> str:
    """The asset's GUID: 32 hex digits from its path in the package (stable across runs)."""
    return hashlib.md5(f"com.mythic-npc.client/{relative}".encode()).hexdigest()


def meta(path: Path, package: Path = PACKAGE) -> str:
    """The `.meta` file's text for `path` (a file or folder of the package)."""
    relative = path.relative_to(package).as_posix()
    head = f"fileFormatVersion: 2\nguid: {guid(relative)}\n"
    if path.is_dir():
        return f"{head}folderAsset: yes\n{_DEFAULT}{_TAIL}"
    importer = _MANIFEST if relative == "package.json" else _IMPORTERS.get(path.suffix, _DEFAULT)
    return f"{head}{importer}{_TAIL}"


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith("~")


def assets(folder: Path = PACKAGE) -> list[Path]:
    """Every file and folder Unity imports from the package (under `folder`), `.meta` files
    aside."""
    found: list[Path] = []
    for path in sorted(folder.iterdir()):
        if _skipped(path.name) or path.suffix == ".meta":
            continue
        found.append(path)
        if path.is_dir():
            found += assets(path)
    return found


def differences(package: Path = PACKAGE) -> dict[Path, str | None]:
    """What to write (`.meta` path -> text) or delete (-> None) to match the package."""
    wanted = {p.with_name(p.name + ".meta"): meta(p, package) for p in assets(package)}
    changes: dict[Path, str | None] = {
        path: text for path, text in wanted.items() if not path.exists() or path.read_text() != text
    }
    for existing in package.rglob("*.meta"):
        hidden = any(_skipped(part) for part in existing.relative_to(package).parts[:-1])
        if existing not in wanted and not hidden:
            changes[existing] = None
    return changes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    args = parser.parse_args()
    changes = differences()
    if args.check:
        for path, text in sorted(changes.items()):
            print(f"{'stale or missing' if text is not None else 'orphan'}: {path}")
        return 1 if changes else 0
    for path, text in changes.items():
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
    print(f"{len(changes)} .meta files written or removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
