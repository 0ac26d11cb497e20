"""Auto-provisioning: an archetype without adapters gets them, gated by evaluation.

curate -> train -> export -> evaluate against the base in the same run -> register the
adapters that pass the quality gate (the serving router then routes to them). An adapter
that fails the gate is kept on disk with its manifest and report, and is not registered:
the archetype goes on speaking through the base model.

Training is CPU-heavy and minutes long: callers run `provision` off the game's path (the
command line, or a separate low-priority process the server starts on first use).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mythic.archetypes._chain import AdapterInfo, TrainingData
from mythic.archetypes._registry import ArchetypeRegistry
from mythic.config import EngineSettings
from mythic.engine import Engine, ResolvedModel
from mythic.knowledge import World
from mythic.training import (
    TASKS,
    ArchetypeEval,
    BuiltAdapter,
    Gate,
    LoreQuestion,
    TrainSettings,
    build_adapter,
    curate,
    evaluate_archetype,
    load_base,
)

Progress = Callable[[str, int, int, float], None]
"""(task, step, steps, loss) after every training step."""


@dataclass(slots=True)
class ProvisionedTask:
    """What provisioning did for one task."""

    task: str
    built: BuiltAdapter
    passed: bool
    reason: str
    registered: AdapterInfo | None = None


@dataclass(slots=True)
class Provisioned:
    """The outcome of provisioning one archetype."""

    archetype: str
    base: str
    tasks: list[ProvisionedTask] = field(default_factory=list)
    evaluation: ArchetypeEval | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "archetype": self.archetype,
            "base": self.base,
            "tasks": [
                {
                    "task": t.task,
                    "version": t.built.version,
                    "gguf": str(t.built.gguf),
                    "passed": t.passed,
                    "reason": t.reason,
                    "registered_version": t.registered.version if t.registered else None,
                    "metrics": t.built.metrics,
                }
                for t in self.tasks
            ],
            "evaluation": self.evaluation.to_json() if self.evaluation else None,
        }


def _train_all(
    resolved: ResolvedModel,
    world: World,
    archetype: str,
    tasks: Sequence[str],
    out_root: Path,
    settings: TrainSettings,
    progress: Progress | None,
) -> list[BuiltAdapter]:
    base = load_base(resolved, threads=settings.threads)
    built = []
    for task in tasks:
        data = curate(world, archetype, task, seed=settings.seed)

        def step(done: int, total: int, loss: float, task: str = task) -> None:
            if progress is not None:
                progress(task, done, total, loss)

        built.append(build_adapter(resolved, data, out_root, settings, progress=step, loaded=base))
    return built


def _evaluate(
    resolved: ResolvedModel,
    engine_settings: EngineSettings,
    world: World,
    archetype: str,
    built: Sequence[BuiltAdapter],
    gate: Gate,
    lore: Sequence[LoreQuestion],
) -> ArchetypeEval:
    names = {b.task: f"{archetype}-{b.task}-v{b.version}" for b in built}
    settings = engine_settings.model_copy(
        update={"adapters": {names[b.task]: b.gguf for b in built}, "seed": 0}
    )
    engine = Engine.load(settings, str(resolved.path))
    try:
        return evaluate_archetype(
            engine, world, archetype, names, gate=gate, tasks=[b.task for b in built], lore=lore
        )
    finally:
        engine.close()


async def provision(
    registry: ArchetypeRegistry,
    world: World,
    archetype: str,
    resolved: ResolvedModel,
    *,
    engine_settings: EngineSettings,
    out_root: Path,
    tasks: Sequence[str] = TASKS,
    train: TrainSettings | None = None,
    gate: Gate | None = None,
    only_missing: bool = True,
    progress: Progress | None = None,
    lore: Sequence[LoreQuestion] = (),
) -> Provisioned:
    """Train, evaluate and (when they pass the gate) register `archetype`'s adapters.

    `only_missing`: skip tasks whose chain already has an adapter for `resolved`'s base.
    `lore`: the world's lore probes, a regression check of the dialogue adapter.
    The CPU work runs in a worker thread; the registry is written only at the end.

    Raises:
        CurationError: the world has no NPC of the archetype, or a task has no recipe.
        TrainingError, ExportError, ModelError: training, export or evaluation failed.
    """
    train = train or TrainSettings()
    gate = gate or Gate()
    outcome = Provisioned(archetype, resolved.name)
    if only_missing:
        chain = await registry.get(archetype)
        have = {
            t
            for t in tasks
            if chain is not None
            and (info := chain.adapter(t)) is not None
            and info.base_model == resolved.name
        }
        tasks = [t for t in tasks if t not in have]
    if not tasks:
        return outcome
    built = await asyncio.to_thread(
        _train_all, resolved, world, archetype, tasks, out_root, train, progress
    )
    report = await asyncio.to_thread(
        _evaluate, resolved, engine_settings, world, archetype, built, gate, lore
    )
    outcome.evaluation = report
    for b in built:
        name = f"{archetype}-{b.task}-v{b.version}"
        passed = report.passed.get(name, False)
        item = ProvisionedTask(b.task, b, passed, report.reasons.get(name, ""))
        (b.folder / "evaluation.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
        if passed:
            item.registered = await registry.register_adapter(archetype, adapter_info(b, report))
        outcome.tasks.append(item)
    return outcome


def adapter_info(built: BuiltAdapter, report: ArchetypeEval | None = None) -> AdapterInfo:
    """The registry record of a built adapter (its GGUF file), with its training metrics and,
    when given, its evaluation scores."""
    metrics = {k: round(v, 4) for k, v in built.metrics.items()}
    if report is not None:
        for r in report.results:
            if r.task == built.task and r.tuned is not None:
                metrics[f"eval.{r.probe}"] = round(r.tuned, 4)
                metrics[f"eval.{r.probe}.base"] = round(r.base, 4)
    sources = ", ".join(f"{n} {src}" for src, n in sorted(built.data["sources"].items()))
    return AdapterInfo(
        task=built.task,  # type: ignore[arg-type]
        path=str(built.gguf.resolve()),
        format="gguf",
        base_model=built.base,
        rank=built.rank,
        alpha=built.alpha,
        target_modules=tuple(built.targets),
        size_bytes=built.size_bytes,
        trained_on=TrainingData(
            description=f"curated by mythic from the world's cards and lore: {sources} examples",
            examples=built.data["train"],
            sha256=built.data["sha256"],
        ),
        metrics=metrics,
    )
