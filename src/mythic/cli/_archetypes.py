"""`mythic archetypes list|show|register|provision`: the archetype chain registry."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from mythic._errors import MissingExtraError
from mythic.cli._console import err, guard, load_config, out
from mythic.cli._options import (
    BaseModelOption,
    BatchOption,
    ConfigOption,
    JsonOption,
    LearningRateOption,
    RankOption,
    StepsOption,
)

if TYPE_CHECKING:
    from mythic.archetypes import AdapterInfo, ArchetypeChain, ArchetypeRegistry


__all__ = ["archetypes_app"]

archetypes_app = typer.Typer(
    help="Archetype chains: each archetype's adapter per task, voice, face, body and servers.",
    no_args_is_help=True,
)


T = TypeVar("T")

DEFAULT_WORLD = Path("examples/worlds/ravenmoor")

RegistryOption = Annotated[
    str | None,
    typer.Option(
        "--registry",
        "-r",
        envvar="MYTHIC_ARCHETYPE_REGISTRY",
        help="A registry YAML file, or redis://host:port/db (default: <world>/archetypes.yaml).",
    ),
]
WorldOption = Annotated[
    Path, typer.Option("--world", "-w", help="World folder whose archetypes.yaml is the registry.")
]
PrefixOption = Annotated[str, typer.Option("--prefix", help="Redis key prefix.")]


def _with_registry(
    registry: str | None,
    world: Path,
    prefix: str,
    work: Callable[[ArchetypeRegistry], Awaitable[T]],
) -> T:
    from mythic.archetypes import REGISTRY_FILE, RegistryError, open_registry

    if registry is None:
        if not world.is_dir():
            raise RegistryError(f"no world folder {world}", fix="give --world or --registry")
        registry = str(world / REGISTRY_FILE)
    store = open_registry(registry, prefix=prefix)

    async def run() -> T:
        async with store:
            return await work(store)

    return asyncio.run(run())


def _size(n: int) -> str:
    if n <= 0:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _adapters_summary(chain: ArchetypeChain) -> str:
    if not chain.adapters:
        return "none (base model)"
    return ", ".join(f"{t.value} v{a.version} r{a.rank}" for t, a in chain.adapters.items())


@archetypes_app.command("list")
def archetypes_list(
    registry: RegistryOption = None,
    world: WorldOption = DEFAULT_WORLD,
    prefix: PrefixOption = "mythic:archetypes",
    as_json: JsonOption = False,
) -> None:
    """Every archetype chain: voice, face, body, servers and adapters."""

    async def work(store: ArchetypeRegistry) -> tuple[str, list[ArchetypeChain]]:
        return store.where, await store.list()

    where, chains = guard(lambda: _with_registry(registry, world, prefix, work))
    if as_json:
        out.print(json.dumps([c.model_dump(mode="json") for c in chains], indent=2))
        return
    row = "{:<16} {:<14} {:<14} {:<14} {:<16} {}"
    out.print(row.format("archetype", "voice", "face", "body", "servers", "adapters"))
    for c in chains:
        out.print(
            row.format(
                c.archetype,
                c.voice or "-",
                c.face or "-",
                c.body or "-",
                ", ".join(c.servers) or "-",
                _adapters_summary(c),
            )
        )
    out.print(f"{len(chains)} archetype chains in {where}")


def _adapter_line(info: AdapterInfo, indent: str) -> str:
    return (
        f"{indent}v{info.version:<3} {info.format:<5} rank {info.rank:<3} alpha {info.alpha:<5g} "
        f"{_size(info.size_bytes):>9}  on {info.base_model}  {info.path}"
    )


@archetypes_app.command("show")
def archetypes_show(
    archetype: Annotated[str, typer.Argument(help="Archetype name.")],
    history: Annotated[
        bool, typer.Option("--history", help="Also list each task's earlier adapter versions.")
    ] = False,
    registry: RegistryOption = None,
    world: WorldOption = DEFAULT_WORLD,
    prefix: PrefixOption = "mythic:archetypes",
    as_json: JsonOption = False,
) -> None:
    """One archetype chain: its profiles and the adapter of each task."""
    from mythic.archetypes import AdapterTask

    async def work(store: ArchetypeRegistry) -> tuple[ArchetypeChain, dict[str, list[AdapterInfo]]]:
        chain = await store.require(archetype)
        versions = {t.value: await store.history(archetype, t) for t in AdapterTask}
        return chain, versions

    chain, versions = guard(lambda: _with_registry(registry, world, prefix, work))
    if as_json:
        data = chain.model_dump(mode="json")
        if history:
            data["history"] = {
                task: [i.model_dump(mode="json") for i in infos]
                for task, infos in versions.items()
                if infos
            }
        out.print(json.dumps(data, indent=2))
        return
    out.print(
        f"{chain.archetype}: voice {chain.voice or '-'}, face {chain.face or '-'}, "
        f"body {chain.body or '-'}; servers {', '.join(chain.servers) or '-'}; "
        f"rank budget {chain.max_total_rank}"
    )
    out.print(f"updated {chain.updated_at:%Y-%m-%d %H:%M:%S %Z}")
    for task in AdapterTask:
        info = chain.adapters.get(task)
        if info is None:
            out.print(f"  {task.value:<20} base model")
        else:
            out.print(f"  {task.value:<20} " + _adapter_line(info, "").lstrip())
            if info.trained_on is not None:
                data_line = info.trained_on.description
                if info.trained_on.examples is not None:
                    data_line += f" ({info.trained_on.examples} examples)"
                out.print(f"  {'':<20} trained on: {data_line}")
            if info.metrics:
                scores = ", ".join(f"{k} {v:g}" for k, v in sorted(info.metrics.items()))
                out.print(f"  {'':<20} metrics: {scores}")
        if history:
            earlier = [i for i in versions[task.value] if i != info]
            for old in reversed(earlier):
                out.print(_adapter_line(old, f"  {'':<20} was "))


def _metric(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected NAME=NUMBER, e.g. loss=1.25") from None


def _stored_path(path: Path, store: ArchetypeRegistry) -> str:
    """How the registry records `path`: relative to a registry file's folder when inside it."""
    from mythic.archetypes import YamlRegistry

    absolute = path.expanduser().absolute()
    if isinstance(store, YamlRegistry):
        root = store.root.expanduser().absolute()
        if absolute.is_relative_to(root):
            return absolute.relative_to(root).as_posix()
    return str(absolute)


def _adapter_info(
    task: str,
    path: Path,
    store: ArchetypeRegistry,
    *,
    rank: int | None,
    alpha: float | None,
    fmt: str | None,
    base: str | None,
    trained_on: dict[str, Any] | None,
    metrics: dict[str, float],
) -> tuple[AdapterInfo, str | None]:
    """The record of the adapter at `path`, read from its files where they are here; and a
    note for the user, if any."""
    from mythic.archetypes import (
        AdapterInfo,
        InvalidAdapterError,
        inspect_adapter,
    )

    note = None
    found = None
    if path.exists():
        try:
            found = inspect_adapter(path)
        except MissingExtraError:
            if rank is None:
                raise
            note = "the gguf package is missing: rank and alpha recorded as given"
    else:
        note = f"{path} is not on this machine: recorded as given"
    if found is not None:
        if rank is not None and rank != found.rank:
            raise InvalidAdapterError(f"--rank {rank}, but {path} has rank {found.rank}")
        if fmt is not None and fmt != found.format:
            raise InvalidAdapterError(f"--format {fmt}, but {path} is a {found.format} adapter")
        rank, fmt = found.rank, found.format
        base = base or found.base_model
        alpha = alpha if alpha is not None else found.alpha
    missing = [o for o, known in (("--rank", rank), ("--base", base)) if not known]
    if missing:
        raise InvalidAdapterError(
            f"cannot tell the adapter's {' and '.join(o[2:] for o in missing)} from {path}",
            fix=f"give {' '.join(f'{o} ...' for o in missing)}",
        )
    info = AdapterInfo.model_validate(
        {
            "task": task,
            "path": _stored_path(path, store),
            "format": fmt or ("gguf" if path.suffix == ".gguf" else "peft"),
            "base_model": base,
            "rank": rank,
            "alpha": alpha,
            "target_modules": found.target_modules if found else (),
            "size_bytes": found.size_bytes if found else _file_size(path),
            "trained_on": trained_on,
            "metrics": metrics,
        }
    )
    return info, note


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


@archetypes_app.command("register")
def archetypes_register(
    archetype: Annotated[str, typer.Argument(help="Archetype name: vampire, zombie, ...")],
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            "-t",
            help="Adapter task: personality, dialogue_style, action_policy, emotional_response, "
            "world_knowledge, social_dynamics, goal_prioritization.",
        ),
    ] = None,
    path: Annotated[
        Path | None,
        typer.Option("--path", "-p", help="The adapter: a GGUF LoRA file or a PEFT folder."),
    ] = None,
    rank: Annotated[
        int | None, typer.Option(min=1, help="LoRA rank (default: read from the adapter).")
    ] = None,
    alpha: Annotated[
        float | None, typer.Option(help="LoRA alpha (default: read from the adapter, or the rank).")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="gguf or peft (default: from the adapter).")
    ] = None,
    base: Annotated[
        str | None,
        typer.Option("--base", help="Base model it was trained on (default: what it names)."),
    ] = None,
    data: Annotated[str | None, typer.Option(help="What it was trained on, in words.")] = None,
    examples: Annotated[int | None, typer.Option(min=0, help="Training examples.")] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(help="An evaluation result NAME=VALUE (repeat for more)."),
    ] = None,
    voice: Annotated[str | None, typer.Option(help="Voice profile id (mythic voice list).")] = None,
    face: Annotated[str | None, typer.Option(help="Face profile id.")] = None,
    body: Annotated[str | None, typer.Option(help="Body generator id.")] = None,
    server: Annotated[
        list[str] | None,
        typer.Option(help="A server hosting the chain (repeat; replaces the list)."),
    ] = None,
    max_total_rank: Annotated[
        int | None, typer.Option(min=1, help="Rank budget of one request's stacked adapters.")
    ] = None,
    registry: RegistryOption = None,
    world: WorldOption = DEFAULT_WORLD,
    prefix: PrefixOption = "mythic:archetypes",
    as_json: JsonOption = False,
) -> None:
    """Create or change an archetype chain, or register a new version of a task's adapter.

    With --task and --path, the adapter's rank, alpha and size are read from its GGUF LoRA file
    or PEFT folder; the voice, face, body, servers and rank budget options change the chain.
    """
    if (task is None) != (path is None):
        err.print("error: --task and --path go together", style="bold red")
        raise typer.Exit(2)
    from mythic.archetypes import AdapterTask

    tasks = [t.value for t in AdapterTask]
    if task is not None and task not in tasks:
        err.print(f"error: unknown task {task!r}: {', '.join(tasks)}", style="bold red")
        raise typer.Exit(2)
    if fmt is not None and fmt not in ("gguf", "peft"):
        err.print(f"error: --format {fmt!r}: gguf or peft", style="bold red")
        raise typer.Exit(2)
    metrics = dict(_metric(m) for m in metric or [])
    if examples is not None and data is None:
        err.print("error: --examples needs --data", style="bold red")
        raise typer.Exit(2)
    trained_on = {"description": data, "examples": examples} if data is not None else None
    changes: dict[str, Any] = {
        k: v
        for k, v in {
            "voice": voice,
            "face": face,
            "body": body,
            "servers": tuple(server) if server is not None else None,
            "max_total_rank": max_total_rank,
        }.items()
        if v is not None
    }
    notes: list[str] = []
    if voice is not None:
        from mythic.speech import Voices

        if voice not in Voices():
            notes.append(f"voice {voice!r} is not a built-in voice (mythic voice list)")

    async def work(store: ArchetypeRegistry) -> tuple[bool, ArchetypeChain, AdapterInfo | None]:
        existed = await store.get(archetype) is not None
        if changes or not existed:
            await store.update(archetype, lambda c: c.changed(**changes))
        registered = None
        if task is not None and path is not None:
            info, note = _adapter_info(
                task,
                path,
                store,
                rank=rank,
                alpha=alpha,
                fmt=fmt,
                base=base,
                trained_on=trained_on,
                metrics=metrics,
            )
            if note:
                notes.append(note)
            registered = await store.register_adapter(archetype, info)
        return existed, await store.require(archetype), registered

    existed, chain, registered = guard(lambda: _with_registry(registry, world, prefix, work))
    for note in notes:
        err.print(f"note: {note}")
    if as_json:
        out.print(json.dumps(chain.model_dump(mode="json"), indent=2))
        return
    if changes or not existed:
        out.print(
            f"{'changed' if existed else 'created'} {chain.archetype}: "
            f"voice {chain.voice or '-'}, face {chain.face or '-'}, body {chain.body or '-'}; "
            f"servers {', '.join(chain.servers) or '-'}; rank budget {chain.max_total_rank}"
        )
    if registered is not None:
        out.print(
            f"registered {chain.archetype} {registered.task.value} "
            + _adapter_line(registered, "").lstrip()
        )


@archetypes_app.command("provision")
def archetypes_provision(
    archetype: Annotated[str, typer.Argument(help="Archetype to give adapters, e.g. ghoul.")],
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")] = Path(
        "examples/worlds/ravenmoor"
    ),
    tasks: Annotated[
        str, typer.Option("--tasks", help="Comma-separated tasks to train.")
    ] = "dialogue_style,action_policy",
    model: BaseModelOption = None,
    steps: StepsOption = 40,
    rank: RankOption = 16,
    batch_size: BatchOption = 4,
    learning_rate: LearningRateOption = 2e-3,
    retrain: Annotated[
        bool, typer.Option("--retrain", help="Train tasks that already have an adapter too.")
    ] = False,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry", "-r", help="YAML file or redis:// URL (default: <world>/archetypes.yaml)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Adapters folder (default: beside the model cache)."),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Give an archetype its adapters: curate, train, evaluate against the base in the same
    run, and register those that pass the quality gate. Exit status 1 when one fails it."""
    from mythic.cli._train import run_provision
    from mythic.training import TrainSettings

    settings = load_config(config)
    chosen = [t.strip() for t in tasks.split(",") if t.strip()]
    train_settings = TrainSettings(
        rank=rank, alpha=2.0 * rank, steps=steps, batch_size=batch_size, learning_rate=learning_rate
    )
    where = registry or str(world / "archetypes.yaml")
    passed = guard(
        lambda: run_provision(
            settings, world, archetype, chosen, model, train_settings, where, out_dir, retrain
        )
    )
    if not passed:
        raise typer.Exit(1)
