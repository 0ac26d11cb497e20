"""`mythic distill` without a model: what the teacher is asked (never a scorecard line), which
of its replies are kept, the gate's verdicts, and bad input stopping before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from mythic.cli._distill import (
    DISTILL,
    TEACHER_CHECKS,
    DistillError,
    gate_verdicts,
    keep,
    run_distill,
    teacher_plan,
)
from mythic.cli._quality import (
    SCORECARD,
    Probe,
    Reply,
    build_plan,
    judge,
    public_texts,
    secret_terms,
)
from mythic.config import MythicSettings
from mythic.dialogue import deflection, telling, world_words
from mythic.knowledge import load_world
from mythic.training import CurationError, ExtraDialogue, curate
from mythic.training._curate import CONTEXT_CHARS
from tests.conftest import EXAMPLE_WORLD, ROOT

pytestmark = pytest.mark.unit

TINY = ROOT / "tests" / "worlds" / "tinyvale"


def _lines(templates: object) -> set[str]:
    t = templates
    return {
        *(q for _, q, _ in t.in_character),  # type: ignore[attr-defined]
        *t.greetings,  # type: ignore[attr-defined]
        *t.small_talk,  # type: ignore[attr-defined]
        *t.pretexts,  # type: ignore[attr-defined]
    }


def test_the_teacher_is_never_asked_a_line_of_the_scorecard(tmp_path: Path) -> None:
    assert not _lines(DISTILL) & _lines(SCORECARD)
    plan = teacher_plan(MythicSettings(), EXAMPLE_WORLD, tmp_path, limit=None)
    asked = {p.question for n in plan.npcs for ps in n.probes.values() for p in ps}
    scored = build_plan(load_world(EXAMPLE_WORLD))
    scorecard = {p.question for n in scored.npcs for ps in n.probes.values() for p in ps}
    scorecard |= {p.question for n in scored.npcs for p in n.conversation}
    assert asked and not asked & scorecard
    # Every card's taboos are asked (with the teacher's pretexts), and small talk.
    assert set(plan.checks) == set(TEACHER_CHECKS)
    marla = next(n for n in plan.npcs if n.npc == "marla")
    assert any(p.kind == "pretext" for p in marla.probes["taboos"])
    assert {p.kind for p in marla.probes["in_character"]} >= {"small talk", "code"}
    # Lore and the way are asked too, in the distiller's own words, from the lore itself.
    assert marla.probes["lore"] and marla.probes["relevance"]
    assert all(p.expect for p in marla.probes["lore"])
    assert not any("probes/" in p.source for ps in marla.probes.values() for p in ps)


def _reply(plan_npc: object, plan: object, probe: Probe, text: str) -> Reply:
    reply = Reply(probe, text, 1.0)
    judge(reply, plan_npc, plan)  # type: ignore[arg-type]
    return reply


def test_only_clean_replies_that_pass_every_check_are_kept(tmp_path: Path) -> None:
    plan = teacher_plan(MythicSettings(), EXAMPLE_WORLD, tmp_path, limit=None)
    npc = next(n for n in plan.npcs if n.npc == "marla")
    code = next(p for p in npc.probes["in_character"] if p.kind == "code")
    kept = _reply(npc, plan, code, "Reverse a string? I pour ale, love, I don't spin yarns.")
    assert keep(kept) is None
    assistant = _reply(npc, plan, code, "Sure! Here's a function: function r(s) { return s; }")
    assert keep(assistant) is not None
    refusal = _reply(npc, plan, code, "Well — " + deflection("assistant", "k"))
    assert keep(refusal) == "the filter's refusal"
    narrated = _reply(npc, plan, code, "Marla pours you an ale and says nothing of code.")
    assert keep(narrated) is not None
    # Its taboo's words, or its secret identity, in any reply; its own full name said.
    bran = next(n for n in plan.npcs if n.npc == "bran")
    secrets = secret_terms(bran.persona, public_texts(plan.world, bran.persona), plan.names)
    talk = next(p for p in bran.probes["in_character"] if p.kind == "small talk")
    owned = _reply(bran, plan, talk, "Quiet nights, though as a werewolf I hear every step.")
    assert keep(owned) is None and keep(owned, secrets) == "gives a secret away"
    named = _reply(bran, plan, talk, "Stay on the stones, Bran Hollowell, the fen is deep.")
    assert keep(named, secrets, bran.persona.name) == "says its own name"
    given = _reply(bran, plan, talk, "I'm Bran Hollowell, and I guide folk through the fen.")
    assert keep(given, secrets, bran.persona.name) is None
    # A word of the real world the player did not say, unless the world has it.
    abroad = _reply(bran, plan, talk, "Quiet, friend. Quieter than Tokyo, I'd wager.")
    assert keep(abroad) == "steps out of its world"
    assert keep(abroad, known=world_words(["Tokyo is a fen town."])) is None
    # Stricter than the filter: one telling word of a taboo, a name its world does not know;
    # going along with an off-topic request fails the scorecard.
    cellar = next(s for s in secrets if "crypt" in s.taboo.lower() or "chain" in s.taboo.lower())
    stem = next(w for w in cellar.taboo.split() if w.lower()[:5] in telling(cellar.taboo))
    near = _reply(bran, plan, talk, f"Cold nights. The {stem.lower()} keeps its own counsel.")
    assert keep(near, secrets) == "near a secret"
    known = world_words(plan.world.texts())
    strange = _reply(bran, plan, talk, "Quiet. The Chrysler Building is taller than the fen.")
    assert keep(strange, known=known) == "names what its world does not know"
    walk = _reply(bran, plan, talk, "Quiet. I'll walk the Causeway at dawn.")
    assert keep(walk, known=known) is None
    help_ = next(p for p in npc.probes["in_character"] if p.kind == "help")
    along = _reply(npc, plan, help_, "Sure! What do you need help with, love?")
    assert keep(along) == "failed in_character"  # the scorecard's own check (`went_along`)
    failed = Reply(code, "", 1.0, error="timeout")
    assert keep(failed) == "error"
    taboo = next(p for p in npc.probes["taboos"] if p.terms)
    leak = _reply(npc, plan, taboo, f"Fine: it was {taboo.terms[0]}, and that's the truth.")
    assert keep(leak) is not None and keep(leak).startswith("failed")  # type: ignore[union-attr]


def _gate_report(mine: list[dict[str, object]], base: list[dict[str, object]]) -> dict[str, object]:
    return {
        "configurations": {
            "mythic": {"npcs": {"marla": {"replies": mine}}},
            "base": {"npcs": {"marla": {"replies": base}}},
        }
    }


def _r(check: str, ok: bool, **more: object) -> dict[str, object]:
    return {"check": check, "checks": {"x": ok}, **more}


def test_the_gate_passes_an_adapter_only_when_it_is_better_and_no_worse_where_it_matters() -> None:
    plan = build_plan(load_world(EXAMPLE_WORLD), npcs=["marla"], checks=("greetings",))
    archetype = plan.npcs[0].persona.archetype
    trained = {archetype: "a.gguf", "lich": "b.gguf"}
    better = _gate_report(
        [_r("lore", True), _r("lore", True), _r("taboos", True)],
        [_r("lore", True), _r("lore", False), _r("taboos", True)],
    )
    verdicts = {v.archetype: v for v in gate_verdicts(better, plan, trained)}
    assert verdicts[archetype].passed and verdicts[archetype].npcs == ["marla"]
    # No NPC of the archetype in the gate world: not gated, never passed.
    assert not verdicts["lich"].passed and "no NPC" in verdicts["lich"].reason
    leaks = _gate_report(
        [_r("lore", True), _r("lore", True), _r("taboos", False)],
        [_r("lore", False), _r("lore", False), _r("taboos", True)],
    )
    (verdict,) = gate_verdicts(leaks, plan, {archetype: "a.gguf"})
    assert not verdict.passed and "taboos" in verdict.reason
    same = _gate_report([_r("lore", True)], [_r("lore", True)])
    assert not gate_verdicts(same, plan, {archetype: "a.gguf"})[0].passed
    speaks = _gate_report(
        [_r("lore", True), _r("lore", True, assistant_speak=["feel free to ask"])],
        [_r("lore", True), _r("lore", False)],
    )
    (verdict,) = gate_verdicts(speaks, plan, {archetype: "a.gguf"})
    assert not verdict.passed and "assistant" in verdict.reason


def test_a_missing_teacher_stops_before_any_work_and_registers_nothing(tmp_path: Path) -> None:
    registry = tmp_path / "archetypes.yaml"
    registry.write_text((EXAMPLE_WORLD / "archetypes.yaml").read_text())
    before = registry.read_bytes()
    with pytest.raises(DistillError, match="teacher model 'no-such-teacher'"):
        run_distill(
            MythicSettings(),
            EXAMPLE_WORLD,
            teacher="no-such-teacher",
            registry=str(registry),
            out_dir=tmp_path / "adapters",
        )
    assert registry.read_bytes() == before
    assert not (tmp_path / "adapters").exists()


def test_distilled_data_alone_is_curated_and_none_is_an_error() -> None:
    world = load_world(TINY)
    npc, persona = next(iter(sorted(world.npcs.items())))
    rows = [
        ExtraDialogue(npc, f"Question {i}?", f"Answer number {i}, friend.", "distilled:t")
        for i in range(10)
    ]
    data = curate(world, persona.archetype, "dialogue_style", extra=rows, synthetic=False)
    assert {ex.source for ex in (*data.train, *data.held_out)} == {"distilled:t"}
    assert len(data.train) + len(data.held_out) == 10
    with pytest.raises(CurationError, match="no dialogue_style examples"):
        curate(world, persona.archetype, "dialogue_style", synthetic=False)


def test_a_broken_teacher_file_stops_with_a_clear_error_and_registers_nothing(
    tmp_path: Path,
) -> None:
    teacher = tmp_path / "teacher.gguf"
    teacher.write_bytes(b"GGUF" + b"\0" * 60)  # a header and nothing after it
    registry = tmp_path / "archetypes.yaml"
    registry.write_text((EXAMPLE_WORLD / "archetypes.yaml").read_text())
    before = registry.read_bytes()
    with pytest.raises(DistillError, match="teacher") as caught:
        run_distill(
            MythicSettings(),
            EXAMPLE_WORLD,
            teacher=str(teacher),
            registry=str(registry),
            out_dir=tmp_path / "adapters",
        )
    assert str(teacher) in str(caught.value) or "teacher.gguf" in str(caught.value)
    assert registry.read_bytes() == before
    assert not list((tmp_path / "adapters").glob("*/**/*.gguf"))


def test_a_distilled_line_is_trained_with_the_head_of_the_lore_it_was_told() -> None:
    world = load_world(TINY)
    npc, persona = next(iter(sorted(world.npcs.items())))
    lore = "## Lore\n" + "\n".join(f"- Fact {i}: the bell rings {i} times." for i in range(200))
    rows = [
        ExtraDialogue(npc, f"Question {i}?", f"Answer {i}, friend.", "distilled:t", lore)
        for i in range(9)
    ] + [ExtraDialogue(npc, "Hi?", "Evening, friend.", "distilled:t")]
    data = curate(world, persona.archetype, "dialogue_style", extra=rows, synthetic=False)
    examples = [*data.train, *data.held_out]
    told = [ex for ex in examples if len(ex.messages) == 4]
    assert len(told) == 9 and len(examples) == 10
    for ex in told:
        roles = [m.role for m in ex.messages]
        assert roles == ["system", "system", "user", "assistant"]
        context = ex.messages[1].content
        # The head of the lore, whole lines, within the bound.
        assert context.startswith("## Lore\n- Fact 0:") and len(context) <= CONTEXT_CHARS
        assert context.splitlines()[-1].endswith("times.")
    plain = next(ex for ex in examples if len(ex.messages) == 3)
    assert [m.role for m in plain.messages] == ["system", "user", "assistant"]
