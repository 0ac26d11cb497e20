"""Worlds on disk: `world.yaml`, persona cards in `npcs/`, lore per zone in `lore/<zone>/`, and
what each faction's members alone know in `factions/<faction>/`."""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from mythic.knowledge._calendar import Calendar
from mythic.knowledge._cards import (
    MAX_CARD_BYTES,
    WorldLoadError,
    WorldProblem,
    load_card,
    read_text_file,
)
from mythic.safety import NPCSafety, WorldSafety

log = logging.getLogger(__name__)

_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)]
Slug = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
]


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Word = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, to_lower=True, pattern=r"^[A-Za-z']+(?:-[A-Za-z']+)*$", max_length=32
    ),
]


class TurnTaking(_Card):
    """How an NPC that is speaking takes the player's voice over its own (voice sessions)."""

    backchannels: list[Word] = Field(default_factory=list, max_length=64)
    """More words that, alone (at most three), are a listener's acknowledgement and not a bid
    for the turn, besides the built-in ones ("yeah", "mm-hm", "right", "I see", ...): e.g. an
    archetype's own grunt ("aye", "hrm")."""
    ignore_backchannels: bool = True
    """A backchannel while the NPC speaks does not stop it; False: any words cut it off."""
    resume_after_noise: bool = True
    """The NPC, paused because the player seemed to speak, goes on when that sound turns out to
    hold no words (a cough, a bump); False: it stays stopped (the reply is cut off)."""


class Persona(_Card):
    """A persona card: who an NPC is and how it talks (`npcs/<id>.yaml`)."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
    """The name players see, e.g. "Marla, the Barkeep"."""
    archetype: Slug
    """The creature or role: human, vampire, werewolf, zombie, ghoul, lich, ..."""
    style: Text
    """How the NPC speaks, in a few words."""
    rules: list[Text] = Field(default_factory=list, max_length=32)
    """Behaviour rules the NPC always follows."""
    taboos: list[Text] = Field(default_factory=list, max_length=32)
    """Things the NPC never says or reveals."""
    catchphrases: list[Text] = Field(default_factory=list, max_length=32)
    """Words or phrases the NPC likes to use."""
    fallback_lines: list[Text] = Field(default_factory=list, max_length=16)
    """What the NPC says when no model can answer (every endpoint down); default: a line in
    its archetype's voice."""
    voice_id: Slug | None = None
    """The voice profile for speech."""
    turn_taking: TurnTaking = Field(default_factory=TurnTaking)
    """How it takes being talked over while it speaks: backchannels, noises."""
    backstory: (
        Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
        | None
    ) = None
    """A few sentences of history, in the third person."""
    zone: Slug | None = None
    """The zone the NPC lives in (a key of `zones` in world.yaml)."""
    tools: list[Slug] | None = Field(default=None, max_length=64)
    """The game tools this NPC may call (give_item, set_waypoint, open_dialog, play_emote,
    set_focus, set_marker); left out: all of them; `[]`: none."""
    faction: Slug | None = None
    """The faction the NPC belongs to (a key of `factions` in world.yaml): it knows the
    faction's lore (`factions/<faction>/`), which no one outside it does."""
    knows: list[Slug] = Field(default_factory=list, max_length=64)
    """Zones whose lore the NPC knows besides its own zone's (world-wide lore, in `lore/`
    itself, everyone knows)."""
    safety: NPCSafety = Field(default_factory=NPCSafety)
    """What this NPC may never say or do, a stricter rating, and its own deflections (the
    world's policy is `safety.yaml`)."""

    @field_validator("faction")
    @classmethod
    def _faction_declared(cls, faction: str | None, info: ValidationInfo) -> str | None:
        factions = info.context.get("factions") if isinstance(info.context, dict) else None
        if faction is not None and factions is not None and faction not in factions:
            declared = ", ".join(sorted(factions)) or "none"
            raise ValueError(f"unknown faction {faction!r} (world.yaml factions: {declared})")
        return faction

    @field_validator("zone")
    @classmethod
    def _zone_declared(cls, zone: str | None, info: ValidationInfo) -> str | None:
        if zone is not None:
            _check_zone(zone, info)
        return zone

    @field_validator("knows")
    @classmethod
    def _zones_declared(cls, zones: list[str], info: ValidationInfo) -> list[str]:
        for zone in zones:
            _check_zone(zone, info)
        return zones

    def zones_known(self) -> tuple[str, ...]:
        """The zones whose lore this NPC draws on: its own first, then `knows`."""
        own = (self.zone,) if self.zone else ()
        return own + tuple(z for z in self.knows if z != self.zone)


def _check_zone(zone: str, info: ValidationInfo) -> None:
    zones = info.context.get("zones") if isinstance(info.context, dict) else None
    if zones is not None and zone not in zones:
        raise ValueError(f"unknown zone {zone!r} (world.yaml zones: {', '.join(sorted(zones))})")


class Zone(_Card):
    """A place in the world; its lore lives in `lore/<zone id>/`."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
    """The zone's name as NPCs say it (1-100 characters)."""
    description: Text
    """What the place is like; NPCs in the zone are told it as their scene."""


class Faction(_Card):
    """A group of NPCs who share what they know (the Night Watch, a vampire court); its lore
    lives in `factions/<faction id>/`."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
    """The faction's name as its members say it (1-100 characters)."""
    description: Text
    """What the faction is, as its members know it (told to them alone)."""


class WorldCard(_Card):
    """`world.yaml`: the world's name, premise and zones."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
    """The world's name (1-100 characters)."""
    description: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)
    ]
    """The world's premise in a few sentences (at most 2,000 characters)."""
    zones: dict[Slug, Zone] = Field(default_factory=dict)
    """The places of the world by id (a slug); a persona's `zone` names one of them."""
    factions: dict[Slug, Faction] = Field(default_factory=dict)
    """The world's factions by id (a slug); a persona's `faction` names one of them."""
    calendar: Calendar = Field(default_factory=Calendar)
    """The game's months, seasons and how a year is said (`SceneUpdate.date` is a date in
    it); left out, the Gregorian months."""


@dataclass(frozen=True, slots=True)
class LoreDoc:
    """One lore document: of a zone (`lore/<zone>/`), or of the whole world (`lore/`)."""

    zone: str | None
    title: str
    text: str
    path: Path
    tags: tuple[str, ...] = ()
    faction: str | None = None
    """The faction whose members alone know it (`factions/<faction>/`), or None."""


@dataclass(frozen=True, slots=True)
class World:
    """A loaded, fully valid world."""

    path: Path
    card: WorldCard
    npcs: dict[str, Persona]
    lore: tuple[LoreDoc, ...] = field(default_factory=tuple)
    skipped: tuple[WorldProblem, ...] = field(default_factory=tuple)
    """Lore files that could not be used (unreadable, too large, malformed): reported, left
    out, and the rest of the world loaded."""
    safety: WorldSafety = field(default_factory=WorldSafety)
    """The content policy of every NPC (`safety.yaml`; left out, the defaults: rated teen)."""

    @property
    def name(self) -> str:
        return self.card.name

    def npc(self, npc_id: str) -> Persona:
        """The persona card of `npc_id`.

        Raises:
            KeyError: with the list of NPC ids the world has.
        """
        try:
            return self.npcs[npc_id]
        except KeyError:
            known = ", ".join(sorted(self.npcs)) or "none"
            raise KeyError(f"no NPC {npc_id!r} in world {self.name!r} (NPCs: {known})") from None

    def lore_for(self, zone: str | None) -> list[LoreDoc]:
        """The lore documents of `zone` (None: the world-wide ones); no faction's."""
        return [doc for doc in self.lore if doc.zone == zone and doc.faction is None]

    def faction_lore(self, faction: str | None) -> list[LoreDoc]:
        """The lore documents only `faction`'s members know (none for None)."""
        return [doc for doc in self.lore if faction is not None and doc.faction == faction]

    def texts(self) -> list[str]:
        """Everything the world's cards and lore say: its and its zones' descriptions, every
        card's name, style, rules, taboos, catchphrases and backstory, every lore text, and
        the calendar's months when world.yaml names them."""
        card = self.card
        texts = [card.description, *(z.description for z in card.zones.values())]
        texts += [t for f in card.factions.values() for t in (f.name, f.description)]
        if "calendar" in card.model_fields_set:
            texts.append(" ".join(m.name for m in card.calendar.months))
        for p in self.npcs.values():
            texts += [p.name, p.style, *p.rules, *p.taboos, *p.catchphrases, p.backstory or ""]
        return texts + [doc.text for doc in self.lore]


class _LoreFront(_Card):
    title: Text | None = None
    tags: list[Slug] = Field(default_factory=list, max_length=32)


class _LoreEntry(_LoreFront):
    text: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class _LoreFile(_Card):
    """A YAML lore file: one document (`title`, `tags`, `text`) or several (`entries`)."""

    title: Text | None = None
    tags: list[Slug] = Field(default_factory=list, max_length=32)
    text: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] | None = None
    entries: list[_LoreEntry] = Field(default_factory=list, max_length=10_000)


LORE_SUFFIXES = (".md", ".yaml", ".yml")


def _load_lore(
    path: Path, zone: str | None, limit: int = MAX_CARD_BYTES
) -> tuple[list[LoreDoc], list[WorldProblem]]:
    """The documents of one lore file (markdown with optional front matter, or YAML)."""
    if path.suffix != ".md":
        card, problems = load_card(path, _LoreFile, limit=limit)
        if card is None:
            return [], problems
        stem = path.stem.replace("-", " ").replace("_", " ")
        docs = [
            LoreDoc(zone, e.title or f"{card.title or stem} {i + 1}", e.text, path, tuple(e.tags))
            for i, e in enumerate(card.entries)
        ]
        if card.text is not None:
            docs.insert(0, LoreDoc(zone, card.title or stem, card.text, path, tuple(card.tags)))
        if not docs:
            return [], [WorldProblem(path, None, None, "lore file has no `text` and no `entries`")]
        return docs, []
    text, problems = read_text_file(path, limit)
    if text is None:
        return [], problems
    front = _LoreFront()
    body = text
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end < 0:
            return [], [WorldProblem(path, 1, None, "front matter opened with --- never closed")]
        try:
            raw = yaml.safe_load(text[4:end]) or {}
            front = _LoreFront.model_validate(raw)
        except RecursionError:
            return [], [WorldProblem(path, 1, "front matter", "nested too deeply")]
        except (yaml.YAMLError, ValueError) as exc:
            return [], [WorldProblem(path, 1, "front matter", str(exc).splitlines()[0])]
        body = text[end + 4 :].lstrip("\n")
    if not body.strip():
        return [], [WorldProblem(path, None, None, "lore document has no text")]
    title = front.title
    if title is None:
        heading = next((ln for ln in body.splitlines() if ln.startswith("# ")), None)
        title = heading[2:].strip() if heading else path.stem.replace("-", " ").replace("_", " ")
    return [LoreDoc(zone, title, body, path, tuple(front.tags))], []


def _lore_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in LORE_SUFFIXES and not p.is_dir())


def load_world(path: str | Path, *, max_lore_bytes: int = MAX_CARD_BYTES) -> World:
    """Load and validate a whole world folder.

    Every card is checked before anything is returned, so the cards of a world are loaded
    completely or not at all. A lore file that cannot be used (unreadable, larger than
    `max_lore_bytes`, malformed) is reported in `World.skipped` and left out.

    Raises:
        WorldLoadError: lists every problem found, each with its file, line and field.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise WorldLoadError([WorldProblem(root, None, None, "not a folder")])
    problems: list[WorldProblem] = []

    card, found = load_card(root / "world.yaml", WorldCard)
    if not (root / "world.yaml").is_file():
        found = [WorldProblem(root / "world.yaml", None, None, "missing: every world needs one")]
    problems += found
    zones = set(card.zones) if card else set()
    factions = set(card.factions) if card else set()

    npcs: dict[str, Persona] = {}
    npc_dir = root / "npcs"
    npc_files = sorted(npc_dir.glob("*.y*ml")) if npc_dir.is_dir() else []
    if not npc_files:
        problems.append(WorldProblem(npc_dir, None, None, "no persona cards (npcs/<id>.yaml)"))
    for file in npc_files:
        npc_id = file.stem
        if not _ID.match(npc_id):
            msg = f"NPC id {npc_id!r} must be lowercase letters, digits, '-' or '_'"
            problems.append(WorldProblem(file, None, None, msg))
            continue
        if npc_id in npcs:
            problems.append(WorldProblem(file, None, None, f"duplicate NPC id {npc_id!r}"))
            continue
        context: dict[str, object] | None = {"zones": zones, "factions": factions} if card else None
        persona, found = load_card(file, Persona, context=context)
        problems += found
        if persona is None:
            continue
        npcs[npc_id] = persona

    lore: list[LoreDoc] = []
    skipped: list[WorldProblem] = []
    lore_dir = root / "lore"
    if lore_dir.is_dir():
        shards: list[tuple[str | None, Path]] = [(None, lore_dir)]
        for zone_dir in sorted(p for p in lore_dir.iterdir() if p.is_dir()):
            if card is not None and zone_dir.name not in zones:
                msg = f"lore for zone {zone_dir.name!r}, which world.yaml does not declare"
                problems.append(WorldProblem(zone_dir, None, None, msg))
                continue
            shards.append((zone_dir.name, zone_dir))
        for zone, folder in shards:
            for file in _lore_files(folder):
                docs, found = _load_lore(file, zone, max_lore_bytes)
                skipped += found
                lore += docs

    faction_dir = root / "factions"
    if faction_dir.is_dir():
        for folder in sorted(p for p in faction_dir.iterdir() if p.is_dir()):
            if card is not None and folder.name not in factions:
                msg = f"lore for faction {folder.name!r}, which world.yaml does not declare"
                problems.append(WorldProblem(folder, None, None, msg))
                continue
            for file in _lore_files(folder):
                docs, found = _load_lore(file, None, max_lore_bytes)
                skipped += found
                lore += [dataclasses.replace(doc, faction=folder.name) for doc in docs]

    safety: WorldSafety | None = WorldSafety()
    if (root / "safety.yaml").exists():
        safety, found = load_card(root / "safety.yaml", WorldSafety)
        problems += found

    if problems or card is None or safety is None:
        raise WorldLoadError(problems)
    for problem in skipped:
        log.warning("lore skipped: %s", problem)
    return World(
        path=root,
        card=card,
        npcs=npcs,
        lore=tuple(lore),
        skipped=tuple(skipped),
        safety=safety,
    )
