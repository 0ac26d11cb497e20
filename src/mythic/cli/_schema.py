"""`mythic schema export`: the v1 wire protocol as JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mythic.cli._console import err, out

schema_app = typer.Typer(help="The v1 wire protocol as JSON Schema, for clients in any language.")


@schema_app.command("export")
def schema_export(
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="Folder to write into (created when missing).")
    ] = Path("schemas"),
) -> None:
    """Write the JSON Schema of the whole protocol, of each direction and of each message."""
    from mythic.contracts import json_schemas

    documents = json_schemas()
    for name, schema in documents.items():
        path = out_dir / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            err.print(f"error: cannot write {path}: {exc.strerror or exc}", style="bold red")
            raise typer.Exit(2) from None
        out.print(f"wrote {path}")
    out.print(f"{len(documents)} JSON Schema files (draft 2020-12) in {out_dir}")
