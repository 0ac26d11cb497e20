"""`mythic train adapter` and `mythic eval archetype`: archetype adapters on this machine.

The commands are declared in `mythic.cli`; the work is here, raising `MythicError`s the
command line turns into messages.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from mythic.config import MythicSettings

if TYPE_CHECKING:
    from mythic.archetypes import AdapterInfo
    from mythic.training import BuiltAdapter, TrainSettings

out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def adapters_root(settings: MythicSettings) -> Path:
    """Where trained adapters go by default: beside the model cache, never in the checkout."""
    return settings.engine.models_dir.parent / "adapters"


def default_model(settings: MythicSettings, task: str) -> str:
    """The model a task's adapter serves on: decisions run on the intent model."""
    return (
        settings.engine.intent_model if task == "action_policy" else settings.engine.dialogue_model
    )


def loss_progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeRemainingColumn(),
        console=err,
    )


def run_train(
    settings: MythicSettings,
    world: Path,
    archetype: str,
    task: str,
    model: str | None,
    train_settings: TrainSettings,
    extra: Path | None,
    out_dir: Path | None,
    registry: str | None = None,
) -> BuiltAdapter:
    """Curate, train, export; register the GGUF in `registry` (a YAML file or a redis://
    URL) unless None; prints progress and a summary; returns the built adapter."""
    from mythic.engine import ModelStore
    from mythic.knowledge import load_world
    from mythic.training import build_adapter, curate, load_base, load_extra

    loaded_world = load_world(world)
    rows = load_extra(extra, loaded_world) if extra else []
    dataset = curate(loaded_world, archetype, task, seed=train_settings.seed, extra=rows)
    resolved = ModelStore(settings.engine.models_dir).resolve(
        model or default_model(settings, task)
    )
    err.print(f"{archetype}/{task} on {resolved.name}: {dataset.describe()}")
    err.print("loading the base model for training ...")
    base = load_base(resolved, threads=train_settings.threads)
    with loss_progress() as progress:
        bar = progress.add_task("training", total=train_settings.steps, loss=float("nan"))

        def step(done: int, total: int, loss: float) -> None:
            progress.update(bar, completed=done, loss=loss)

        built = build_adapter(
            resolved,
            dataset,
            out_dir or adapters_root(settings),
            train_settings,
            progress=step,
            loaded=base,
        )
    table = Table(
        title=f"{archetype}/{task} v{built.version} on {resolved.name}", show_header=False
    )
    for key, value in built.metrics.items():
        table.add_row(key, f"{value:.3f}")
    table.add_row("trainable parameters", f"{built.result.trainable_params:,}")
    table.add_row("examples / tokens", f"{built.result.examples} / {built.result.tokens:,}")
    table.add_row("seconds", f"{built.result.seconds:.0f}")
    table.add_row("GGUF", str(built.gguf))
    table.add_row("PEFT", str(built.peft_dir))
    out.print(table)
    if registry is not None:
        info = asyncio.run(register(registry, built, train_settings.targets))
        out.print(f"registered {archetype} {task} v{info.version} in {registry}")
    return built


async def register(where: str, built: BuiltAdapter, targets: tuple[str, ...]) -> AdapterInfo:
    """Record `built` (its GGUF file) as its archetype's adapter for its task."""
    from mythic.archetypes import AdapterInfo, TrainingData, open_registry

    sources = ", ".join(f"{n} {src}" for src, n in sorted(built.data["sources"].items()))
    info = AdapterInfo(
        task=built.task,  # type: ignore[arg-type]
        path=str(built.gguf.resolve()),
        format="gguf",
        base_model=built.base,
        rank=built.rank,
        alpha=built.alpha,
        target_modules=targets,
        size_bytes=built.size_bytes,
        trained_on=TrainingData(
            description=f"curated by mythic train adapter: {sources} examples",
            examples=built.data["train"],
            sha256=built.data["sha256"],
        ),
        metrics={k: round(v, 4) for k, v in built.metrics.items()},
    )
    async with open_registry(where) as reg:
        return await reg.register_adapter(built.archetype, info)


def registered_adapters(where: str, archetype: str) -> dict[str, Path]:
    """The GGUF adapters `archetype`'s chain has for the tasks evaluation probes."""
    from mythic.archetypes import open_registry

    async def read() -> dict[str, Path]:
        async with open_registry(where) as reg:
            chain = await reg.get(archetype)
        if chain is None:
            return {}
        found = {}
        for task in ("dialogue_style", "action_policy"):
            info = chain.adapter(task)
            if info is not None and info.format == "gguf":
                found[task] = info.resolve(Path(where).parent)
        return found

    return asyncio.run(read())


def _trained_on(adapters: dict[str, Path]) -> str | None:
    """The base model named in the adapters' manifests (written by `mythic train adapter`)."""
    from mythic.training import TrainingError

    bases = set()
    for path in adapters.values():
        manifest = path.parent / "manifest.json"
        if manifest.is_file():
            bases.add(str(json.loads(manifest.read_text()).get("base")))
    if len(bases) > 1:
        raise TrainingError(
            f"the adapters were trained on different base models ({', '.join(sorted(bases))})",
            fix="evaluate them one at a time, or pass --model",
        )
    return bases.pop() if bases else None


def run_eval(
    settings: MythicSettings,
    world: Path,
    archetype: str,
    model: str | None,
    adapters: dict[str, Path],
    out_file: Path | None,
    verbose: bool,
) -> bool:
    """Evaluate `archetype` with `adapters` (task -> GGUF LoRA) against the base; prints the
    table; returns whether every adapter passed the gate."""
    from mythic.engine import Engine
    from mythic.knowledge import load_world
    from mythic.training import evaluate_archetype

    loaded_world = load_world(world)
    name = model or _trained_on(adapters) or settings.engine.intent_model
    engine_settings = settings.engine.model_copy(
        update={"adapters": {f"{archetype}-{t}": p for t, p in adapters.items()}, "seed": 0}
    )
    err.print(f"evaluating {archetype} on {name} with {len(adapters)} adapter(s), greedy ...")
    engine = Engine.load(engine_settings, name)
    try:
        report = evaluate_archetype(
            engine, loaded_world, archetype, {t: f"{archetype}-{t}" for t in adapters}
        )
    finally:
        engine.close()
    table = Table(title=f"{archetype} on {name}: adapter against base, same run")
    for col in ("probe", "task", "n", "base", "adapter", "gain", "never-intents"):
        table.add_column(col)
    for r in report.results:
        table.add_row(
            r.probe,
            r.task,
            str(r.n),
            f"{r.base:.2f}",
            "-" if r.tuned is None else f"{r.tuned:.2f}",
            "-" if r.gain is None else f"{r.gain:+.2f}",
            f"{r.violations[0]} / {r.violations[1]}" if r.probe == "actions" else "",
        )
    out.print(table)
    for name_, ok in report.passed.items():
        out.print(f"{name_}: {'PASS' if ok else 'FAIL'} ({report.reasons[name_]})")
    if verbose:
        for r in report.results:
            for s in r.samples:
                out.print(f"[{r.probe}] {s.get('adapter') or 'base'}: {json.dumps(s)}")
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        err.print(f"wrote {out_file}")
    return all(report.passed.values())
