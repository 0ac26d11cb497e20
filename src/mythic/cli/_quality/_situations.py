"""Relevance, greeting, game-action probes and the scripted long conversation."""

from __future__ import annotations

import re

from mythic.cli._eval import StyleProbe
from mythic.cli._quality._lore import PRICE_HEADER, LoreTable, label_of, value_column
from mythic.cli._quality._probe import NotChecked, NPCPlan, Plan, Probe, interleave
from mythic.cli._quality._templates import SCORECARD, Templates
from mythic.dialogue import npc_tools
from mythic.knowledge import Persona, World


def place_names(world: World, zone: str, names: frozenset[str]) -> tuple[str, ...]:
    """What names the way to `zone`: its name and the proper names of its description (a
    single word only when the world writes it as a name mid-sentence), not the world's name
    nor a person's."""
    card = world.card.zones[zone]
    people = {w for p in world.npcs.values() for w in re.findall(r"[\w'-]+", p.name)}
    found = {re.sub(r"^(?:The|A|An)\s+", "", card.name)}
    for match in re.finditer(r"\b[A-Z][\w'-]+(?:\s+(?:of\s+)?[A-Z][\w'-]+)*", card.description):
        words = [w for w in match.group(0).split() if w not in ("The", "A", "An")]
        if not words or any(w in people for w in words):
            continue
        if len(words) > 1 or (words[0] in names and len(words[0]) > 3):
            found.add(" ".join(words))
    found.discard(world.card.name)
    return tuple(sorted(found))


def _other_zones(world: World, persona: Persona) -> list[str]:
    return [z for z in world.card.zones if z != persona.zone]


def _zone_name(world: World, zone: str) -> str:
    """A zone's name as it goes inside a sentence ("the Cathedral Quarter")."""
    name = world.card.zones[zone].name
    return re.sub(r"^(The|A|An) ", lambda m: m[1].lower() + " ", name)


def _priced_items(tables: list[LoreTable], names: frozenset[str]) -> list[tuple[str, str]]:
    """(label, source) of each row of a price table."""
    out = []
    for table in tables:
        column = value_column(table)
        if column is None or not PRICE_HEADER.search(table.header[column]):
            continue
        out += [(label_of(cells[0], names), f"{table.source}:{line}") for line, cells in table.rows]
    return [(label, source) for label, source in out if label]


def relevance_probes(
    world: World,
    npc: str,
    persona: Persona,
    tables: list[LoreTable],
    plan: Plan,
    templates: Templates = SCORECARD,
) -> list[Probe]:
    ways = [
        Probe(
            npc,
            "relevance",
            templates.way.format(_zone_name(world, zone)),
            f"world.yaml zone {zone}",
            "direction",
            place=zone,
        )
        for zone in _other_zones(world, persona)
    ]
    prices = [
        Probe(npc, "relevance", templates.would_cost.format(label), source, "price")
        for label, source in _priced_items(tables, plan.names)
    ]
    if not ways:
        plan.not_checked.append(
            NotChecked(npc, "relevance", "directions: the world has no other zone to ask for")
        )
    if not prices:
        plan.not_checked.append(
            NotChecked(npc, "relevance", "prices: no price table in the lore of its zones")
        )
    return interleave(ways, prices)


def greeting_probes(
    npc: str,
    style: list[StyleProbe],
    plan_npc: NPCPlan,
    plan: Plan,
    templates: Templates = SCORECARD,
) -> list[Probe]:
    if not plan_npc.catchphrases:
        plan.not_checked.append(
            NotChecked(npc, "greetings", "catchphrases: the card has none (length still checked)")
        )
    invited = [
        Probe(npc, "greetings", p.question, f"probes/style.yaml ({npc})", "probe", catchphrase=True)
        for p in style
        if p.catchphrase
    ]
    general = [
        Probe(npc, "greetings", g, "template", "greeting", catchphrase=True)
        for g in templates.greetings
    ]
    return interleave(invited, general)


def action_probes(
    world: World,
    npc: str,
    persona: Persona,
    lore: list[Probe],
    tables: list[LoreTable],
    decide: bool,
    plan: Plan,
) -> list[Probe]:
    if not decide:
        plan.not_checked.append(
            NotChecked(npc, "actions", "dialogue.decide is off: no intent or tool is decided")
        )
        return []
    tools = npc_tools(npc, persona.tools)
    way_tools = tuple(t for t in ("set_waypoint", "set_marker") if t in tools)
    trade_tools = tuple(t for t in ("give_item", "open_dialog") if t in tools)
    zones = _other_zones(world, persona)
    probes: list[Probe] = []
    if way_tools and zones:
        names = [_zone_name(world, z) for z in zones]
        probes.append(
            Probe(npc, "actions", f"Which way is it to {names[0]}? Show me the way.",
                  "template", "way", tools=way_tools, intents=("navigation",))
        )  # fmt: skip
    probes.append(
        Probe(npc, "actions", "Nice evening, isn't it? How have you been keeping?", "template",
              "small talk", tools=(), intents=("chitchat",))
    )  # fmt: skip
    if lore:
        probes.append(
            Probe(npc, "actions", lore[0].question, lore[0].source, "lore question", tools=())
        )
    if trade_tools:
        items = _priced_items(tables, plan.names)
        line = (
            f"I'd like to buy {items[0][0]}. Here's the coin, hand it over."
            if items
            else "I'd like to buy something from you. What can you sell me?"
        )
        probes.append(
            Probe(npc, "actions", line, items[0][1] if items else "template", "trade",
                  tools=trade_tools, intents=("trade",))
        )  # fmt: skip
    if way_tools and zones:
        probes.append(
            Probe(npc, "actions", f"How do I get to {_zone_name(world, zones[-1])}?",
                  "template", "way", tools=way_tools, intents=("navigation",))
        )  # fmt: skip
    probes.append(
        Probe(npc, "actions", "Thanks, that's all I wanted to know.", "template", "small talk",
              tools=(), intents=("chitchat",))
    )  # fmt: skip
    if not way_tools or not zones:
        why = "the card allows no waypoint or marker tool" if not way_tools else "no other zone"
        plan.not_checked.append(NotChecked(npc, "actions", f"asking the way: {why}"))
    if not trade_tools:
        plan.not_checked.append(
            NotChecked(npc, "actions", "trade: the card allows neither give_item nor open_dialog")
        )
    return probes


def scripted_conversation(
    world: World,
    npc: str,
    persona: Persona,
    lore: list[Probe],
    turns: int,
    plan: Plan,
    templates: Templates = SCORECARD,
) -> list[Probe]:
    """The scripted conversation: a greeting, a lore question (turn 2), then small talk,
    more lore questions, one question asked again and again, topic changes; the last turn
    asks turn 2's question again."""
    asked = [p for p in lore if p.expect]
    first = asked[0] if asked else None
    others = asked[1:] or asked
    zones = [_zone_name(world, z) for z in _other_zones(world, persona)]

    def say(
        question: str,
        kind: str,
        source: str = "template",
        expect: tuple[tuple[str, ...], ...] = (),
    ) -> Probe:
        return Probe(npc, "long_conversation", question, source, kind, expect)

    small_talk = templates.small_talk
    script = [say(templates.greetings[0], "greeting")]
    if first is None:
        plan.not_checked.append(
            NotChecked(
                npc,
                "long_conversation",
                "the last turn against turn 2: no lore question with a known answer",
            )
        )
        script.append(say(small_talk[0], "small talk"))
    else:
        script.append(say(first.question, "lore", first.source, first.expect))
    pattern = ("small", "lore", "repeat", "small", "topic", "lore")
    repeated: Probe | None = None
    times = {"small": 0, "lore": 0, "repeat": 0, "topic": 0}
    i = 0
    while len(script) < turns - 1:
        step = pattern[i % len(pattern)]
        i += 1
        if step == "lore" and others:
            probe = others[times["lore"] % len(others)]
            times["lore"] += 1
            script.append(say(probe.question, "lore", probe.source, probe.expect))
            repeated = repeated or probe
        elif step == "repeat" and repeated is not None and times["repeat"] < 3:
            times["repeat"] += 1
            script.append(say(repeated.question, "repeat", repeated.source, repeated.expect))
        elif step == "topic":
            n = times["topic"]
            times["topic"] += 1
            line = (
                f"Let's talk about something else. What do you know about {zones[n % len(zones)]}?"
                if zones
                else "Let's change the subject. What do you do when you're not working?"
            )
            script.append(say(line, "topic change"))
        else:
            script.append(say(small_talk[times["small"] % len(small_talk)], "small talk"))
            times["small"] += 1
    if turns >= 3:
        last = script[1]
        script.append(say(last.question, "turn 2 again", last.source, last.expect))
    return script[:turns]
