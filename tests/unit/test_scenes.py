"""Who a scene's line names (`mythic.scenes.addressed`), on the example worlds' cards."""

from __future__ import annotations

import pytest

from mythic.knowledge import load_world
from mythic.scenes import address_forms, addressed
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.unit

NPCS = ("marla", "captain_strand", "countess_isolde", "old_tobin", "father_anselm")


@pytest.fixture(scope="module")
def forms() -> dict[str, tuple[str, ...]]:
    world = load_world(EXAMPLE_WORLD)
    return {n: address_forms(world.npcs[n].name, world.npcs[n].backstory) for n in NPCS}


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("Marla, another ale.", ["marla"]),
        ("marla, another ale.", ["marla"]),  # players type in lower case
        ("Barkeep, another ale!", ["marla"]),  # the epithet after the comma
        ("Captain, is the curfew at the tenth bell?", ["captain_strand"]),  # a title
        ("What do you say, Strand?", ["captain_strand"]),
        ("Countess Isolde, Father Anselm says hello.", ["countess_isolde", "father_anselm"]),
        ("Tobin!", ["old_tobin"]),
        ("Is the old mill haunted?", []),  # "old" is a word, not Old Tobin
        ("Is it true what they say?", []),
        ("Marlaena is not her name.", []),  # whole words only
    ],
)
def test_a_line_names_the_npcs_it_addresses_in_order(
    forms: dict[str, tuple[str, ...]], line: str, named: list[str]
) -> None:
    assert addressed(line, forms) == named


def test_a_form_two_npcs_share_names_neither() -> None:
    forms = {
        "a": address_forms("Captain Edda Strand"),
        "b": address_forms("Captain Rowan Pike"),
    }
    assert addressed("Captain, a word.", forms) == []
    assert addressed("Captain Pike, a word.", forms) == ["b"]
