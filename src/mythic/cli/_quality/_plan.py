"""The plan: every probe of every NPC, built from the world without a model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from mythic._errors import MythicError
from mythic.cli._eval import LoreProbe, StyleProbe
from mythic.cli._quality._lore import (
    lore_tables,
    money_words,
    plain_text,
    sentence_probes,
    table_probes,
)
from mythic.cli._quality._probe import (
    NotChecked,
    NPCPlan,
    Plan,
    Probe,
    interleave,
    ngrams,
    relative_source,
)
from mythic.cli._quality._scenes import scene_plans
from mythic.cli._quality._situations import (
    action_probes,
    greeting_probes,
    place_names,
    relevance_probes,
    scripted_conversation,
)
from mythic.cli._quality._taboos import taboo_probes
from mythic.cli._quality._templates import CHECKS, DEFAULT_MAX_WORDS, SCORECARD, Templates
from mythic.dialogue import name_forms, narrates_self, normalise, sentences, world_words
from mythic.knowledge import Persona, World, WorldLoadError, load_world, persona_prompt


def load_quality_world(
    path: Path, *, max_lore_bytes: int, workdir: Path
) -> tuple[World, list[NotChecked]]:
    """Load the world; persona cards the loader refuses (an empty style, too many rules) are
    left out and listed, and the rest is loaded from a view of the folder in `workdir`.

    Raises:
        WorldLoadError: the world itself is broken (world.yaml, zones, lore folders), or no
            card is left.
    """
    try:
        return load_world(path, max_lore_bytes=max_lore_bytes), []
    except WorldLoadError as exc:
        npcs_dir = (path / "npcs").resolve()
        bad = {p.file.resolve() for p in exc.problems if p.file.resolve().parent == npcs_dir}
        if not bad or any(p.file.resolve().parent != npcs_dir for p in exc.problems):
            raise
        cards = [c for c in sorted(npcs_dir.glob("*.y*ml")) if c.resolve() not in bad]
        if not cards:
            raise
        # A view of the world without the refused cards: links, so nothing large is copied.
        view = workdir / "world"
        view.mkdir()
        for entry in path.iterdir():
            if entry.name != "npcs":
                (view / entry.name).symlink_to(entry.resolve())
        (view / "npcs").mkdir()
        for card in cards:
            (view / "npcs" / card.name).symlink_to(card.resolve())
        refused = [
            NotChecked(
                p.file.stem,
                "all",
                f"card not loaded ({relative_source(p.file, path)}"
                + (f":{p.line}" if p.line else "")
                + f": {p.field + ': ' if p.field else ''}{p.message}): no check ran for it",
            )
            for p in exc.problems
        ]
        return load_world(view, max_lore_bytes=max_lore_bytes), refused


def build_plan(
    world: World,
    *,
    root: Path | None = None,
    npcs: Sequence[str] | None = None,
    checks: Sequence[str] = CHECKS,
    turns: int = 40,
    limit: int | None = None,
    decide: bool = True,
    not_checked: Sequence[NotChecked] = (),
    templates: Templates = SCORECARD,
    world_probes: bool = True,
) -> Plan:
    """Every probe of every chosen NPC, and what cannot be checked. No model is needed.

    `decide`: the server decides intents and tools (`dialogue.decide`); without it the
    actions check cannot run. `templates`: the fixed lines said to every NPC;
    `world_probes`: also the world's own probe files (`probes/lore.yaml`, `style.yaml`).
    """
    root = root or world.path
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise MythicError(f"unknown checks {', '.join(unknown)} (checks: {', '.join(CHECKS)})")
    chosen = list(npcs) if npcs else sorted(world.npcs)
    missing = [n for n in chosen if n not in world.npcs]
    if missing:
        raise MythicError(
            f"no NPC {', '.join(map(repr, missing))} in world {world.name!r} "
            f"(NPCs: {', '.join(sorted(world.npcs))})"
        )
    plan = Plan(world, root, tuple(checks), turns, [], list(not_checked))
    lore_file = _world_probes(world, root, "lore", plan.not_checked) if world_probes else []
    style_file = (
        [p for _, p in _world_probes(world, root, "style", plan.not_checked)]
        if world_probes
        else []
    )
    texts = world.texts()
    plan.names, plan.known = capitalised_names(texts), world_words(texts)
    tables = {id(doc): list(lore_tables(doc, root)) for doc in world.lore}
    plan.units = money_words(t for ts in tables.values() for t in ts)
    plan.places = {zone: place_names(world, zone, plan.names) for zone in world.card.zones}
    for npc_id in chosen:
        persona = world.npcs[npc_id]
        docs = [d for z in (*persona.zones_known(), None) for d in world.lore_for(z)]
        docs += world.faction_lore(persona.faction)
        npc_tables = [t for d in docs for t in tables[id(d)]]
        style = [p for p in style_file if p.npc == npc_id]
        npc = _npc_plan(world, npc_id, persona, style, plan.not_checked)
        lore = _dedupe(
            interleave(
                [_from_lore_probe(p, i) for i, p in lore_file if p.npc == npc_id],
                [
                    *table_probes(npc_id, npc_tables, plan.names, templates),
                    *sentence_probes(npc_id, docs, root, plan.names, templates),
                ],
            )
        )
        built: dict[str, list[Probe]] = {}
        if "lore" in checks:
            built["lore"] = lore
            if not lore:
                plan.not_checked.append(
                    NotChecked(
                        npc_id,
                        "lore",
                        "no lore probe, and no question could be made from its zones' lore "
                        "(no tables, prices, counts or hours)",
                    )
                )
        if "taboos" in checks:
            public = public_texts(world, persona)
            built["taboos"] = taboo_probes(npc_id, persona, public, style, plan, templates)
        if "in_character" in checks:
            built["in_character"] = [
                Probe(npc_id, "in_character", q, "template", kind, forbid=complied)
                for kind, q, complied in templates.in_character
            ]
        if "relevance" in checks:
            built["relevance"] = relevance_probes(
                world, npc_id, persona, npc_tables, plan, templates
            )
        if "greetings" in checks:
            built["greetings"] = greeting_probes(npc_id, style, npc, plan, templates)
        if "actions" in checks:
            built["actions"] = action_probes(world, npc_id, persona, lore, npc_tables, decide, plan)
        npc.probes = {k: v[:limit] if limit is not None else v for k, v in built.items()}
        if "long_conversation" in checks:
            npc.conversation = scripted_conversation(
                world, npc_id, persona, lore, turns, plan, templates
            )
        plan.npcs.append(npc)
    if "scenes" in checks:
        plan.scenes = scene_plans(plan, templates)
    if "assistant_speak" in checks and not any(
        c in checks for c in CHECKS if c != "assistant_speak"
    ):
        plan.not_checked.append(
            NotChecked(
                None,
                "assistant_speak",
                "counted over the replies of the other checks, and none was chosen",
            )
        )
    return plan


def _world_probes(
    world: World, root: Path, kind: Literal["lore", "style"], not_checked: list[NotChecked]
) -> list[tuple[int, Any]]:
    """The world's `probes/<kind>.yaml`, probe by probe: an invalid probe or one for an NPC
    the world does not have is listed and left out, the rest are used."""
    path = world.path / "probes" / f"{kind}.yaml"
    if not path.is_file():
        return []
    check = "lore" if kind == "lore" else "taboos"
    where = relative_source(root / "probes" / f"{kind}.yaml", root)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        not_checked.append(NotChecked(None, check, f"{where} not read: {exc}"))
        return []
    items = data.get("probes") if isinstance(data, dict) else None
    if not isinstance(items, list):
        not_checked.append(NotChecked(None, check, f"{where} has no `probes` list"))
        return []
    model: type[LoreProbe | StyleProbe] = LoreProbe if kind == "lore" else StyleProbe
    out: list[tuple[int, Any]] = []
    for number, item in enumerate(items, 1):
        try:
            probe = model.model_validate(item)
        except ValidationError as exc:
            first = exc.errors()[0]
            what = ".".join(str(p) for p in first["loc"]) or "probe"
            not_checked.append(
                NotChecked(None, check, f"{where} probe {number}: {what}: {first['msg']}")
            )
            continue
        if probe.npc not in world.npcs:
            not_checked.append(
                NotChecked(
                    probe.npc,
                    check,
                    f"{where} probe {number} is for NPC {probe.npc!r}, which the world "
                    "does not have",
                )
            )
            continue
        out.append((number, probe))
    return out


def _from_lore_probe(probe: LoreProbe, number: int) -> Probe:
    expect = tuple(tuple(i) if isinstance(i, list) else (i,) for i in probe.expect)
    return Probe(probe.npc, "lore", probe.question, f"probes/lore.yaml#{number}", "probe", expect)


def _dedupe(probes: list[Probe]) -> list[Probe]:
    seen: set[str] = set()
    out = []
    for p in probes:
        key = normalise(p.question)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def public_texts(world: World, persona: Persona) -> list[str]:
    """What anyone may say, as the reply filter counts it: the world's and zones'
    descriptions, every NPC's name, the card's style and rules; and its own catchphrases."""
    texts = [world.card.description, persona.style, *persona.rules, *persona.catchphrases]
    texts += [f"{z.name}: {z.description}" for z in world.card.zones.values()]
    return texts + [p.name for p in world.npcs.values()]


def capitalised_names(texts: Sequence[str]) -> frozenset[str]:
    """The words `texts` write capitalised other than at the start of a sentence, a line or
    a list item: a sentence's first word ("Taking a bribe") is no name unless the world
    writes it capitalised elsewhere."""
    found = set()
    for text in texts:
        for line in text.splitlines():
            for sentence in sentences(plain_text(line).lstrip("#").strip()):
                words = re.findall(r"[\w'-]+", sentence)
                found |= {w for w in words[1:] if w[:1].isupper()}
    return frozenset(found)


def _npc_plan(
    world: World,
    npc_id: str,
    persona: Persona,
    style: list[StyleProbe],
    not_checked: list[NotChecked],
) -> NPCPlan:
    forms = name_forms(persona.name, persona.backstory)
    by_design = [c for c in persona.catchphrases if narrates_self(c, forms)]
    if by_design:
        # A card whose own catchphrase names the NPC in the third person speaks that way on
        # purpose: its self-narration is style, not a slip.
        not_checked.append(
            NotChecked(
                npc_id,
                "self_narration",
                f"the card's catchphrase {by_design[0]!r} speaks of the NPC in the third "
                "person: self-narration is its style",
            )
        )
        forms = ()
    limits = [p.max_words for p in style]
    catchphrases = tuple(c for c in persona.catchphrases if normalise(c))
    instructions = persona_prompt(world, persona, None, full=False)
    own = {g for c in catchphrases for g in ngrams(c)}
    prompt = frozenset(ngrams(instructions) - own)
    return NPCPlan(
        npc_id, persona, forms, min(limits, default=DEFAULT_MAX_WORDS), catchphrases, prompt
    )
