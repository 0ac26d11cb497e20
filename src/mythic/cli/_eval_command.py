"""`mythic eval lore|style|quality|archetype`: the commands; their work is in `_eval.py`,
`_quality/` and `_train.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from mythic.cli._console import err, guard, load_config, out
from mythic.cli._options import BaseModelOption, ConfigOption, OutOption, VerboseOption, WorldOption

eval_app = typer.Typer(
    help="Evaluate NPCs: lore, style and quality scorecards through a real server; archetype "
    "adapters."
)


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

    settings = load_config(config)
    loaded = guard(lambda: load_world(world, max_lore_bytes=settings.knowledge.max_lore_bytes))
    for problem in loaded.skipped:
        err.print(f"lore skipped: {problem}", style="yellow")
    path = probes_file or world / "probes" / f"{kind}.yaml"
    probes: list[Any] = list(guard(lambda: load_probes(path, kind, loaded)))  # type: ignore[arg-type]
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

    results = guard(
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


ProbesOption = Annotated[
    Path | None,
    typer.Option("--probes", help="Probes YAML (default: <world>/probes/<kind>.yaml)."),
]

LimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N probes.")]

NpcOption = Annotated[str | None, typer.Option("--npc", help="Only this NPC's probes.")]


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
            "relevance, greetings, actions, long_conversation, scenes (default: all).",
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

    settings = load_config(config)
    guard(
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


@eval_app.command("safety")
def eval_safety(
    world: Annotated[
        list[Path],
        typer.Option("--world", "-w", help="World folder (repeatable: every world in one run)."),
    ],
    ordinary: Annotated[
        int,
        typer.Option(
            "--ordinary",
            min=0,
            max=2000,
            help="Ordinary lines of the quality scorecard per world, for false positives.",
        ),
    ] = 60,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="At most N red-team probes of each category."),
    ] = None,
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline/--no-baseline",
            help="Also run the red-team set without the guardrails (safety.enabled false).",
        ),
    ] = True,
    seed: Annotated[int, typer.Option("--seed", min=0, help="The engine's sampling seed.")] = 0,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=64, help="Lines served at once.")
    ] = 2,
    out_file: OutOption = None,
    verbose: VerboseOption = False,
    config: ConfigOption = None,
) -> None:
    """The guardrails through a real server: the red-team set (hate speech, self-harm, sexual
    content, personal data, jailbreaks, tool abuse) with and without them, false positives on
    the quality scorecard's ordinary lines, and the guard's milliseconds per phrase."""
    from mythic.cli._safety_eval import run_command

    settings = load_config(config)
    guard(
        lambda: run_command(
            settings,
            world,
            ordinary=ordinary,
            limit=limit,
            seed=seed,
            parallel=parallel,
            baseline=baseline,
            out_file=out_file,
            verbose=verbose,
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

    settings = load_config(config)
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
        adapters = guard(lambda: registered_adapters(where, archetype))
    passed = guard(lambda: run_eval(settings, world, archetype, model, adapters, out_file, verbose))
    if adapters and not passed:
        raise typer.Exit(1)
