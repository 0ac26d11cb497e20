"""`mythic train adapter` and `mythic eval archetype`: archetype adapters on this machine.

The commands are declared in `_train_command.py`, `_eval_command.py` and `_archetypes.py`;
the work is here, raising `MythicError`s the command line turns into messages.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from mythic.cli._console import err, out
from mythic.config import MythicSettings

if TYPE_CHECKING:
    from mythic.archetypes import AdapterInfo
    from mythic.knowledge import World
    from mythic.training import ArchetypeEval, BuiltAdapter, LoreQuestion, TrainSettings


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


def show_step(
    progress: Progress, bar: TaskID, name: str, done: int, total: int, loss: float
) -> None:
    """Advance the loss bar; without a terminal (a log, CI), print a line every tenth."""
    progress.update(bar, completed=done, loss=loss)
    if not err.is_terminal and (done % max(1, total // 10) == 0 or done == total):
        err.print(f"{name}: step {done}/{total} loss {loss:.3f}")


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
            show_step(progress, bar, f"{archetype}/{task}", done, total, loss)

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
        info = asyncio.run(register(registry, built))
        out.print(f"registered {archetype} {task} v{info.version} in {registry}")
    return built


async def register(where: str, built: BuiltAdapter) -> AdapterInfo:
    """Record `built` (its GGUF file) as its archetype's adapter for its task."""
    from mythic.archetypes import open_registry
    from mythic.archetypes._provision import adapter_info

    async with open_registry(where) as reg:
        return await reg.register_adapter(built.archetype, adapter_info(built))


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


def lore_questions(world: World) -> list[LoreQuestion]:
    """The world's lore probes (`probes/lore.yaml`), as the archetype evaluation asks them;
    none when the world has no such file."""
    from mythic.cli._eval import load_probes, lore_correct
    from mythic.training import LoreQuestion

    path = world.path / "probes" / "lore.yaml"
    if not path.is_file():
        return []
    probes = load_probes(path, "lore", world)
    return [
        LoreQuestion(p.npc, p.question, partial(lore_correct, p))  # type: ignore[arg-type]
        for p in probes
    ]


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
    from mythic.training import Gate, evaluate_archetype

    loaded_world = load_world(world)
    name = model or _trained_on(adapters) or settings.engine.intent_model
    engine_settings = settings.engine.model_copy(
        update={"adapters": {f"{archetype}-{t}": p for t, p in adapters.items()}, "seed": 0}
    )
    err.print(f"evaluating {archetype} on {name} with {len(adapters)} adapter(s), greedy ...")
    engine = Engine.load(engine_settings, name)
    try:
        report = evaluate_archetype(
            engine,
            loaded_world,
            archetype,
            {t: f"{archetype}-{t}" for t in adapters},
            gate=Gate(**settings.archetypes.gate.model_dump()),
            # With adapters, only their tasks' probes; without, the base on every probe.
            tasks=list(adapters) or ["dialogue_style", "action_policy"],
            lore=lore_questions(loaded_world),
        )
    finally:
        engine.close()
    print_evaluation(report, name)
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


def print_evaluation(report: ArchetypeEval, name: str) -> None:
    """The table of an archetype's probes, adapter against base."""
    table = Table(title=f"{report.archetype} on {name}: adapter against base, same run")
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


def run_provision(
    settings: MythicSettings,
    world: Path,
    archetype: str,
    tasks: list[str],
    model: str | None,
    train_settings: TrainSettings,
    registry: str,
    out_dir: Path | None,
    retrain: bool,
) -> bool:
    """`mythic archetypes provision`: prints each step and the gate's verdicts; True when
    every trained adapter passed."""
    from mythic.archetypes import open_registry
    from mythic.archetypes._provision import provision
    from mythic.engine import ModelStore
    from mythic.knowledge import load_world
    from mythic.training import TASKS, CurationError, Gate

    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise CurationError(
            f"unknown task(s) {', '.join(unknown) or '(none given)'}",
            fix=f"use --tasks with some of: {', '.join(TASKS)}",
        )
    loaded_world = load_world(world)
    names = {default_model(settings, t) for t in tasks}
    name = model or (names.pop() if len(names) == 1 else settings.engine.intent_model)
    resolved = ModelStore(settings.engine.models_dir).resolve(name)
    gate = (
        Gate(**settings.archetypes.gate.model_dump()) if hasattr(settings, "archetypes") else Gate()
    )
    err.print(f"provisioning {archetype} ({', '.join(tasks)}) on {resolved.name} ...")
    with loss_progress() as progress:
        bars = {
            t: progress.add_task(t, total=train_settings.steps, loss=float("nan")) for t in tasks
        }

        def step(task: str, done: int, total: int, loss: float) -> None:
            show_step(progress, bars[task], f"{archetype}/{task}", done, total, loss)

        async def work() -> Any:
            async with open_registry(registry) as reg:
                return await provision(
                    reg,
                    loaded_world,
                    archetype,
                    resolved,
                    engine_settings=settings.engine,
                    out_root=out_dir or adapters_root(settings),
                    tasks=tasks,
                    train=train_settings,
                    gate=gate,
                    only_missing=not retrain,
                    progress=step,
                    lore=lore_questions(loaded_world),
                )

        outcome = asyncio.run(work())
    if not outcome.tasks:
        out.print(f"{archetype} already has adapters for {', '.join(tasks)} on {resolved.name}")
        return True
    if outcome.evaluation is not None:
        print_evaluation(outcome.evaluation, resolved.name)
    for t in outcome.tasks:
        verdict = f"registered v{t.registered.version}" if t.registered else "not registered"
        out.print(f"{archetype} {t.task}: {'PASS' if t.passed else 'FAIL'} ({t.reason}); {verdict}")
    return all(t.passed for t in outcome.tasks)
