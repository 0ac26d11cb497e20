"""The `mythic` command line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)

from mythic._errors import MythicError
from mythic.cli._archetypes import archetypes_app
from mythic.cli._plan import plan_command
from mythic.config import MythicSettings, ServerSettings, load_settings

if TYPE_CHECKING:
    from mythic.engine import PackagedModel

__all__ = ["app", "main"]

app = typer.Typer(
    name="mythic",
    help="Mythic: AI-driven game NPCs that talk, remember and act in real time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
models_app = typer.Typer(help="Packaged models: list, fetch (install + assemble), verify.")
config_app = typer.Typer(help="Show the effective configuration.")
world_app = typer.Typer(help="Check world folders.")
schema_app = typer.Typer(help="The v1 wire protocol as JSON Schema, for clients in any language.")
app.add_typer(models_app, name="models")
app.add_typer(config_app, name="config")
app.add_typer(world_app, name="world")
app.add_typer(schema_app, name="schema")
db_app = typer.Typer(help="The memory archive's database: migrations.")
memory_app = typer.Typer(help="What NPCs remember of players: show, forget, compact.")
app.add_typer(db_app, name="db")
app.add_typer(memory_app, name="memory")
eval_app = typer.Typer(
    help="Evaluate NPCs: lore, style and quality scorecards through a real server; archetype "
    "adapters."
)
app.add_typer(eval_app, name="eval")
jobs_app = typer.Typer(help="Bronze jobs (lore, quest, summary): submit, list, show, work.")
app.add_typer(jobs_app, name="jobs")
voice_app = typer.Typer(help="NPC voices: list the profiles, preview one as a WAV file.")
app.add_typer(voice_app, name="voice")
train_app = typer.Typer(help="Archetype adapters: curate, train (LoRA on CPU), export to GGUF.")
app.add_typer(train_app, name="train")
app.add_typer(archetypes_app, name="archetypes")
app.command("plan")(plan_command)

# markup=False: NPC names, player lines and paths may contain [brackets] that are not markup.
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="YAML settings file (default: MYTHIC_CONFIG, ./mythic.yaml)."
    ),
]

T = TypeVar("T")


def _settings(config: Path | None) -> MythicSettings:
    return _guard(lambda: load_settings(config))


def _guard(fn: Callable[[], T]) -> T:
    """Run `fn`; a Mythic or validation error becomes a clear message and exit status 2, not
    a traceback."""
    try:
        return fn()
    except MythicError as exc:
        err.print(f"error: {exc}", style="bold red")
        raise typer.Exit(2) from None
    except ValidationError as exc:
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "value"
            err.print(f"error: {where}: {e['msg']}", style="bold red")
        raise typer.Exit(2) from None


def _log_to_stderr(level: str) -> None:
    """Mythic's own log records at `level` and above to stderr, with their time and source;
    other libraries' at warning and above."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("mythic").setLevel(level.upper())


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    )


# -- models -------------------------------------------------------------------------------------


@models_app.command("list")
def models_list(config: ConfigOption = None) -> None:
    """Show the packaged models, their sizes, licences and whether they are ready."""
    from mythic.engine import PACKAGED_MODELS, ModelStore

    settings = _settings(config)
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
        return [_guard(partial(packaged_model, name)) for name in names]
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

    settings = _settings(config)
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
            path = _guard(partial(store.fetch, spec, force=force, progress=advance))
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

    settings = _settings(config)
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


# -- config ---------------------------------------------------------------------------------------


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """Print the effective configuration as YAML (file, environment and defaults merged)."""
    settings = _settings(config)
    out.print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False).rstrip())


# -- world ----------------------------------------------------------------------------------------


@world_app.command("check")
def world_check(path: Annotated[Path, typer.Argument(help="World folder.")]) -> None:
    """Validate a world folder: every card, every lore document."""
    from mythic.knowledge import load_world

    world = _guard(lambda: load_world(path))
    out.print(
        f"{world.name}: {len(world.npcs)} NPCs, {len(world.card.zones)} zones, "
        f"{len(world.lore)} lore documents: OK"
    )


# -- schema ---------------------------------------------------------------------------------------


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


# -- memory ---------------------------------------------------------------------------------------

PlayerOption = Annotated[str, typer.Option("--player", help="The player's id.")]
ServerUrlOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="A running server's base URL (http://host:port): goes through it, so its "
        "in-process hot tier is included. Default: the configured stores directly.",
    ),
]


def _with_memory(config: Path | None, work: Callable[[Any], Any]) -> Any:
    """Run `work(memory)` on the configured stores (warm and cold; hot is empty here)."""
    import asyncio

    from mythic.memory import Memory

    settings = _settings(config)

    async def run() -> Any:
        memory = Memory(settings.memory)
        try:
            return await work(memory)
        finally:
            await memory.aclose()

    return _guard(lambda: asyncio.run(run()))


def _http(method: str, url: str, body: Any = None) -> Any:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        err.print(f"error: {url}: {exc.code} {exc.read().decode(errors='replace')}", style="red")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        err.print(f"error: {url}: {exc}", style="bold red")
    raise typer.Exit(2)


@db_app.command("migrate")
def db_migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the memory archive's tables (memory.cold_url: PostgreSQL or SQLite)."""

    async def work(memory: Any) -> None:
        applied = await memory.cold.migrate()
        where = memory.settings.cold_url or f"sqlite {memory.cold.path}"
        if applied:
            for migration in applied:
                out.print(f"applied {migration.version:04d}_{migration.name}")
        out.print(f"{where}: schema is up to date")

    _with_memory(config, work)


@memory_app.command("show")
def memory_show(
    player: PlayerOption,
    server: ServerUrlOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Everything stored about a player, tier by tier."""
    if server:
        data = _http("GET", f"{server.rstrip('/')}/v1/memory/{player}")
    else:

        async def work(memory: Any) -> Any:
            await memory.cold.migrate() if memory.settings.auto_migrate else None
            return await memory.show(player)

        data = _with_memory(config, work)
    if as_json:
        out.print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    out.print(f"player {player}")
    for tier in ("hot", "warm"):
        npcs = data.get(tier, {})
        out.print(f"  {tier}: {len(npcs)} NPCs")
        for npc, held in sorted(npcs.items()):
            out.print(
                f"    {npc}: {len(held['turns'])} turns, {len(held['summaries'])} summaries, "
                f"{len(held['facts'])} facts"
            )
            for summary in held["summaries"][-2:]:
                out.print(f"      summary: {summary['text']}")
            for fact in held["facts"][:5]:
                out.print(f"      fact ({fact['importance']}): {fact['text']}")
    out.print(f"  cold: {data['cold']['events']} events archived")


@memory_app.command("forget")
def memory_forget(
    player: PlayerOption,
    server: ServerUrlOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    config: ConfigOption = None,
) -> None:
    """Delete everything about a player in every tier (cannot be undone)."""
    if not yes and not typer.confirm(f"Delete everything remembered about {player}?"):
        raise typer.Exit(1)
    if server:
        deleted = _http("DELETE", f"{server.rstrip('/')}/v1/memory/{player}")["deleted"]
    else:

        async def work(memory: Any) -> Any:
            await memory.cold.migrate() if memory.settings.auto_migrate else None
            return await memory.forget(player)

        deleted = _with_memory(config, work)
    out.print(
        f"forgot {player}: {deleted['hot']} hot entries, {deleted['warm']} warm NPC entries, "
        f"{deleted['cold']} archived events"
    )


@memory_app.command("compact")
def memory_compact(
    older_than_days: Annotated[
        float, typer.Option("--older-than-days", min=0, help="Only snapshots older than this.")
    ] = 30.0,
    config: ConfigOption = None,
) -> None:
    """Drop superseded card, fact and emotion snapshots from the archive (turns, events and
    summaries are kept forever)."""

    async def work(memory: Any) -> int:
        return int(await memory.compact(older_than_days=older_than_days))

    out.print(f"compacted: {_with_memory(config, work)} superseded snapshots removed")


# -- chat -----------------------------------------------------------------------------------------


# -- eval ---------------------------------------------------------------------------------------


def _eval(
    kind: str,
    world: Path,
    probes_file: Path | None,
    modes: str,
    limit: int | None,
    npc: str | None,
    out_file: Path | None,
    verbose: bool,
    config: Path | None,
) -> None:
    import asyncio

    from mythic.cli._eval import Mode, load_probes, report, run_probes
    from mythic.knowledge import load_world

    settings = _settings(config)
    loaded = _guard(lambda: load_world(world, max_lore_bytes=settings.knowledge.max_lore_bytes))
    for problem in loaded.skipped:
        err.print(f"lore skipped: {problem}", style="yellow")
    path = probes_file or world / "probes" / f"{kind}.yaml"
    probes: list[Any] = list(_guard(lambda: load_probes(path, kind, loaded)))  # type: ignore[arg-type]
    if npc is not None:
        probes = [p for p in probes if p.npc == npc]
    probes = probes[:limit] if limit is not None else probes
    if not probes:
        err.print("error: no probes left to run", style="bold red")
        raise typer.Exit(2)
    chosen: list[Mode] = []
    for mode in (m.strip() for m in modes.split(",") if m.strip()):
        if mode not in ("hybrid", "bm25", "dense", "off"):
            err.print(f"error: unknown retrieval mode {mode!r} (hybrid, bm25, dense, off)")
            raise typer.Exit(2)
        chosen.append(mode)  # type: ignore[arg-type]
    err.print(
        f"{len(probes)} {kind} probes x {len(chosen)} mode(s) on "
        f"{settings.engine.dialogue_model} (greedy), through a server on loopback ..."
    )

    def show(mode: str, outcome: Any) -> None:
        if verbose or not outcome.passed:
            mark = "ok  " if outcome.passed else "FAIL"
            failed = [c for c, ok in outcome.checks.items() if not ok]
            out.print(f"[{mode}] {mark} {outcome.probe.npc}: {outcome.probe.question}")
            out.print(
                f"         -> {outcome.reply!r}" + (f"  ({', '.join(failed)})" if failed else "")
            )

    results = _guard(
        lambda: asyncio.run(run_probes(settings, loaded, kind, probes, chosen, on_reply=show))  # type: ignore[arg-type]
    )
    out.print("")
    header = f"{'retrieval':<10} {'passed':>9} {'accuracy':>9} {'median reply s':>15}"
    checks = ("correct",) if kind == "lore" else ("taboo_kept", "catchphrase_used", "length_kept")
    if kind == "style":
        header += "".join(f" {c:>17}" for c in checks)
    out.print(header)
    for r in results:
        passed = sum(o.passed for o in r.outcomes)
        row = f"{r.mode:<10} {passed:>4}/{len(r.outcomes):<4} {r.accuracy:>9.1%}"
        row += f" {r.median_s():>15.2f}"
        if kind == "style":
            for c in checks:
                ok, of = r.rate(c)
                row += f" {f'{ok}/{of}':>17}"
        out.print(row)
    if kind == "lore" and len(results) > 1:
        base = results[-1].accuracy
        for r in results[:-1]:
            out.print(f"{r.mode} vs {results[-1].mode}: {r.accuracy - base:+.1%} accuracy")
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(json.dumps(report(kind, results), indent=2) + "\n")
        err.print(f"wrote {out_file}")


WorldOption = Annotated[Path, typer.Option("--world", "-w", help="World folder.")]
ProbesOption = Annotated[
    Path | None,
    typer.Option("--probes", help="Probes YAML (default: <world>/probes/<kind>.yaml)."),
]
LimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N probes.")]
NpcOption = Annotated[str | None, typer.Option("--npc", help="Only this NPC's probes.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Write the results as JSON.")]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show every reply, not only failures.")
]


@eval_app.command("lore")
def eval_lore(
    world: WorldOption,
    probes: ProbesOption = None,
    modes: Annotated[
        str, typer.Option("--modes", help="Retrieval modes to compare, comma-separated.")
    ] = "hybrid,off",
    limit: LimitOption = None,
    npc: NpcOption = None,
    out_file: OutOption = None,
    verbose: VerboseOption = False,
    config: ConfigOption = None,
) -> None:
    """Ask lore questions through a real server and report accuracy, with and without
    retrieval in one run."""
    _eval("lore", world, probes, modes, limit, npc, out_file, verbose, config)


@eval_app.command("style")
def eval_style(
    world: WorldOption,
    probes: ProbesOption = None,
    modes: Annotated[
        str, typer.Option("--modes", help="Retrieval modes, comma-separated.")
    ] = "hybrid",
    limit: LimitOption = None,
    npc: NpcOption = None,
    out_file: OutOption = None,
    verbose: VerboseOption = False,
    config: ConfigOption = None,
) -> None:
    """Persona adherence: taboos not revealed, catchphrases used, reply length kept."""
    _eval("style", world, probes, modes, limit, npc, out_file, verbose, config)


@eval_app.command("quality")
def eval_quality(
    world: WorldOption,
    npc: Annotated[
        list[str] | None,
        typer.Option("--npc", help="Only these NPCs (repeatable, or comma-separated)."),
    ] = None,
    checks: Annotated[
        str,
        typer.Option(
            "--checks",
            help="Checks to run, comma-separated: lore, taboos, in_character, assistant_speak, "
            "relevance, greetings, actions, long_conversation (default: all).",
        ),
    ] = "",
    turns: Annotated[
        int, typer.Option("--turns", min=3, max=200, help="Turns of the long conversation.")
    ] = 40,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most N probes per check and NPC.")
    ] = None,
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline/--no-baseline",
            help="Also run the baseline (retrieval off, no adapters, no reply filter) in the "
            "same run.",
        ),
    ] = True,
    base: Annotated[
        bool,
        typer.Option(
            "--base",
            help="Compare with the same settings without the registry's adapters (an "
            "adapter's gate: archetypes.registry names the adapters) instead of the baseline.",
        ),
    ] = False,
    seed: Annotated[int, typer.Option("--seed", min=0, help="The engine's sampling seed.")] = 0,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=64, help="NPCs served at once.")
    ] = 2,
    out_file: OutOption = None,
    verbose: VerboseOption = False,
    config: ConfigOption = None,
) -> None:
    """One NPC-quality scorecard through a real server: lore, taboos, staying in character,
    assistant-speak, relevance, greetings, game actions and a long conversation, for every
    NPC, against the baseline of the same run, with the acceptance targets."""
    from mythic.cli._quality import run_command

    settings = _settings(config)
    _guard(
        lambda: run_command(
            settings,
            world,
            npcs=[n.strip() for item in npc or [] for n in item.split(",") if n.strip()],
            checks=[c.strip() for c in checks.split(",") if c.strip()],
            turns=turns,
            limit=limit,
            baseline=baseline,
            base=base,
            seed=seed,
            parallel=parallel,
            out_file=out_file,
            verbose=verbose,
        )
    )


JobsServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        "-s",
        help="A running server's HTTP address (http://HOST:PORT). Default: the configured "
        "queue directly (jobs.url, or the embedded SQLite queue).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


TaskOption = Annotated[
    str, typer.Option("--task", "-t", help="Adapter task: dialogue_style or action_policy.")
]
BaseModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Base model: a packaged name or a GGUF path (default: the model the task serves on).",
    ),
]


StepsOption = Annotated[
    int, typer.Option("--steps", min=1, max=100_000, help="Optimiser steps (per task).")
]
RankOption = Annotated[int, typer.Option("--rank", min=1, max=64, help="LoRA rank.")]
BatchOption = Annotated[int, typer.Option("--batch", min=1, max=512, help="Examples per step.")]
LearningRateOption = Annotated[
    float, typer.Option("--lr", min=1e-7, max=1.0, help="Peak learning rate.")
]


@train_app.command("adapter")
def train_adapter(
    archetype: Annotated[str, typer.Argument(help="Archetype, e.g. vampire or zombie.")],
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")] = Path(
        "examples/worlds/ravenmoor"
    ),
    task: TaskOption = "dialogue_style",
    model: BaseModelOption = None,
    steps: StepsOption = 40,
    rank: RankOption = 16,
    batch_size: BatchOption = 4,
    learning_rate: LearningRateOption = 2e-3,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=16, max=8192, help="Longest example in tokens.")
    ] = 768,
    extra: Annotated[
        Path | None,
        typer.Option("--extra", help="More dialogue examples: JSON lines {npc, question, reply}."),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Adapters folder (default: beside the model cache)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Data and training seed.")] = 0,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads (default: all but one).")
    ] = None,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            "-r",
            help="Register the adapter here: a YAML file or redis:// URL "
            "(default: <world>/archetypes.yaml).",
        ),
    ] = None,
    register: Annotated[
        bool, typer.Option("--register/--no-register", help="Record it in the registry.")
    ] = True,
    config: ConfigOption = None,
) -> None:
    """Curate data from the world, train a LoRA adapter on CPU (loss bar), score it on
    held-out examples against the base, and write it as PEFT and GGUF with a manifest."""
    from mythic.cli._train import run_train
    from mythic.training import TrainSettings

    settings = _settings(config)
    train_settings = TrainSettings(
        rank=rank,
        alpha=2.0 * rank,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        max_tokens=max_tokens,
        seed=seed,
        threads=threads,
    )
    where = (registry or str(world / "archetypes.yaml")) if register else None
    _guard(
        lambda: run_train(
            settings, world, archetype, task, model, train_settings, extra, out_dir, where
        )
    )


@eval_app.command("archetype")
def eval_archetype(
    archetype: Annotated[str, typer.Argument(help="Archetype to evaluate.")],
    world: WorldOption = Path("examples/worlds/ravenmoor"),
    model: BaseModelOption = None,
    adapter: Annotated[
        list[str] | None,
        typer.Option(
            "--adapter",
            "-a",
            help="TASK=PATH of a GGUF LoRA, repeatable (dialogue_style=a.gguf, action_policy=...).",
        ),
    ] = None,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            "-r",
            help="Without --adapter, take the archetype's adapters from this registry "
            "(default: <world>/archetypes.yaml).",
        ),
    ] = None,
    out_file: OutOption = None,
    verbose: VerboseOption = False,
    config: ConfigOption = None,
) -> None:
    """Score an archetype's adapters against the base model in the same run: style,
    consistency over a long conversation, action coherence. Exit status 1 when an adapter
    fails the quality gate."""
    from mythic.cli._train import run_eval

    settings = _settings(config)
    adapters: dict[str, Path] = {}
    for item in adapter or []:
        task, sep, path = item.partition("=")
        if not sep or task not in ("dialogue_style", "action_policy") or not path:
            err.print(
                f"error: --adapter {item!r}: expected dialogue_style=PATH or action_policy=PATH",
                style="bold red",
            )
            raise typer.Exit(2)
        adapters[task] = Path(path)
    if not adapters:
        from mythic.cli._train import registered_adapters

        where = registry or str(world / "archetypes.yaml")
        adapters = _guard(lambda: registered_adapters(where, archetype))
    passed = _guard(
        lambda: run_eval(settings, world, archetype, model, adapters, out_file, verbose)
    )
    if adapters and not passed:
        raise typer.Exit(1)


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

    settings = _settings(config)
    chosen = [t.strip() for t in tasks.split(",") if t.strip()]
    train_settings = TrainSettings(
        rank=rank, alpha=2.0 * rank, steps=steps, batch_size=batch_size, learning_rate=learning_rate
    )
    where = registry or str(world / "archetypes.yaml")
    passed = _guard(
        lambda: run_provision(
            settings, world, archetype, chosen, model, train_settings, where, out_dir, retrain
        )
    )
    if not passed:
        raise typer.Exit(1)


@app.command()
def distill(
    world: WorldOption,
    teacher: Annotated[
        str,
        typer.Option(
            "--teacher", help="The teacher: a packaged model name or a GGUF path (the strongest)."
        ),
    ] = "qwen2.5-coder-1.5b-instruct",
    gate_world: Annotated[
        Path | None,
        typer.Option(
            "--gate-world",
            help="World the adapters are gated on (default: --world); another world shows "
            "that they generalise.",
        ),
    ] = None,
    archetype: Annotated[
        list[str] | None,
        typer.Option("--archetype", "-a", help="Only these archetypes (repeatable)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="At most N teacher lines per check and NPC."),
    ] = None,
    gate_limit: Annotated[
        int | None,
        typer.Option("--gate-limit", min=1, help="At most N gate probes per check and NPC."),
    ] = None,
    steps: StepsOption = 40,
    min_examples: Annotated[
        int,
        typer.Option(
            "--min-examples", min=2, help="Fewest kept replies an archetype is trained on."
        ),
    ] = 8,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            "-r",
            help="Register the adapters that pass in this YAML file or redis:// URL "
            "(default: none, the verdicts only).",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--adapters", help="Adapters folder (default: beside the model cache)."),
    ] = None,
    out_file: OutOption = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Sampling and training seed.")] = 0,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=64, help="NPCs served at once.")
    ] = 2,
    config: ConfigOption = None,
) -> None:
    """Distil a teacher model into the dialogue model's archetype adapters: the teacher
    answers as each NPC through a real server, the scorecard's checks keep the good lines,
    a `dialogue_style` adapter per archetype is trained on them, gated on the scorecard
    against the model without it, and registered when it passes. Exit status 1 when none
    passes."""
    from mythic.cli._distill import run_distill

    settings = _settings(config)
    report = _guard(
        lambda: run_distill(
            settings,
            world,
            teacher=teacher,
            gate_world=gate_world,
            archetypes=[a.strip() for item in archetype or [] for a in item.split(",")],
            limit=limit,
            gate_limit=gate_limit,
            steps=steps,
            min_examples=min_examples,
            registry=registry,
            out_dir=out_dir,
            out_file=out_file,
            seed=seed,
            parallel=parallel,
        )
    )
    if not any(v["passed"] for v in report["verdicts"]):
        raise typer.Exit(1)


def _with_jobs(config: Path | None, work: Callable[[Any], Any]) -> Any:
    """Run `work(queue)` on the configured job queue."""
    import asyncio

    from mythic.jobs import open_queue

    settings = _settings(config)

    async def run() -> Any:
        queue = open_queue(settings.jobs, settings.memory.data_dir)
        try:
            return await work(queue)
        finally:
            await queue.aclose()

    return _guard(lambda: asyncio.run(run()))


def _print_job(job: dict[str, Any]) -> None:
    out.print(
        f"{job['job_id']}  {job['kind']:<8} {job['status']:<8} attempts {job['attempts']}/"
        f"{job['max_attempts']}" + (f"  error: {job['error']}" if job.get("error") else "")
    )


@jobs_app.command("submit")
def jobs_submit(
    kind: Annotated[str, typer.Argument(help="lore (worldbuilding), quest or summary.")],
    topic: Annotated[str | None, typer.Option(help="lore: what the entry is about.")] = None,
    zone: Annotated[str | None, typer.Option(help="lore: the zone it belongs to.")] = None,
    npc: Annotated[
        str | None, typer.Option("--npc", help="quest, summary (and lore): the NPC.")
    ] = None,
    hint: Annotated[str | None, typer.Option(help="Notes for the model.")] = None,
    text: Annotated[str | None, typer.Option(help="summary: the text to summarize.")] = None,
    title: Annotated[str | None, typer.Option(help="summary: its title.")] = None,
    job_id: Annotated[
        str | None, typer.Option("--id", help="Idempotency key (default: a new id).")
    ] = None,
    server: JobsServerOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Queue a bronze job; a worker generates its artifact and the NPCs learn it."""
    given = {"topic": topic, "zone": zone, "npc_id": npc, "hint": hint, "text": text}
    payload = {k: v for k, v in (given | {"title": title}).items() if v is not None}
    if server:
        body = {"kind": kind, "payload": payload, "job_id": job_id}
        data = _http("POST", f"{server.rstrip('/')}/v1/jobs", body)
    else:

        async def work(queue: Any) -> Any:
            job, created = await queue.submit(kind, payload, job_id=job_id)
            return {**job.to_dict(), "created": created}

        data = _with_jobs(config, work)
    if as_json:
        out.print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_job(data)
    if not data["created"]:
        out.print("  (already queued under this id: not queued again)")


@jobs_app.command("list")
def jobs_list(
    status: Annotated[
        str | None, typer.Option(help="queued, running, done or dead (the dead letters).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    server: JobsServerOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Jobs, newest first."""
    if status is not None and status not in ("queued", "running", "done", "dead"):
        err.print(f"error: unknown status {status!r}: queued, running, done or dead", style="red")
        raise typer.Exit(2)
    if server:
        query = f"?limit={limit}" + (f"&status={status}" if status else "")
        jobs = _http("GET", f"{server.rstrip('/')}/v1/jobs{query}")["jobs"]
    else:

        async def work(queue: Any) -> Any:
            return [job.to_dict() for job in await queue.list(status, limit=limit)]

        jobs = _with_jobs(config, work)
    if as_json:
        out.print(json.dumps(jobs, indent=2, ensure_ascii=False))
        return
    for job in jobs:
        _print_job(job)
    if not jobs:
        out.print("no jobs")


@jobs_app.command("show")
def jobs_show(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    server: JobsServerOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """One job and its artifact."""
    if server:
        data = _http("GET", f"{server.rstrip('/')}/v1/jobs/{job_id}")
    else:

        async def work(queue: Any) -> Any:
            found = await queue.get(job_id)
            if found is None:
                return None
            job, artifact = found
            return {**job.to_dict(), "artifact": artifact.to_dict() if artifact else None}

        data = _with_jobs(config, work)
        if data is None:
            err.print(f"error: no job {job_id!r}", style="red")
            raise typer.Exit(1)
    if as_json:
        out.print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_job(data)
    out.print(f"  payload: {json.dumps(data['payload'], ensure_ascii=False)}")
    artifact = data.get("artifact")
    if artifact:
        out.print(f"  artifact: {artifact['title']}")
        out.print(f"    {artifact['text']}")
    if "applied" in data:
        out.print(f"  in the NPCs' knowledge: {'yes' if data['applied'] else 'not yet'}")


@jobs_app.command("work")
def jobs_work(
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")],
    once: Annotated[bool, typer.Option("--once", help="Work one due job, then exit.")] = False,
    config: ConfigOption = None,
) -> None:
    """Run a bronze worker outside the server (scale out: as many as you like, on the
    PostgreSQL queue). The server picks up the artifacts."""
    import asyncio

    from mythic.jobs import JobWorker, open_queue
    from mythic.knowledge import load_world
    from mythic.route import open_router

    settings = _settings(config)
    loaded = _guard(partial(load_world, world))

    async def run() -> None:
        router, engines = open_router(settings)
        queue = open_queue(settings.jobs, settings.memory.data_dir)
        worker = JobWorker(queue, router, lambda: loaded, settings.jobs)
        router.start()
        err.print(f"worker {worker.name} on {queue.where}")
        try:
            if once:
                job = await worker.run_once()
                out.print(f"{job.job_id}: {dict(worker.counts)}" if job else "no job due")
            else:
                await worker.run()
        finally:
            await router.aclose()
            await queue.aclose()
            for engine in engines:
                engine.close()

    try:
        _guard(lambda: asyncio.run(run()))
    except KeyboardInterrupt:
        err.print("Stopped.")


@app.command()
def usage(
    server: Annotated[
        str, typer.Option("--server", "-s", help="The server's HTTP address.")
    ] = "http://127.0.0.1:8765",
    as_json: JsonOption = False,
) -> None:
    """Requests, tokens and model time per tier and per NPC, from a running server."""
    data = _http("GET", f"{server.rstrip('/')}/v1/usage")
    if as_json:
        out.print(json.dumps(data, indent=2))
        return
    for title, rows in (("tier", data["tiers"]), ("npc", data["npcs"])):
        out.print(
            f"{title:<16} {'requests':>9} {'prompt tok':>11} {'gen tok':>9} {'seconds':>9}"
            "  outcomes"
        )
        for name, row in rows.items():
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items()))
            out.print(
                f"{name:<16} {row['requests']:>9} {row['prompt_tokens']:>11} "
                f"{row['completion_tokens']:>9} {row['seconds']:>9.2f}  {outcomes}"
            )
        out.print("")


@app.command()
def serve(
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")],
    host: Annotated[
        str | None, typer.Option("--host", help="Interface (default: server.host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="TCP port, 0 for any (default: server.port).")
    ] = None,
    voice: Annotated[
        bool | None,
        typer.Option(
            "--voice/--no-voice",
            help="Serve voice sessions: speech in and out (default: speech.enabled).",
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="debug, info, warning or error: what Mythic logs to stderr "
            "(default: server.log_level, info: each voice turn's latency trace).",
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Serve the world's NPCs over WebSocket (/v1/ws) and HTTP until Ctrl-C."""
    settings = _settings(config)
    server = settings.server.model_copy(
        update={k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    )
    if log_level is not None:
        update = server.model_dump() | {"log_level": log_level.lower()}
        server = _guard(lambda: ServerSettings.model_validate(update))
    _log_to_stderr(server.log_level)
    speech = settings.speech
    if voice is not None:
        speech = speech.model_copy(update={"enabled": voice})
    settings = settings.model_copy(update={"server": server, "speech": speech})

    def run() -> None:
        from mythic.server import serve as serve_world

        err.print(f"Loading {world} and {settings.engine.dialogue_model} ...")
        try:
            serve_world(settings, str(world), announce=lambda line: out.print(line))
        except KeyboardInterrupt:
            # uvicorn has shut down gracefully and re-raised Ctrl-C: that is a clean stop.
            err.print("Stopped.")
        except OSError as exc:
            raise MythicError(f"cannot listen on {server.host}:{server.port}: {exc}") from exc

    _guard(run)


@app.command()
def chat(
    npc: Annotated[str, typer.Option("--npc", "-n", help="NPC id (file name of its card).")],
    world: Annotated[
        Path | None, typer.Option("--world", "-w", help="World folder (without --server).")
    ] = None,
    server: Annotated[
        str | None,
        typer.Option("--server", "-s", help="Talk through a running server: ws://HOST:PORT/v1/ws"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Packaged model name or GGUF path (default: engine.dialogue_model).",
        ),
    ] = None,
    say: Annotated[
        list[str] | None,
        typer.Option(
            "--say",
            help="Say this and print the reply instead of chatting interactively (repeatable).",
        ),
    ] = None,
    voice: Annotated[
        Path | None,
        typer.Option(
            "--voice",
            help="Speak this WAV file to the NPC (streamed at real-time pace) and hear the "
            "reply in audio; without --server, a voice server is started for --world.",
        ),
    ] = None,
    out_wav: Annotated[
        Path, typer.Option("--out", "-o", help="Where --voice writes the NPC's spoken reply.")
    ] = Path("reply.wav"),
    config: ConfigOption = None,
) -> None:
    """Talk to an NPC in the terminal; replies stream as they are generated."""
    if voice is not None:
        _guard(lambda: _chat_by_voice(voice, npc, server, world, out_wav))
        return
    if server is not None:
        _guard(lambda: _chat_over_server(server, npc, say))
        return
    if world is None:
        err.print("error: give --world (embedded model) or --server URL", style="bold red")
        raise typer.Exit(2)
    from mythic.dialogue import Conversation, PlayerInputError
    from mythic.engine import Engine
    from mythic.knowledge import load_world

    settings = _settings(config)
    loaded = _guard(lambda: load_world(world))
    try:
        persona = loaded.npc(npc)
    except KeyError as exc:
        err.print(f"error: {exc.args[0]}", style="bold red")
        raise typer.Exit(2) from None
    name = model or settings.engine.dialogue_model
    err.print(f"Loading {name} ...")
    engine = _guard(lambda: Engine.load(settings.engine, name))
    try:
        conversation = _guard(lambda: Conversation(loaded, npc, engine, settings.chat))
        interactive = say is None
        if interactive:
            err.print(
                f"You are talking to {persona.name} ({persona.archetype}). "
                "Type a line and press Enter; Ctrl-D or /quit to leave."
            )
        lines = iter(say) if say is not None else _read_lines()
        for line in lines:
            if line.strip() in {"/quit", "/exit"}:
                break
            if not interactive:
                out.print(f"> {line}")
            out.print(f"{persona.name}: ", end="")
            try:
                for piece in conversation.reply(line):
                    out.print(piece, end="", markup=False)
                    out.file.flush()
            except PlayerInputError as exc:
                out.print()
                err.print(str(exc), style="yellow")
                continue
            except KeyboardInterrupt:
                # Ctrl-C cuts the NPC off (what it said so far is kept); Ctrl-D leaves.
                out.print(" [cut off]", markup=False)
                continue
            out.print()
    finally:
        engine.close()


def _chat_by_voice(
    wav: Path, npc: str, server: str | None, world: Path | None, out_wav: Path
) -> None:
    import asyncio
    import contextlib

    from mythic.cli._sim import spawned_server
    from mythic.cli._voice import load_speech, talk_once

    pcm = load_speech(wav)
    with contextlib.ExitStack() as stack:
        if server is None:
            if world is None:
                raise MythicError("give --world (a voice server is started for it) or --server")
            err.print(f"starting a voice server for {world} ...")
            server = stack.enter_context(spawned_server(world, voice=True, nice=0))
        err.print(f"speaking {len(pcm) / 32000:.1f} s of {wav} to {npc} ...")
        try:
            turn, latency = asyncio.run(
                talk_once(server, npc, pcm, out_wav, lambda line: out.print(line))
            )
        except (OSError, TimeoutError) as exc:
            raise MythicError(f"voice chat with {server} failed: {exc!r}") from exc
    out.print(f"{npc}> {turn.text}")
    if turn.chunks:
        seconds = len(turn.pcm) / 2 / (turn.sample_rate or 22050)
        out.print(f"audio: {seconds:.1f} s in {len(turn.chunks)} chunks -> {out_wav}")
    out.print(
        "latency from the end of speech: "
        + "  ".join(f"{hop} {s * 1000:.0f} ms" for hop, s in latency.items())
    )


@voice_app.command("list")
def voice_list() -> None:
    """The voice profiles NPCs can have (`voice_id` in a card; an archetype's name is one)."""
    from mythic.speech import Voices

    for profile in Voices():
        effects = ", ".join(" ".join(effect) for effect in profile.effects) or "-"
        out.print(
            f"{profile.voice_id:<10} {profile.engine:<7} rate {profile.rate:<5g} pitch "
            f"{profile.pitch_semitones:+g}  effects: {effects}  {profile.description}"
        )


@voice_app.command("preview")
def voice_preview(
    voice_id: Annotated[str, typer.Argument(help="A voice id (mythic voice list).")],
    text: Annotated[str, typer.Argument(help="What to say.")],
    output: Annotated[Path, typer.Option("--out", "-o", help="The WAV file to write.")] = Path(
        "preview.wav"
    ),
) -> None:
    """Say `text` in a voice, into a WAV file."""
    import asyncio

    from mythic.speech import write_preview

    path = _guard(lambda: asyncio.run(write_preview(voice_id, text, output)))
    out.print(f"wrote {path}")


def _chat_over_server(url: str, npc: str, say: list[str] | None) -> None:
    """The terminal chat through a server: tool calls are shown and acknowledged as done."""
    import asyncio

    from mythic.client import ClientError, MythicClient, ToolResult
    from mythic.contracts import Error, LLMStreamDelta, ToolCall

    async def tool(call: ToolCall) -> ToolResult:
        out.print(f"\n  [{call.name} {json.dumps(call.args)}]", end="")
        return "ok", None

    async def talk() -> None:
        try:
            client = MythicClient(url, tool_handler=tool, timeout_s=300)
            await client.connect()
        except (OSError, TimeoutError) as exc:
            raise MythicError(f"cannot reach {url}: {exc}", fix="start it: mythic serve") from exc
        try:
            interactive = say is None
            if interactive:
                err.print(f"Talking to {npc} through {url}. Ctrl-D or /quit to leave.")
            for line in iter(say) if say is not None else _read_lines():
                if line.strip() in {"/quit", "/exit"}:
                    break
                if not interactive:
                    out.print(f"> {line}")
                out.print(f"{npc}: ", end="")
                turn = await client.say(npc, line)
                async for event in turn:
                    if isinstance(event, LLMStreamDelta):
                        out.print(event.delta, end="")
                        out.file.flush()
                    elif isinstance(event, Error):
                        err.print(f"\n{event.code}: {event.message}", style="yellow")
                out.print()
        except ClientError as exc:
            raise MythicError(str(exc)) from exc
        finally:
            await client.aclose()

    asyncio.run(talk())


def _read_lines() -> Iterator[str]:
    """Player lines from the terminal (with a prompt) or from piped standard input."""
    tty = sys.stdin.isatty()
    while True:
        try:
            line = input("you> ") if tty else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            out.print()
            return
        if not tty:
            if not line:
                return
            line = line.rstrip("\n")
            out.print(f"you> {line}")
        yield line


# -- sim ----------------------------------------------------------------------------------------


@app.command()
def sim(
    world: Annotated[
        Path, typer.Option("--world", "-w", help="World whose personas answer the intents.")
    ] = Path("examples/worlds/ravenmoor"),
    npcs: Annotated[int, typer.Option(help="NPCs in the region, the horde included.")] = 1000,
    horde: Annotated[int, typer.Option(help="Zombies in the horde.")] = 300,
    seconds: Annotated[float, typer.Option(help="How long to run, in real time.")] = 20.0,
    fps: Annotated[float, typer.Option(help="Frames per second to pace at.")] = 300.0,
    server: Annotated[
        str | None,
        typer.Option("--server", "-s", help="Ask a running server: ws://HOST:PORT/v1/ws"),
    ] = None,
    model: Annotated[
        bool, typer.Option("--model/--no-model", help="Intent updates from the model.")
    ] = True,
    threads: Annotated[
        int, typer.Option(help="Cores for the model when sim starts its own server.")
    ] = 1,
    intents: Annotated[
        str,
        typer.Option(
            help="Where the intent client runs: 'process' (its own, off the game's GIL) or "
            "'thread' (a thread of the game's process)."
        ),
    ] = "process",
    view: Annotated[
        Path | None,
        typer.Option(help="Also write a replay page (HTML) of the run to open in a browser."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the region and the steering.")] = 0,
    pin: Annotated[
        bool,
        typer.Option(
            "--pin/--no-pin",
            help="Pin the frame loop to cores of its own and the model's processes (server, "
            "intent client) to the --threads others (Linux, 2+ cores).",
        ),
    ] = True,
    bronze_every: Annotated[
        int,
        typer.Option(
            help="Frames between two runs of a far-off (bronze) NPC's micro-policy "
            "(ControlSettings.bronze_every; 1: every frame); more in a crowd with over "
            "--bronze-per-frame bronze NPCs."
        ),
    ] = 2,
    bronze_per_frame: Annotated[
        int,
        typer.Option(
            help="At most about this many bronze micro-policies a frame: past it, bronze NPCs "
            "run less often (ControlSettings.bronze_per_frame; 0: no cap)."
        ),
    ] = 2500,
    realtime: Annotated[
        bool,
        typer.Option(
            "--realtime/--no-realtime",
            help="With --pin, run the frame loop under the real-time FIFO policy where the OS "
            "allows it (Linux, root or an rtprio limit), so no ordinary process on its core "
            "makes a due frame wait.",
        ),
    ] = False,
) -> None:
    """A headless region: a player walks through a town, its monsters and a zombie horde, every
    NPC steered at frame rate by the game-side controller while the NPCs near the player get
    intents from the model (a server of its own, or --server). Prints frame-time statistics."""
    _guard(
        lambda: _sim(
            world,
            npcs,
            horde,
            seconds,
            fps,
            server,
            model,
            threads,
            intents,
            view,
            seed,
            pin,
            bronze_every,
            bronze_per_frame,
            realtime,
        )
    )


def _sim(
    world: Path,
    npcs: int,
    horde: int,
    seconds: float,
    fps: float,
    server: str | None,
    model: bool,
    threads: int,
    intents: str,
    view: Path | None,
    seed: int,
    pin: bool,
    bronze_every: int,
    bronze_per_frame: int,
    realtime: bool,
) -> None:
    import contextlib
    import dataclasses

    from mythic.cli._replay import ReplayRecorder
    from mythic.cli._sim import (
        FRAME_BUDGET_S,
        RegionSpec,
        SourceKind,
        build_region,
        cpu_model_settings,
        intent_source,
        percentile,
        pinned,
        run_paced,
        runs_realtime,
        spawned_server,
        speakers,
    )
    from mythic.control import Controller, split_cores

    if intents not in ("process", "thread"):
        raise MythicError(f"--intents must be 'process' or 'thread', not {intents!r}")
    try:
        spec = RegionSpec(npcs=npcs, horde=horde, seed=seed)
        settings = dataclasses.replace(
            cpu_model_settings(seed),
            bronze_every=bronze_every,
            bronze_per_frame=bronze_per_frame,
        )
    except ValueError as exc:
        raise MythicError(str(exc)) from None
    controller = Controller(settings=settings, capacity=npcs)
    path = build_region(controller, spec)
    recorder = ReplayRecorder(controller) if view is not None else None
    split = split_cores(threads) if pin and model else None
    model_cpus = split.model if split is not None else None
    with contextlib.ExitStack() as stack:
        if model:
            speaker_of = speakers(world)
            if server is None:
                err.print(f"starting a server for {world} ({threads} core(s) for the model)...")
                server = stack.enter_context(
                    spawned_server(world, threads=threads, cpus=model_cpus)
                )
            if split is not None and stack.enter_context(pinned(split.game, realtime=realtime)):
                fifo = ", real-time" if realtime and runs_realtime() else ""
                err.print(
                    f"frame loop on core(s) {sorted(split.game)}{fifo}, model's processes on "
                    f"{sorted(split.model)}"
                )
            kind: SourceKind = "process" if intents == "process" else "thread"
            stack.enter_context(
                intent_source(controller, server, speaker_of, kind, cpus=model_cpus)
            )
        err.print(f"running {npcs} NPCs ({horde} in the horde) for {seconds:g} s at {fps:g} fps")
        run = run_paced(controller, path, seconds=seconds, fps=fps, recorder=recorder)
    if recorder is not None and view is not None:
        recorder.write(view, title=f"mythic sim: {npcs} NPCs")
        err.print(f"wrote the replay to {view}")
    stats = run.stats
    ms = [s * 1000 for s in run.frame_s]
    out.print(
        f"frames {len(ms)}  frame p50 {percentile(ms, 0.5):.2f} ms  p99 "
        f"{percentile(ms, 0.99):.2f} ms  max {max(ms, default=0):.2f} ms  over "
        f"{FRAME_BUDGET_S * 1000:.1f} ms: {run.over_budget} ({run.preempted} waiting for "
        f"the CPU, {run.by_traffic} put over by the model's traffic)"
    )
    out.print(
        f"tiers gold {stats.gold} silver {stats.silver} bronze {stats.bronze} (policies every "
        f"{stats.bronze_cadence} frames)  intents sent "
        f"{stats.requests_sent} applied {stats.applied} ({run.applied_per_s:.1f}/s) stale "
        f"{stats.dropped_stale} timed out {stats.timed_out} failed {stats.failed} shed "
        f"{stats.shed} (persona busy)"
    )
    hit = "-" if stats.prediction_hits + stats.prediction_misses == 0 else f"{stats.hit_rate:.2f}"
    out.print(
        f"interactions {stats.prediction_hits + stats.prediction_misses}  predicted {hit}  "
        f"prefetches {stats.prefetches}"
    )


def main() -> None:
    """Entry point of the `mythic` console script."""
    app()
