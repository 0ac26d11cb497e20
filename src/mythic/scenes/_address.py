"""Who a line speaks to: the NPCs of a scene it names."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from mythic.dialogue import name_forms

_TITLES = frozenset(
    """
    captain father mother sister brother lord lady count countess duke duchess baron baroness
    sir dame magister master mistress doctor sheriff mayor marshal deputy judge reverend
    preacher elder
    """.split()  # noqa: SIM905 - a word list reads better as words
)
"""Titles that address one NPC when only one in the scene has it ("Captain, ..."); not "old",
"the", "young": they are ordinary words too."""


def address_forms(name: str, backstory: str | None = None) -> tuple[str, ...]:
    """The ways a line may name an NPC: its name's forms (`name_forms`: "Marla", "the
    Barkeep", "Edda", "Strand") and its title ("Captain")."""
    short = name.partition(",")[0]
    titles = [w for w in re.findall(r"[\w']+", short) if w.lower() in _TITLES]
    return tuple(dict.fromkeys([*name_forms(name, backstory), *titles]))


def addressed(text: str, forms: Mapping[str, Sequence[str]]) -> list[str]:
    """The NPCs `text` names, in the order it first names them. A form two of them share
    ("Captain" of two captains) names neither; matching ignores case, on word boundaries."""
    counts = Counter(f.lower() for fs in forms.values() for f in set(map(str.lower, fs)))
    first: dict[str, int] = {}
    for npc_id, npc_forms in forms.items():
        for form in npc_forms:
            if counts[form.lower()] > 1:
                continue
            match = re.search(rf"(?<![\w']){re.escape(form)}(?![\w'])", text, re.IGNORECASE)
            if match is not None:
                first[npc_id] = min(first.get(npc_id, match.start()), match.start())
    return sorted(first, key=lambda npc_id: first[npc_id])
