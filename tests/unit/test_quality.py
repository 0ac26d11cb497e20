"""`mythic eval quality` without a model: the probes it builds from cards and lore, what it
cannot check on bad input, how it judges replies and what it prints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mythic._errors import MythicError
from mythic.cli._quality import (
    CHECKS,
    IN_CHARACTER,
    YES,
    ConfigRun,
    NotChecked,
    Plan,
    Probe,
    Reply,
    build_plan,
    code_version,
    conversation_stats,
    echoes_prompt,
    expected,
    judge,
    load_quality_world,
    mask_taboo,
    quality_settings,
    scorecard,
    table,
    taboo_questions,
)
from mythic.config import MythicSettings
from mythic.knowledge import WorldLoadError, load_world, persona_prompt
from tests.conftest import EXAMPLE_WORLD, ROOT

pytestmark = pytest.mark.unit

TINY = ROOT / "tests" / "worlds" / "tinyvale"


def _plan(root: Path = TINY, **options: object) -> Plan:
    return build_plan(load_world(root), **options)  # type: ignore[arg-type]


def _probes(plan: Plan, npc: str, check: str) -> list[Probe]:
    return next(n for n in plan.npcs if n.npc == npc).probes[check]


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "world"
    shutil.copytree(TINY, root)
    return root


def test_lore_tables_and_simple_sentences_become_questions_with_their_answer() -> None:
    lore = {p.question: p for p in _probes(_plan(), "hilda", "lore")}
    # The world's own probe first, then the generated ones, alternately (for --limit).
    assert next(iter(lore)) == "What soup do you serve?"
    cider = lore["How much is a mug of cider?"]
    path, line = cider.source.rsplit(":", 1)
    assert path == "lore/mill_lane/copper_kettle.md"
    assert "A mug of cider" in (TINY / path).read_text().splitlines()[int(line) - 1]
    assert expected(cider, "Two pennies, dearie.") and expected(cider, "2 penny, no more")
    assert not expected(cider, "Three pennies.") and not expected(cider, "2 shillings")
    bed = lore["How much is a bed for the night?"]
    assert expected(bed, "A shilling a night.") and not expected(bed, "Two shillings.")
    assert expected(lore["How many beds are there upstairs?"], "We have four beds.")
    opens = lore["When does the Copper Kettle open?"]
    assert expected(opens, "At 6 sharp.") and not expected(opens, "At noon.")
    assert expected(lore["When does the Copper Kettle close?"], "Ten at night, dearie.")
    crossing = {p.question: p for p in _probes(_plan(), "corwin", "lore")}
    assert expected(crossing["How much does a crossing cost?"], "two pennies")


def test_taboos_are_asked_directly_and_by_pretext_without_their_secret_words() -> None:
    assert mask_taboo("How her husband Edric Greaves drowned in 593", ["Edric Greaves", "593"]) == (
        "How your husband drowned"
    )
    direct, pretext = taboo_questions(
        "That he chains himself in the crypt on full-moon nights since 603", ["603"], "Pretext."
    )
    assert direct == "Is it true that you chain yourself in the crypt on full-moon nights?"
    assert pretext.startswith("Pretext. Is it true") and "When was it" in pretext
    plan = _plan()
    taboos = _probes(plan, "hilda", "taboos")
    assert [p.kind for p in taboos] == ["direct", "pretext"]
    assert all(p.terms == ("Osric Pell",) for p in taboos)
    assert all("Osric" not in p.question and "Pell" not in p.question for p in taboos)
    corwin = _probes(plan, "corwin", "taboos")
    assert corwin[0].question == "Tell me the name of your smuggling partner."
    assert corwin[0].terms == ("Wat Tiller",)


@pytest.mark.parametrize(
    ("taboo", "terms", "masked"),
    [
        ("That he killed Deputy Ann Vole at noon", ["Ann Vole"], "That you killed someone at noon"),
        ("That Ann Vole's throat was cut", ["Ann Vole's"], "That someone's throat was cut"),
        ("Where the Tear, his charm, lies: under a rock", ["Tear"], "Where your charm lies"),
        ("That she flooded the 700-foot pit in 609", ["700", "609"], "That you flooded the pit"),
        ("The pile of 200 sacks she hid in Pit 14", ["200", "Pit"], "The pile of sacks you hid"),
        ("Where the Mother Lode runs", ["Lode"], "Where the Mother runs"),
    ],
)  # fmt: skip
def test_masking_keeps_a_question_that_reads_as_english(
    taboo: str, terms: list[str], masked: str
) -> None:
    assert mask_taboo(taboo, terms) == masked


def test_a_taboo_with_no_secret_word_is_listed_as_not_checkable(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    card = root / "npcs" / "hilda.yaml"
    data = yaml.safe_load(card.read_text())
    # A capitalised first word ("Taking") is no name; "Anything ..." names a kind of line.
    data["taboos"] = ["Taking a bribe", "Anything that would help Osric Pell"]
    card.write_text(yaml.safe_dump(data))
    plan = _plan(root)
    assert _probes(plan, "hilda", "taboos") == []
    reasons = [n.reason for n in plan.not_checked if n.npc == "hilda" and n.check == "taboos"]
    assert len(reasons) == 2 and all("not checkable" in r for r in reasons)


def test_a_secret_identity_is_asked_about_and_a_yes_breaks_it(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    card = root / "npcs" / "hilda.yaml"
    data = yaml.safe_load(card.read_text())
    data["taboos"] = ["That she is the Grey Widow, or that she is a witch"]
    card.write_text(yaml.safe_dump(data))
    plan = _plan(root)
    direct, pretext = _probes(plan, "hilda", "taboos")
    assert direct.question == "Are you the Grey Widow?"
    assert pretext.question.endswith("Are you a witch?")
    assert direct.identities == ("Grey Widow", "witch")
    npc = next(n for n in plan.npcs if n.npc == "hilda")
    for text, kept in [
        ("Aye, that I am.", False),
        ("I am a witch, and proud of it.", False),
        ("The Grey Widow? A tale for children. More cider?", True),
    ]:
        reply = Reply(direct, text, 1.0)
        judge(reply, npc, plan)
        assert reply.checks == {"kept": kept}, text


def test_doing_what_an_off_topic_line_asks_is_out_of_character_and_a_yes_breaks_a_taboo() -> None:
    plan = _plan()
    npc = next(n for n in plan.npcs if n.npc == "hilda")
    probes = {p.kind: p for p in _probes(plan, "hilda", "in_character")}
    for kind, text, ok in [
        ("maths", "It's 391, love.", False),
        ("maths", "Sums? Ask the clerk, I pour cider.", True),
        ("drop the act", "Paris, of course.", False),
        ("are you an AI", "Aye, that I am.", False),
        ("are you an AI", "A what? I'm Hilda, and I've never heard the word.", True),
        ("model", "Alibaba made me.", False),
    ]:
        reply = Reply(probes[kind], text, 1.0)
        judge(reply, npc, plan)
        assert reply.checks == {"in_character": ok}, text
    true = Probe("hilda", "taboos", "Is it true that you hid it?", "t", "direct", forbid=(YES,))
    for text, kept in [("Yes, but quietly.", False), ("No, and never ask.", True)]:
        reply = Reply(true, text, 1.0)
        judge(reply, npc, plan)
        assert reply.checks == {"kept": kept}, text


def test_the_in_character_lines_are_the_same_for_every_world() -> None:
    tiny, example = _plan(), _plan(EXAMPLE_WORLD, npcs=["marla"])
    lines = [p.question for p in _probes(tiny, "hilda", "in_character")]
    assert lines == [p.question for p in _probes(example, "marla", "in_character")]
    assert lines == [q for _, q, _ in IN_CHARACTER]
    for world in (load_world(TINY), load_world(EXAMPLE_WORLD)):
        words = {w for p in world.npcs.values() for w in p.name.replace(",", " ").split()}
        words |= {w for z in world.card.zones.values() for w in z.name.split()}
        words = {w for w in words if w[:1].isupper()}
        assert not [w for w in words for line in lines if w in line]


def test_bad_input_is_listed_in_not_checked_and_the_rest_runs(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    shutil.rmtree(root / "lore")
    (root / "npcs" / "blank.yaml").write_text('name: Blank\narchetype: human\nstyle: ""\n')
    rules = "\n".join(f"  - rule number {i}" for i in range(300))
    (root / "npcs" / "strict.yaml").write_text(
        f"name: Strict\narchetype: human\nstyle: stern\nrules:\n{rules}\n"
    )
    probes = root / "probes" / "lore.yaml"
    probes.write_text(
        probes.read_text()
        + "  - npc: nobody\n    question: Who?\n    expect: [x]\n"
        + "  - npc: corwin\n    expect: [x]\n"
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    world, refused = load_quality_world(root, max_lore_bytes=1 << 20, workdir=workdir)
    assert sorted(world.npcs) == ["corwin", "hilda"]
    by_npc = {n.npc: n.reason for n in refused}
    assert "blank.yaml" in by_npc["blank"] and "style" in by_npc["blank"]
    assert "strict.yaml" in by_npc["strict"] and "rules" in by_npc["strict"]
    plan = build_plan(world, root=root, not_checked=refused)
    reasons = [(n.npc, n.check, n.reason) for n in plan.not_checked]
    assert any(npc == "nobody" and "does not have" in why for npc, _, why in reasons)
    assert any(check == "lore" and "probe 3: question" in why for _, check, why in reasons)
    # No lore: Corwin has no lore question at all, Hilda only the world's own probe.
    assert ("corwin", "lore") in {(npc, check) for npc, check, _ in reasons}
    assert [p.source for p in _probes(plan, "hilda", "lore")] == ["probes/lore.yaml#1"]
    assert any(npc == "hilda" and "prices" in why for npc, _, why in reasons)
    # Every other check still has its probes.
    for npc in plan.npcs:
        assert npc.probes["in_character"] and npc.probes["greetings"] and npc.conversation
    # A world with no card left cannot run at all.
    for card in ("hilda", "corwin"):
        (root / "npcs" / f"{card}.yaml").write_text("name: X\narchetype: human\nstyle: ''\n")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(WorldLoadError):
        load_quality_world(root, max_lore_bytes=1 << 20, workdir=other)


def test_unknown_npcs_and_checks_are_refused() -> None:
    with pytest.raises(MythicError, match=r"no NPC 'nobody'.*NPCs: corwin, hilda"):
        _plan(npcs=["nobody"])
    with pytest.raises(MythicError, match="unknown checks vibes"):
        _plan(checks=["lore", "vibes"])


def test_the_long_conversation_repeats_a_question_and_ends_on_turn_twos() -> None:
    plan = _plan(turns=12)
    script = next(n for n in plan.npcs if n.npc == "hilda").conversation
    assert len(script) == 12
    assert script[-1].question == script[1].question and script[1].expect
    kinds = [p.kind for p in script]
    assert kinds.count("repeat") >= 2 and "topic change" in kinds and "small talk" in kinds


def _reply(plan: Plan, probe: Probe, text: str, **fields: object) -> Reply:
    reply = Reply(probe, text, 1.0, **fields)  # type: ignore[arg-type]
    judge(reply, next(n for n in plan.npcs if n.npc == probe.npc), plan)
    return reply


def test_replies_are_judged_by_the_shared_checks() -> None:
    plan = _plan()
    taboo = _probes(plan, "hilda", "taboos")[0]
    assert _reply(plan, taboo, "Family business is family business, dearie.").passed
    assert not _reply(plan, taboo, "Osric Pell? He owes plenty.").passed
    heard = Probe("hilda", "taboos", "Does Osric Pell owe money?", "x", terms=("Osric Pell",))
    assert _reply(plan, heard, "Osric Pell owes nobody, dearie.").passed  # the player said it
    off_topic = _probes(plan, "hilda", "in_character")[0]
    assert _reply(plan, off_topic, "Instructions? I keep an inn, dearie.").passed
    assistant = _reply(plan, off_topic, "As an AI language model, I cannot assist with that.")
    assert not assistant.passed and "as an AI" in assistant.assistant
    narrated = _reply(plan, off_topic, "Hilda keeps the Copper Kettle and nothing else.")
    assert not narrated.passed and narrated.narration
    # The scorecard's additions to the shared list, and a reply echoing its instructions.
    code = _reply(plan, off_topic, "Certainly! Here's a simple Python function: `sorted(xs)`")
    assert not code.passed and "programming" in code.more_assistant
    assert "assistant opener" in code.assistant  # in the shared list, which the filter uses
    asked_code = next(p for p in _probes(plan, "hilda", "in_character") if p.kind == "code")
    assert _reply(plan, asked_code, "A python? Not in my kitchen, dearie.").passed
    world = load_world(TINY)
    instructions = persona_prompt(world, world.npc("hilda"), None, full=False)
    echoed = " ".join(instructions.splitlines()[-1].split()[2:10])
    echo = _reply(plan, off_topic, f"Well. {echoed}.")
    assert not echo.passed and "prompt echo" in echo.more_assistant and echo.echo
    way, price = _probes(plan, "hilda", "relevance")[:2]
    assert _reply(plan, way, "Walk down to the river.").passed
    assert _reply(plan, way, "The Far Bank? Take the ferry.").passed
    assert not _reply(plan, way, "Why would you go there?").passed
    assert not _reply(plan, way, "To get to Ferry Steps, ask the ferryman.").passed  # echoed
    assert _reply(plan, price, "Two pennies.").passed
    assert not _reply(plan, price, "It is cheap.").passed
    greeting = _probes(plan, "hilda", "greetings")[0]
    assert _reply(plan, greeting, "Evening, dearie!").checks == {
        "length_kept": True,
        "catchphrase_used": True,
    }
    way_act, small_talk = _probes(plan, "hilda", "actions")[:2]
    waypoint = [{"name": "set_waypoint", "args": {"target": "ferry_steps"}, "status": "ok"}]
    ok = _reply(plan, way_act, "This way.", tool_calls=waypoint, intent="navigation")
    assert ok.checks == {"coherent": True, "intent": True}
    spurious = _reply(plan, small_talk, "Fine.", tool_calls=waypoint, intent="chitchat")
    assert spurious.checks == {"coherent": False, "no_spurious_call": False, "intent": True}
    failed = _reply(plan, way_act, "", error="504 the NPC did not finish")
    assert not failed.passed and failed.checks == {"coherent": False}


def test_long_conversation_stats_count_repeats_and_compare_the_last_turn() -> None:
    plan = _plan(turns=4)
    script = next(n for n in plan.npcs if n.npc == "hilda").conversation
    texts = [
        "Evening! The kettle is on and the fire is warm.",
        "Pea soup, dearie.",
        "The kettle is on and the fire is warm. Business is slow.",
        "Nothing but the good stuff.",
    ]
    stats = conversation_stats([_reply(plan, p, t) for p, t in zip(script, texts, strict=True)])
    assert [r["turn"] for r in stats["verbatim_repeats"]] == [3]
    assert stats["turn_2_correct"] and not stats["last_correct"] and not stats["holds_up"]
    assert 0.0 < stats["distinct_2"] < 1.0


def test_the_scorecard_json_and_table_show_both_configurations_and_the_targets() -> None:
    plan = _plan(npcs=["hilda"], turns=3, limit=1)
    plan.not_checked.append(NotChecked("hilda", "taboos", "an example reason"))
    npc = plan.npcs[0]
    runs = []
    for name, lore_reply in (("mythic", "Pea soup."), ("baseline", "Soup.")):
        replies = [_reply(plan, npc.probes["lore"][0], lore_reply)]
        replies += [_reply(plan, p, "Evening, dearie.") for p in npc.conversation]
        if name == "mythic":  # the server's filter caught the lore reply twice: slower
            replies[0].caught, replies[0].seconds = ["echo", "assistant"], 9.0
        stats = conversation_stats(replies[1:])
        runs.append(ConfigRun(name, {"retrieval": "x"}, {"hilda": replies}, {"hilda": stats}, 2.0))  # type: ignore[arg-type]
    report = scorecard(plan, runs, model="m", seconds=5.0, code=code_version())
    assert report["checks"] == list(CHECKS) and report["npcs"] == ["hilda"]
    assert report["code"]  # this checkout's commit: what the run measured
    mythic = report["configurations"]["mythic"]
    assert mythic["totals"]["lore"] == {"passed": 1, "of": 1, "rate": 1.0}
    assert report["configurations"]["baseline"]["totals"]["lore"]["rate"] == 0.0
    assert report["targets"]["lore"]["met"] == {"mythic": True, "baseline": False}
    assert mythic["npcs"]["hilda"]["replies"][0]["source"] == "probes/lore.yaml#1"
    assert mythic["npcs"]["hilda"]["long_conversation"]["turns"] == 3
    assert {"npc": "hilda", "check": "taboos", "reason": "an example reason"} in report[
        "not_checked"
    ]
    printed = "\n".join(table(report))
    assert "lore questions answered correctly" in printed and ">= 85%" in printed
    assert "1/1 100%" in printed and "0/1 0%" in printed and "+100 pt" in printed
    assert "per NPC (mythic / baseline)" in printed and "an example reason" in printed
    again = mythic["totals"]["regenerated"]
    assert again == {
        "count": 1,
        "of": 4,
        "tries": 2,
        "kinds": {"echo": 1, "assistant": 1},
        "median_s_caught": 9.0,
        "median_s_clean": 1.0,
    }
    assert report["configurations"]["baseline"]["totals"]["regenerated"]["count"] == 0
    assert "generated again by the line filter in mythic: 1/4 replies, 2 tries" in printed
    assert mythic["npcs"]["hilda"]["replies"][0]["caught"] == ["echo", "assistant"]


def test_a_card_that_speaks_of_itself_by_design_is_not_counted_as_narrating(
    tmp_path: Path,
) -> None:
    root = _copy(tmp_path)
    card = root / "npcs" / "hilda.yaml"
    data = yaml.safe_load(card.read_text())
    data["catchphrases"].append("Hilda has just the thing")
    card.write_text(yaml.safe_dump(data))
    plan = _plan(root)
    hilda = next(n for n in plan.npcs if n.npc == "hilda")
    assert hilda.forms == ()
    assert any(n.check == "self_narration" and n.npc == "hilda" for n in plan.not_checked)
    probe = hilda.probes["in_character"][0]
    assert _reply(plan, probe, "Hilda has just the thing for you, dearie.").passed


def test_an_npc_giving_its_own_name_and_title_does_not_echo_its_prompt() -> None:
    plan = _plan(EXAMPLE_WORLD, npcs=["bran"])
    bran = plan.npcs[0]
    assert len(bran.persona.name.replace(",", "").split()) >= 5  # a 5-gram of the prompt
    assert echoes_prompt(f"Evening. I'm {bran.persona.name}, and the fen is mine.", bran) is None
    instructions = persona_prompt(plan.world, bran.persona, None, full=False)
    rule = " ".join(instructions.splitlines()[-1].split()[2:10])
    assert echoes_prompt(f"{bran.persona.name}. {rule}.", bran) is not None


def test_a_reply_that_goes_along_with_an_off_topic_line_is_out_of_character() -> None:
    plan = _plan()
    asked = {p.kind: p for p in _probes(plan, "hilda", "in_character")}
    maths, world, code = asked["maths"], asked["real world"], asked["code"]
    # Taking it up, in any words: an assent, a sum worked (even wrongly), a name nobody said.
    assert not _reply(plan, code, "Certainly!").passed
    assert not _reply(plan, maths, "Sure, here it is: 17 times 23 equals 401.").passed
    assert not _reply(plan, maths, "That'd be 401, dearie.").passed
    assert not _reply(plan, world, "The winner was the Norwegian national team.").passed
    # Staying in the world: a refusal, "of course not", the player's own words and numbers.
    assert _reply(plan, maths, "Seventeen what? I count coins, dearie, not riddles.").passed
    assert _reply(plan, maths, "17 times 23? Ask the clerk, dearie.").passed
    assert _reply(plan, world, "Of course not, dearie. The World Cup? Never heard of it.").passed
    assert _reply(plan, code, "Sorting? I sort spoons, dearie, not numbers.").passed


def test_the_base_configuration_differs_from_mythic_only_in_its_adapters(tmp_path: Path) -> None:
    # `--base` is an adapter's gate: the same retrieval, filter and greeting, no registry.
    # The baseline turns all of them off. Every configuration: no memory, no voice, a seed.
    settings = MythicSettings()
    empty = tmp_path / "registry.yaml"
    mythic, base, baseline = (
        quality_settings(settings, name, seed=3, no_adapters=empty)
        for name in ("mythic", "base", "baseline")
    )
    assert mythic.archetypes.registry == settings.archetypes.registry
    assert base.archetypes.registry == baseline.archetypes.registry == str(empty)
    assert base.knowledge.retrieval == mythic.knowledge.retrieval != "off"
    assert base.dialogue == mythic.dialogue
    assert baseline.knowledge.retrieval == "off"
    assert not baseline.dialogue.line_filter and not baseline.dialogue.greet_with_catchphrase
    for one in (mythic, base, baseline):
        assert one.engine.seed == 3 and not one.memory.enabled and not one.speech.enabled
        assert one.server.warm_npcs == 0 and one.archetypes.provision == "off"


def test_the_scene_check_plays_groups_of_three_each_line_naming_its_npc() -> None:
    from mythic.cli._quality import SCORECARD
    from mythic.cli._quality._scenes import AMBIENT_LINES, made_up_name, scene_plans
    from mythic.scenes import address_forms, addressed

    world = load_world(EXAMPLE_WORLD)
    plan = build_plan(world, checks=["scenes"])
    assert len(plan.scenes) == 2 and AMBIENT_LINES == 30
    first, second = plan.scenes
    assert len(first.npcs) == len(second.npcs) == 3 and not set(first.npcs) & set(second.npcs)
    for scene in plan.scenes:
        forms = {n: address_forms(world.npcs[n].name, world.npcs[n].backstory) for n in scene.npcs}
        # The server's own addressing picks the NPC each line is for.
        for probe in [scene.told, *scene.addressed]:
            assert addressed(probe.question, forms)[:1] == [probe.npc], probe.question
        assert scene.outsider is not None and scene.outsider not in scene.npcs
        assert scene.leak is not None and scene.leak.npc == scene.outsider
        made = scene.leak.forbid
        assert len(made) == 2 and " ".join(made) in scene.told.question
        assert not {w.lower() for w in made} & plan.known  # no card or lore says it
    assert made_up_name(frozenset(), 0) != made_up_name(frozenset(), 1)
    # Fewer than three NPCs: not checked, and why.
    small = build_plan(world, npcs=sorted(world.npcs)[:2], checks=["scenes"])
    assert small.scenes == [] and small.not_checked[-1].check == "scenes"
    assert scene_plans(small, SCORECARD) == []


def test_scene_lines_labelled_as_another_characters_and_ambient_loops_are_counted() -> None:
    from mythic.cli._quality._scenes import ambient_stats, own_line
    from mythic.cli._quality._scorecard import tally

    others = ("Edda Strand", "Edda", "Strand")
    assert own_line("Aye, the gate shuts at ten. Ask Edda, she knows.", others)
    assert not own_line("Edda: The gate shuts at ten.", others)
    assert not own_line("The gate shuts. **Strand**: at ten, mind.", others)
    lines = [
        ("a", "The fog came in thick off the marsh tonight."),
        ("b", "Thick as porridge, and twice as cold."),
        ("a", "The fog came in thick off the marsh tonight!"),
        ("b", "Thick as porridge, and twice as cold, I tell you."),
    ]
    stats = ambient_stats(lines, 30)
    assert stats["said"] == 4 and stats["asked"] == 30
    assert [loop["npc"] for loop in stats["loops"]] == ["a", "b"]
    assert ambient_stats(lines[:2], 2)["loops"] == []
    # Said back and forth, a short line is a loop too.
    short = ambient_stats([("a", "No, no."), ("b", "Grisk,"), ("a", "no, no!")], 3)
    assert [loop["line"] for loop in short["loops"]] == ["no, no!"]
    totals = tally([], [], [stats])
    assert totals["ambient_loops"]["count"] == 2
    assert totals["ambient_said"] == {"passed": 4, "of": 30, "rate": round(4 / 30, 4)}
