"""Archetypes, micro-policies and the rules that turn a model's intent into a policy.

An archetype is what kind of body an NPC has (how fast it runs, how wide it is, whether it
talks) and what it does when nobody told it anything (its default behaviour). The intent rules
say, per archetype kind and intent, which micro-policy runs and with which parameters: combat
for a zombie is the horde closing in, for a guard an approach, for a villager a flight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

from mythic._errors import MissingExtraError

try:  # the first module the package imports: say what to install when NumPy is missing
    import numpy as np
    from numpy.typing import NDArray
except ImportError as exc:  # pragma: no cover - NumPy is there wherever the tests run
    raise MissingExtraError("numpy", "control") from exc

ArchetypeKind = Literal["civilian", "guard", "predator", "horde", "caster"]
"""How an archetype reacts to intents: the key of the intent rules."""

KINDS: tuple[ArchetypeKind, ...] = ("civilian", "guard", "predator", "horde", "caster")

TargetKind = Literal["none", "place", "being"]
"""What an intent aims at: nothing, a place (a landmark) or a being (the player, an NPC)."""

TALK_INTENTS = frozenset({"chitchat", "trade", "quest", "hint"})
"""Intents that mean talking to someone: approach them, then stand and face them."""


class Policy(IntEnum):
    """The frame-rate micro-policies. Stored per NPC as a small int."""

    IDLE = 0
    """Stand still, keep the current heading."""
    WANDER = 1
    """Stroll with smooth random steering, leashed to the NPC's home."""
    SEEK = 2
    """Walk to the target and stop at `radius` from it (arrive)."""
    FLEE = 3
    """Run from the target until `radius` away from it."""
    FOLLOW = 4
    """Keep `radius` behind the target."""
    PATROL = 5
    """Walk the NPC's waypoint route in a loop."""
    FACE_TALK = 6
    """Stand and turn to face the target (a conversation partner)."""
    HORDE = 7
    """Flock with the horde (separation, alignment, cohesion) toward the target."""
    STALK = 8
    """Creep toward the prey while unseen, rush when close, feed on arrival."""


NO_POLICY = -1
"""`then` value: nothing follows the policy."""


@dataclass(frozen=True, slots=True)
class Behaviour:
    """A policy and its parameters: what an NPC does until something replaces it."""

    policy: Policy
    """The micro-policy to run."""
    target_player: bool = False
    """Aim at the player when the behaviour has no other target."""
    radius: float = 0.0
    """Metres: where SEEK stops, how far FLEE runs, the FOLLOW gap, where STALK feeds and
    where HORDE stops around its target."""
    reach: float = math.inf
    """Metres: HORDE and STALK engage a target only this close (roaming otherwise); WANDER
    keeps this close to home."""
    speed: float = 0.5
    """Cruise speed as a fraction of the NPC's max speed (STALK: its creeping speed)."""
    then: Policy | None = None
    """The policy that takes over when SEEK arrives (FACE_TALK after approaching someone)."""

    def __post_init__(self) -> None:
        if not (self.radius >= 0 and self.reach > 0 and 0 < self.speed <= 1):
            raise ValueError(
                f"behaviour {self.policy.name}: radius >= 0, reach > 0 and 0 < speed <= 1 "
                f"(got radius={self.radius}, reach={self.reach}, speed={self.speed})"
            )


@dataclass(frozen=True, slots=True)
class Archetype:
    """One kind of NPC body and temperament."""

    name: str
    """The name games use (`zombie`), as in the server's archetype cards."""
    kind: ArchetypeKind
    """Which intent rules apply."""
    max_speed: float
    """Metres per second at a full run."""
    max_accel: float
    """Metres per second squared: how fast velocity may change (no pops)."""
    default: Behaviour
    """What the NPC does without an intent, or when its intent expires."""
    body_radius: float = 0.3
    """Metres: two NPCs closer than the sum of their radii overlap and are pushed apart."""
    talks: bool = True
    """Whether the player can talk to it (a candidate for interaction prediction)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"archetype {self.name!r}: kind must be one of {KINDS}")
        if not (self.max_speed > 0 and self.max_accel > 0 and self.body_radius > 0):
            raise ValueError(f"archetype {self.name!r}: speeds and radius must be positive")


_TALK = Behaviour(Policy.SEEK, radius=1.8, speed=0.35, then=Policy.FACE_TALK)

DEFAULT_ARCHETYPES: tuple[Archetype, ...] = (
    Archetype("barkeep", "civilian", 4.0, 6.0, Behaviour(Policy.IDLE)),
    Archetype("villager", "civilian", 4.5, 6.0, Behaviour(Policy.WANDER, reach=12.0, speed=0.25)),
    Archetype("merchant", "civilian", 4.0, 6.0, Behaviour(Policy.IDLE)),
    Archetype("guard", "guard", 5.0, 8.0, Behaviour(Policy.PATROL, speed=0.3)),
    Archetype(
        "vampire",
        "predator",
        7.0,
        12.0,
        Behaviour(Policy.STALK, target_player=True, radius=1.2, reach=40.0, speed=0.25),
    ),
    Archetype(
        "werewolf",
        "predator",
        8.5,
        14.0,
        Behaviour(Policy.STALK, target_player=True, radius=1.4, reach=50.0, speed=0.3),
        body_radius=0.45,
    ),
    Archetype(
        "zombie",
        "horde",
        1.6,
        3.0,
        Behaviour(Policy.HORDE, target_player=True, radius=0.9, reach=30.0, speed=0.8),
        talks=False,
    ),
    Archetype(
        "ghoul",
        "horde",
        3.0,
        5.0,
        Behaviour(Policy.HORDE, target_player=True, radius=0.9, reach=25.0, speed=0.8),
        talks=False,
    ),
    Archetype("lich", "caster", 2.5, 4.0, Behaviour(Policy.IDLE)),
)
"""The archetypes every controller knows; register more with `ArchetypeTable.register`."""

# (kind, intent) -> behaviour when the intent names a target. Missing pairs fall back to the
# archetype's default: a zombie does not trade, and `admin` never moves anyone.
_WITH_TARGET: dict[tuple[ArchetypeKind, str], Behaviour] = {
    ("civilian", "combat"): Behaviour(Policy.FLEE, radius=25.0, speed=0.8),
    ("guard", "combat"): Behaviour(Policy.SEEK, radius=1.5, speed=0.8, then=Policy.FACE_TALK),
    ("predator", "combat"): Behaviour(Policy.STALK, radius=1.2, speed=0.3),
    ("horde", "combat"): Behaviour(Policy.HORDE, radius=0.9, speed=1.0),
    ("caster", "combat"): Behaviour(Policy.SEEK, radius=10.0, speed=0.5, then=Policy.FACE_TALK),
    **{(kind, intent): _TALK for kind in KINDS if kind != "horde" for intent in TALK_INTENTS},
    **{
        (kind, "navigation"): Behaviour(Policy.SEEK, radius=1.0, speed=0.4)
        for kind in KINDS
        if kind != "horde"
    },
    ("horde", "navigation"): Behaviour(Policy.HORDE, radius=2.0, speed=0.6),
}

# Navigation toward someone means going along with them (an escort, a companion).
_WITH_BEING: dict[tuple[ArchetypeKind, str], Behaviour] = {
    (kind, "navigation"): Behaviour(Policy.FOLLOW, radius=2.5, speed=0.5)
    for kind in ("civilian", "guard", "predator", "caster")
}

# (kind, intent) -> behaviour when the intent names no target (or one the game does not know).
_WITHOUT_TARGET: dict[tuple[ArchetypeKind, str], Behaviour] = {
    # Combat with nobody named is combat with the player: the one foe every NPC can see.
    **{
        (kind, "combat"): Behaviour(
            rule.policy, True, rule.radius, rule.reach, rule.speed, rule.then
        )
        for (kind, intent), rule in _WITH_TARGET.items()
        if intent == "combat"
    },
    **{
        (kind, "chitchat"): Behaviour(Policy.WANDER, reach=12.0, speed=0.25)
        for kind in ("civilian", "guard", "caster")
    },
    **{
        (kind, intent): Behaviour(Policy.IDLE)
        for kind in ("civilian", "guard", "predator", "caster")
        for intent in ("trade", "quest", "hint")
    },
    **{
        (kind, "navigation"): Behaviour(Policy.PATROL, speed=0.3)
        for kind in ("civilian", "guard", "caster")
    },
}


def behaviour_for(
    archetype: Archetype, intent: str, urgency: float, target: TargetKind
) -> Behaviour | None:
    """The behaviour an intent asks of an archetype, or None when no rule covers the pair.

    None means "keep doing the default": the caller falls back to `archetype.default`.
    Urgency scales the cruise speed around the rule's speed (0.75x at 0, 1.25x at 1).
    """
    key = (archetype.kind, intent)
    if target == "none":
        rule = _WITHOUT_TARGET.get(key)
    else:
        rule = (_WITH_BEING.get(key) if target == "being" else None) or _WITH_TARGET.get(key)
    if rule is None:
        return None
    speed = min(1.0, max(0.05, rule.speed * (0.75 + 0.5 * urgency)))
    return Behaviour(rule.policy, rule.target_player, rule.radius, rule.reach, speed, rule.then)


class ArchetypeTable:
    """The archetypes a crowd knows, by small integer id (stored per NPC) and by name.

    Also keeps per-archetype NumPy columns of the default behaviours so that expiring many
    intents at once reverts their NPCs without a Python loop.
    """

    def __init__(self, archetypes: Iterable[Archetype] = DEFAULT_ARCHETYPES) -> None:
        self._by_id: list[Archetype] = []
        self._ids: dict[str, int] = {}
        for archetype in archetypes:
            self.register(archetype)

    def register(self, archetype: Archetype) -> int:
        """Add an archetype and return its id.

        Raises:
            ValueError: the name is taken, or the table is full (int16 ids).
        """
        if archetype.name in self._ids:
            raise ValueError(f"archetype {archetype.name!r} is already registered")
        if len(self._by_id) >= np.iinfo(np.int16).max:
            raise ValueError("too many archetypes")
        self._ids[archetype.name] = len(self._by_id)
        self._by_id.append(archetype)
        self._columns()
        return self._ids[archetype.name]

    def id_of(self, name: str) -> int:
        """The id of a registered archetype.

        Raises:
            ValueError: unknown name; the message lists the known ones.
        """
        try:
            return self._ids[name]
        except KeyError:
            raise ValueError(
                f"unknown archetype {name!r}; known: {', '.join(self._ids)} "
                "(register it with ArchetypeTable.register)"
            ) from None

    def __getitem__(self, archetype_id: int) -> Archetype:
        return self._by_id[archetype_id]

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Archetype]:
        return iter(self._by_id)

    @property
    def names(self) -> tuple[str, ...]:
        """Archetype names in id order."""
        return tuple(a.name for a in self._by_id)

    def _columns(self) -> None:
        defaults = [a.default for a in self._by_id]
        self.default_policy: NDArray[np.int8] = np.array(
            [d.policy for d in defaults], dtype=np.int8
        )
        self.default_player: NDArray[np.bool_] = np.array(
            [d.target_player for d in defaults], dtype=np.bool_
        )
        self.default_radius: NDArray[np.float32] = np.array(
            [d.radius for d in defaults], dtype=np.float32
        )
        self.default_reach: NDArray[np.float32] = np.array(
            [d.reach for d in defaults], dtype=np.float32
        )
        self.default_speed: NDArray[np.float32] = np.array(
            [d.speed for d in defaults], dtype=np.float32
        )
        self.default_then: NDArray[np.int8] = np.array(
            [NO_POLICY if d.then is None else d.then for d in defaults], dtype=np.int8
        )
        self.talks: NDArray[np.bool_] = np.array([a.talks for a in self._by_id], dtype=np.bool_)
