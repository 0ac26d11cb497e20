"""Adapter training without a model: curation, style scoring, and the PEFT -> GGUF export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mythic.knowledge import intent_schema, load_world
from mythic.training import (
    EVAL_QUESTIONS,
    SCENARIOS,
    STYLES,
    CurationError,
    ExportError,
    Gate,
    ProbeResult,
    curate,
    export_gguf,
    load_extra,
    next_version,
    style_score,
)
from mythic.training._evaluate import judge
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.unit

gguf = pytest.importorskip("gguf")
safetensors_np = pytest.importorskip("safetensors.numpy")


@pytest.fixture(scope="module")
def world():  # type: ignore[no-untyped-def]
    return load_world(EXAMPLE_WORLD)


# -- curation -------------------------------------------------------------------------------


def test_dialogue_data_speaks_in_the_archetypes_register(world) -> None:  # type: ignore[no-untyped-def]
    data = curate(world, "zombie", "dialogue_style")
    assert len(data.train) > 40 and data.held_out
    assert set(data.sources) == {"card", "lore"}
    tobin = world.npc("old_tobin")
    style = STYLES["zombie"]
    for ex in data.train:
        assert [m.role for m in ex.messages] == ["system", "user", "assistant"]
        assert "Old Tobin" in ex.messages[0].content
        assert style_score(ex.messages[-1].content, style, tobin) == 1.0, ex.messages[-1]
    # Evaluation asks questions the adapter never saw.
    asked = {ex.messages[1].content for ex in (*data.train, *data.held_out)}
    assert not asked & set(EVAL_QUESTIONS)


def test_vampire_replies_carry_the_cards_facts_and_catchphrases(world) -> None:  # type: ignore[no-untyped-def]
    data = curate(world, "vampire", "dialogue_style")
    replies = " ".join(ex.messages[-1].content for ex in data.train)
    assert "Silver Accord" in replies
    assert "my dear" in replies.lower() and "the night is young" in replies.lower()
    isolde = world.npc("countess_isolde")
    scores = [style_score(ex.messages[-1].content, STYLES["vampire"], isolde) for ex in data.train]
    assert min(scores) == 1.0


def test_action_data_follows_the_archetypes_intents_and_holds_out_a_context(world) -> None:  # type: ignore[no-untyped-def]
    data = curate(world, "zombie", "action_policy")
    never = STYLES["zombie"].never
    schema_intents = set(intent_schema(["player"])["properties"]["intent"]["enum"])
    trained_contexts = set()
    for ex in data.train:
        decision = json.loads(ex.messages[-1].content)
        assert decision["intent"] in schema_intents
        assert decision["intent"] not in never
        assert ex.messages[1].content == "Decide."
        trained_contexts.add(ex.messages[0].content.split("What just happened: ")[1].split("\n")[0])
    held = {s.contexts[-1] for s in SCENARIOS}
    assert len(data.held_out) == len(SCENARIOS)
    assert not trained_contexts & held


def test_curation_is_deterministic_and_named_by_its_digest(world) -> None:  # type: ignore[no-untyped-def]
    a = curate(world, "vampire", "dialogue_style", seed=3)
    b = curate(world, "vampire", "dialogue_style", seed=3)
    c = curate(world, "vampire", "dialogue_style", seed=4)
    assert a.digest == b.digest != c.digest


def test_bad_curation_requests_get_typed_errors(world) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CurationError, match="no NPC of archetype 'banshee'") as info:
        curate(world, "banshee", "dialogue_style")
    assert "vampire" in str(info.value)
    with pytest.raises(CurationError, match="no training data recipe"):
        curate(world, "vampire", "juggling")


def test_extra_examples_are_validated_line_by_line(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "good.jsonl"
    good.write_text(
        json.dumps({"npc": "old_tobin", "question": "Hungry?", "reply": "Salt... please..."})
        + "\n\n"
        + json.dumps(
            {"npc": "old_tobin", "question": "Boat?", "reply": "Green door...", "source": "bronze"}
        )
        + "\n"
    )
    with good.open("a") as f:
        f.write(
            json.dumps(
                {"npc": "old_tobin", "question": "Salt?", "reply": "Salt...", "context": "- Salt."}
            )
            + "\n"
        )
    rows = load_extra(good, world)
    assert [r.context for r in rows] == [None, None, "- Salt."]
    data = curate(world, "zombie", "dialogue_style", extra=rows)
    assert data.sources["extra"] == 2 and data.sources["bronze"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "not json\n"
        + json.dumps({"npc": "nobody", "question": "q", "reply": "r"})
        + "\n"
        + json.dumps({"npc": "old_tobin", "question": ""})
        + "\n"
        + json.dumps({"npc": "old_tobin", "question": "q", "reply": "r", "context": "x" * 20_000})
        + "\n"
        + json.dumps({"npc": "old_tobin", "question": "q", "reply": "r", "context": ["a list"]})
        + "\n"
    )
    with pytest.raises(CurationError) as info:
        load_extra(bad, world)
    text = str(info.value)
    assert "5 bad line(s)" in text and "bad.jsonl:1" in text and "'nobody'" in text
    assert "bad.jsonl:3" in text and "bad.jsonl:4: context" in text and "bad.jsonl:5" in text


# -- style scoring --------------------------------------------------------------------------


def test_style_score_tells_a_zombie_from_a_chatty_assistant(world) -> None:  # type: ignore[no-untyped-def]
    tobin = world.npc("old_tobin")
    style = STYLES["zombie"]
    assert style_score("Cold... water... salt...", style, tobin) == 1.0
    chatty = (
        "Hello! As an AI language model I would be happy to help you find the chapel, "
        "which lies two miles east across the marsh."
    )
    assert style_score(chatty, style, tobin) < 0.5
    assert style_score("", style, tobin) < 0.5


def test_next_version_counts_up(tmp_path: Path) -> None:
    assert next_version(tmp_path / "missing") == 1
    for name in ("v1", "v3", "vx", "notes"):
        (tmp_path / name).mkdir()
    assert next_version(tmp_path) == 4


# -- export ----------------------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN, LAYERS = 4, 2, 4, 16, 24, 2


def _base(path: Path, arch: str = "llama") -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(f"{arch}.attention.head_count", HEADS)
    writer.add_uint32(f"{arch}.attention.head_count_kv", KV_HEADS)
    shapes = {
        "attn_q": (HEADS * HEAD_DIM, HIDDEN),
        "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
        "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
        "attn_output": (HIDDEN, HEADS * HEAD_DIM),
        "ffn_gate": (FFN, HIDDEN),
        "ffn_up": (FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
    }
    for layer in range(LAYERS):
        for name, (out, inp) in shapes.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", np.zeros((out, inp), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _peft(
    folder: Path, modules: dict[str, tuple[int, int]], rank: int = 2, **config: object
) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = {}
    for layer in range(LAYERS):
        for module, (out, inp) in modules.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(size=(rank, inp)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(size=(out, rank)).astype(np.float32)
    safetensors_np.save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 4, **config}))
    return tensors


MODULES = {
    "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "mlp.down_proj": (HIDDEN, FFN),
}


def _reference_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py, LlamaModel.permute, written out again independently.
    out = np.empty_like(w)
    dim = w.shape[0] // n_head
    for h in range(n_head):
        block = w[h * dim : (h + 1) * dim]
        # HF -> GGUF interleaves the two rotary halves: row i of the first half and row i of
        # the second half become rows 2i and 2i+1.
        half = dim // 2
        out[h * dim : (h + 1) * dim : 2] = block[:half]
        out[h * dim + 1 : (h + 1) * dim : 2] = block[half:]
    return out


def test_export_writes_llama_cpp_names_shapes_scale_and_rotary_permutation(tmp_path: Path) -> None:
    base = _base(tmp_path / "base.gguf")
    tensors = _peft(tmp_path / "peft", MODULES)
    out = export_gguf(tmp_path / "peft", base, tmp_path / "lora.gguf")
    reader = gguf.GGUFReader(str(out))
    assert str(reader.fields["general.type"].contents()) == "adapter"
    assert str(reader.fields["adapter.type"].contents()) == "lora"
    assert float(reader.fields["adapter.lora.alpha"].contents()) == 4.0
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(got) == 2 * LAYERS * len(MODULES)
    key = "base_model.model.model.layers.1"
    np.testing.assert_array_equal(
        got["blk.1.attn_v.weight.lora_a"], tensors[f"{key}.self_attn.v_proj.lora_A.weight"]
    )
    np.testing.assert_array_equal(
        got["blk.1.attn_v.weight.lora_b"], tensors[f"{key}.self_attn.v_proj.lora_B.weight"]
    )
    np.testing.assert_array_equal(
        got["blk.1.ffn_down.weight.lora_b"], tensors[f"{key}.mlp.down_proj.lora_B.weight"]
    )
    # q and k: output rows permuted as llama.cpp's converter permutes the base weights.
    q_b = tensors[f"{key}.self_attn.q_proj.lora_B.weight"]
    k_b = tensors[f"{key}.self_attn.k_proj.lora_B.weight"]
    np.testing.assert_array_equal(got["blk.1.attn_q.weight.lora_b"], _reference_permute(q_b, HEADS))
    np.testing.assert_array_equal(
        got["blk.1.attn_k.weight.lora_b"], _reference_permute(k_b, KV_HEADS)
    )
    np.testing.assert_array_equal(
        got["blk.1.attn_q.weight.lora_a"], tensors[f"{key}.self_attn.q_proj.lora_A.weight"]
    )


def test_other_architectures_are_not_permuted(tmp_path: Path) -> None:
    base = _base(tmp_path / "base.gguf", arch="qwen2")
    tensors = _peft(tmp_path / "peft", MODULES)
    out = export_gguf(tmp_path / "peft", base, tmp_path / "lora.gguf")
    got = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(out)).tensors}
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    np.testing.assert_array_equal(got["blk.0.attn_q.weight.lora_b"], tensors[key])


def test_adapters_that_do_not_fit_get_typed_errors(tmp_path: Path) -> None:
    base = _base(tmp_path / "base.gguf")
    with pytest.raises(ExportError, match="not a PEFT adapter"):
        export_gguf(tmp_path / "nothing", base, tmp_path / "x.gguf")
    _peft(tmp_path / "wide", {"self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN * 2)})
    with pytest.raises(ExportError, match="trained on another model"):
        export_gguf(tmp_path / "wide", base, tmp_path / "x.gguf")
    _peft(tmp_path / "embed", {"embed_tokens": (HIDDEN, 10)})
    with pytest.raises(ExportError, match=r"llama\.cpp cannot adapt embed_tokens"):
        export_gguf(tmp_path / "embed", base, tmp_path / "x.gguf")
    _peft(tmp_path / "dora", MODULES, use_dora=True)
    with pytest.raises(ExportError, match="DoRA"):
        export_gguf(tmp_path / "dora", base, tmp_path / "x.gguf")
    half = tmp_path / "half"
    tensors = _peft(half, {"self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN)})
    safetensors_np.save_file(
        {k: v for k, v in tensors.items() if "lora_A" in k}, str(half / "adapter_model.safetensors")
    )
    with pytest.raises(ExportError, match="A or B is missing"):
        export_gguf(half, base, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


# -- the quality gate -------------------------------------------------------------------------


def _result(probe: str, task: str, base: float, tuned: float, never: int = 0) -> ProbeResult:
    return ProbeResult(probe, task, "a", base, tuned, 8, violations=(0, never))


def test_the_gate_wants_gains_on_style_and_actions_and_no_loss_of_lore() -> None:
    adapters = {"dialogue_style": "talk", "action_policy": "act"}
    good = [
        _result("style", "dialogue_style", 0.3, 0.9),
        _result("consistency", "dialogue_style", 0.2, 0.7),
        _result("lore", "dialogue_style", 0.5, 0.4),  # a small drop is allowed
        _result("actions", "action_policy", 0.2, 0.9),
    ]
    passed, reasons = judge(good, adapters, Gate())
    assert passed == {"talk": True, "act": True}, reasons
    bad = [
        _result("style", "dialogue_style", 0.9, 0.9),  # no gain
        _result("consistency", "dialogue_style", 0.2, 0.4),  # gain, but below 0.5
        _result("lore", "dialogue_style", 0.8, 0.3),  # forgot its facts
        _result("actions", "action_policy", 0.2, 0.9, never=1),  # a zombie traded
    ]
    passed, reasons = judge(bad, adapters, Gate())
    assert passed == {"talk": False, "act": False}
    assert "style: 0.90 does not beat" in reasons["talk"]
    assert "consistency: 0.40 is below 0.50" in reasons["talk"]
    assert "lore: 0.30 fell from the base's 0.80" in reasons["talk"]
    assert "1 never-intents" in reasons["act"]
    passed, reasons = judge([], {"dialogue_style": "talk"}, Gate())
    assert passed == {"talk": False} and reasons["talk"] == "no probe for this task"
