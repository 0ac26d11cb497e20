"""The planner: memory math from model shapes, chain placement, the scaling calculator."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
import typer
from typer.testing import CliRunner

from mythic._errors import MythicError
from mythic.capacity import (
    ACTIVATION_TIERS,
    DEVICES,
    KV_DTYPES,
    LORA_TARGETS,
    MODELS,
    QUANTS,
    ActivationTier,
    ChainFootprint,
    ChainTooLargeError,
    PlanError,
    ServerThroughput,
    UnknownPresetError,
    device_preset,
    kv_bytes_per_token,
    lora_bytes,
    lora_params,
    memory_budget,
    pack_chains,
    roofline,
    scale,
    uniform_tier,
    weight_bytes,
)
from mythic.capacity._design import design_examples
from mythic.cli import _plan as plan_cli

pytestmark = pytest.mark.unit

DESIGN_SERVER = ServerThroughput(inferences_per_s=50)


# -- shapes and sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("smollm2-135m", 134.5e6),
        ("qwen2.5-0.5b", 494.0e6),
        ("qwen2.5-3b", 3.09e9),
        ("qwen2.5-7b", 7.62e9),
        ("llama-3.1-8b", 8.03e9),
        ("llama-3.1-70b", 70.55e9),
    ],
)
def test_parameter_count_from_the_shape_matches_the_model_card(name: str, published: float) -> None:
    assert MODELS[name].params == pytest.approx(published, rel=0.005)


def test_lora_size_is_rank_times_in_plus_out_of_each_targeted_matrix() -> None:
    # llama-3.1-8b, rank 16 on q, k, v, o: q and o are 4096 -> 4096, k and v 4096 -> 1024.
    per_layer = (4096 + 4096) + (4096 + 1024) * 2 + (4096 + 4096)
    assert lora_params("llama-3.1-8b", 16) == 16 * per_layer * 32 == 13_631_488
    assert lora_bytes("llama-3.1-8b", 16) == 27_262_976  # f16: 27 MB, not the design's 200
    assert lora_bytes("llama-3.1-8b", 16, dtype="f32") == 2 * 27_262_976
    assert lora_bytes("llama-3.1-8b", 32) == 2 * lora_bytes("llama-3.1-8b", 16)
    # smollm2-135m, rank 8 on all seven projections (576 hidden, 192 KV, 1536 MLP).
    all_seven = (576 + 576) * 2 + (576 + 192) * 2 + (576 + 1536) * 3
    assert lora_params("smollm2-135m", 8, LORA_TARGETS) == 8 * all_seven * 30
    assert lora_bytes("smollm2-135m", 8, LORA_TARGETS, "q8_0") == round(
        8 * all_seven * 30 * 8.5 / 8
    )


def test_kv_per_token_is_two_times_layers_kv_heads_head_dim_bytes() -> None:
    assert kv_bytes_per_token("llama-3.1-8b") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token("llama-3.1-70b") == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token("llama-3.1-8b", "q8_0") == 2 * 32 * 8 * 128 * 34 // 32
    assert kv_bytes_per_token("qwen2.5-0.5b", "fp8") == 2 * 24 * 2 * 64


def test_a_70b_at_4_bits_is_about_40_gb_not_21() -> None:
    assert weight_bytes("llama-3.1-70b", "q4_0") == round(70_553_706_496 * 4.5 / 8)
    assert 39e9 < weight_bytes("llama-3.1-70b", "nf4") < 40e9  # embeddings stay f16
    assert 42e9 < weight_bytes("llama-3.1-70b", "q4_k_m") < 43.5e9
    assert 4.8e9 < weight_bytes("llama-3.1-8b", "q4_k_m") < 5e9  # the design's "7B = 14 GB"
    assert weight_bytes("llama-3.1-8b", "f16") == 2 * MODELS["llama-3.1-8b"].params


def test_memory_budget_adds_up_to_hand_computed_parts() -> None:
    b = memory_budget(
        "llama-3.1-8b", "q4_k_m", "a10g", adapters=35, rank=16, sequences=10, context=4096
    )
    capacity = 23028 * 1024**2
    weights = round(8_030_261_248 * 4.85 / 8)
    adapters = 35 * 27_262_976
    kv = 10 * 4096 * 131_072
    compute = 512 * (128_256 + 4 * 4096 + 2 * 14_336) * 4
    runtime = 1024**3 // 2
    reserved = round(capacity * 0.10)
    used = weights + adapters + kv + compute + runtime + reserved
    assert (b.weights_bytes, b.adapters_bytes, b.kv_bytes) == (weights, adapters, kv)
    assert (b.compute_bytes, b.runtime_bytes, b.reserved_bytes) == (compute, runtime, reserved)
    assert b.kv_sequence_bytes == 4096 * 131_072 == 512 * 1024**2
    assert b.used_bytes == used
    assert b.free_bytes == capacity - used
    assert b.fits
    assert b.max_sequences == (capacity - used + kv) // (4096 * 131_072)
    too_many = memory_budget("llama-3.1-8b", adapters=35, sequences=b.max_sequences + 1)
    assert not too_many.fits
    assert too_many.free_bytes < 0


def test_cpu_servers_are_sized_by_ram() -> None:
    assert device_preset("cpu").memory_gib == 32
    assert device_preset("cpu-64").memory_bytes == 64 * 1024**3
    assert memory_budget("qwen2.5-0.5b", "q8_0", "cpu-8").fits


# -- placement ----------------------------------------------------------------------------------


def test_first_fit_decreasing_places_the_largest_chain_first_and_never_splits_one() -> None:
    server = memory_budget("llama-3.1-8b", "q4_k_m", "a10g")
    c = server.free_bytes
    sizes = {"lich": 0.5, "vampire": 0.4, "werewolf": 0.3, "zombie": 0.3, "ghoul": 0.2, "imp": 0.2}
    chains = [ChainFootprint(name, int(c * share), 0) for name, share in sizes.items()]
    random.Random(7).shuffle(chains)
    placement = pack_chains(chains, server)
    assert [load.archetypes for load in placement.servers] == [
        ("lich", "vampire"),
        ("werewolf", "zombie", "ghoul", "imp"),
    ]
    placed = [a for load in placement.servers for a in load.archetypes]
    assert sorted(placed) == sorted(sizes)  # each chain on exactly one server
    for load in placement.servers:
        assert load.used_bytes == sum(placement.chain_bytes[a] for a in load.archetypes)
        assert load.free_bytes == c - load.used_bytes >= 0
    assert placement.server_of("imp") == 1


def test_a_chains_size_is_its_adapters_plus_its_sequences_kv() -> None:
    server = memory_budget("llama-3.1-8b", "q4_k_m", "a10g", context=4096)
    adapters = 7 * lora_bytes("llama-3.1-8b", 16)
    chains = [
        ChainFootprint(name, adapters, 8) for name in ("vampire", "werewolf", "zombie", "ghoul")
    ]
    placement = pack_chains(chains, server)
    assert placement.chain_bytes["vampire"] == adapters + 8 * 4096 * 131_072
    per_server = server.free_bytes // placement.chain_bytes["vampire"]
    assert len(placement.servers[0].archetypes) == min(per_server, 4)
    assert sum(len(s.archetypes) for s in placement.servers) == 4


def test_a_chain_bigger_than_a_server_is_a_typed_error_naming_it() -> None:
    server = memory_budget("llama-3.1-8b", "q4_k_m", "a10g", context=8192)
    chains = [ChainFootprint("zombie", 10**8, 4), ChainFootprint("lich", 10**8, 64)]
    with pytest.raises(ChainTooLargeError, match="'lich'") as info:
        pack_chains(chains, server)
    assert isinstance(info.value, MythicError)
    assert info.value.archetype == "lich"
    assert info.value.needed > info.value.capacity == server.free_bytes


def test_placement_refuses_a_base_that_does_not_fit_duplicates_and_too_few_servers() -> None:
    with pytest.raises(PlanError, match="does not fit"):
        pack_chains([], memory_budget("llama-3.1-70b", "q4_0", "a10g"))
    server = memory_budget("llama-3.1-8b")
    with pytest.raises(PlanError, match="twice"):
        pack_chains([ChainFootprint("vampire", 1, 0), ChainFootprint("vampire", 1, 0)], server)
    big = server.free_bytes // 2 + 1
    with pytest.raises(PlanError, match="more than 1"):
        pack_chains(
            [ChainFootprint("a", big, 0), ChainFootprint("b", big, 0)], server, max_servers=1
        )


# -- scaling ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("npcs", "inferences", "servers"), [(100, 87.5, 2), (1000, 875.0, 18), (10_000, 8750.0, 175)]
)
def test_the_designs_own_formula(npcs: int, inferences: float, servers: int) -> None:
    plan = scale(npcs, uniform_tier(0.125), server=DESIGN_SERVER, tasks_per_action=7)
    assert plan.actions_per_s == npcs * 0.125
    assert plan.inferences_per_s == inferences
    assert plan.servers == servers
    assert plan.servers_for_memory == 0  # the design counts no KV


def test_design_examples_show_the_stated_figures_next_to_formula_and_corrected() -> None:
    review = design_examples()
    by_npcs = {ex.npcs: ex for ex in review.scaling}
    assert {n: ex.design_stated_servers for n, ex in by_npcs.items()} == {
        100: 1,
        1000: 5,
        10_000: 175,
    }
    assert {n: ex.design.servers for n, ex in by_npcs.items()} == {100: 2, 1000: 18, 10_000: 175}
    assert by_npcs[10_000].design.inferences_per_s == 8750
    corrected = by_npcs[10_000].corrected
    assert corrected.tasks_per_action == 1
    assert [t.npcs for t in corrected.tiers] == [1500, 3500, 5000]
    assert corrected.inferences_per_s == 1500 * 2 + 3500 * 1 + 5000 * 0.05
    assert corrected.servers_for_memory > 0  # KV counted
    assert "own formula gives" in by_npcs[1000].reason
    claims = {c.claim: c for c in review.claims}
    assert claims["70B base at 4 bits (002)"].design == "21 GB"
    assert "39.7 GB" in claims["70B base at 4 bits (002)"].computed
    assert "27 MB" in claims["one rank-16 LoRA adapter, q/k/v/o (002, 003)"].computed
    assert "does not fit" in claims["g5.2xlarge total (002): 70B + adapters + engine"].computed
    # The figures the module docstring and the README quote.
    assert claims["NPCs per g5.2xlarge (002 code)"].computed.startswith("57 by its own rates")
    by_device = claims["servers for 10,000 NPCs by device"].computed
    assert "a10g 185" in by_device
    assert "h100 16" in by_device
    assert by_npcs[10_000].corrected.servers == 185


def test_tier_counts_add_up_and_tokens_and_kv_follow_the_rates() -> None:
    tiers = (
        ActivationTier("gold", 0.5, 2.0, prompt_tokens=40, output_tokens=4, resident_tokens=100),
        ActivationTier("bronze", 0.5, 0.1, prompt_tokens=200, output_tokens=10),
    )
    server = ServerThroughput(
        prefill_tokens_per_s=1000,
        decode_tokens_per_s=100,
        kv_capacity_bytes=10_000,
        kv_token_bytes=10,
    )
    plan = scale(7, tiers, server=server)
    assert [t.npcs for t in plan.tiers] == [4, 3]
    assert plan.inferences_per_s == pytest.approx(4 * 2.0 + 3 * 0.1)
    assert plan.prefill_tokens_per_s == pytest.approx(4 * 2 * 40 + 3 * 0.1 * 200)
    assert plan.decode_tokens_per_s == pytest.approx(4 * 2 * 4 + 3 * 0.1 * 10)
    assert plan.resident_kv_bytes == 4 * 100 * 10
    # (380 / 1000) + (35 / 100) = 0.73 of a server's time; 4,000 of 10,000 bytes of KV.
    assert (plan.servers_for_throughput, plan.servers_for_memory, plan.servers) == (1, 1, 1)
    assert scale(0, tiers, server=server).servers == 0
    many = scale(100, tiers, server=server)
    assert many.servers_for_memory == 5  # 50 x 100 x 10 = 50,000 bytes of KV
    assert many.servers == max(many.servers_for_throughput, 5)


def test_roofline_is_bounded_by_the_devices_memory_and_peaks() -> None:
    a10g = roofline(memory_budget("llama-3.1-8b", adapters=35), context=2048)
    h100 = roofline(memory_budget("llama-3.1-8b", device="h100", adapters=35), context=2048)
    assert a10g.prefill_tokens_per_s is not None and h100.prefill_tokens_per_s is not None
    assert a10g.decode_tokens_per_s is not None and h100.decode_tokens_per_s is not None
    assert h100.prefill_tokens_per_s > 10 * a10g.prefill_tokens_per_s
    assert h100.decode_tokens_per_s > a10g.decode_tokens_per_s
    # One sequence alone cannot beat reading every weight once per token.
    solo = roofline(memory_budget("llama-3.1-8b"), context=2048, max_batch=1)
    assert solo.decode_tokens_per_s is not None
    assert solo.decode_tokens_per_s < 600e9 / weight_bytes("llama-3.1-8b", "q4_k_m")
    assert a10g.kv_capacity_bytes == memory_budget("llama-3.1-8b", adapters=35).free_bytes
    with pytest.raises(PlanError, match="no room"):
        roofline(memory_budget("llama-3.1-8b", "f16", "a10g"), context=131_072)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: memory_budget("gpt-9"), "unknown model 'gpt-9'; choose one of: smollm2-135m"),
        (lambda: memory_budget(quant="q3_k"), "unknown quantisation .*q4_k_m"),
        (lambda: memory_budget(device="tpu"), "unknown device .*a10g.*cpu-<GiB of RAM>"),
        (lambda: memory_budget(device="cpu-0"), "unknown device"),
        (lambda: memory_budget(kv_dtype="int3"), "unknown KV cache dtype .*q8_0"),
        (lambda: memory_budget(adapter_dtype="fp8"), "unknown adapter dtype .*bf16"),
        (lambda: memory_budget(targets=["lm_head"]), "unknown LoRA target module .*down_proj"),
        (lambda: memory_budget(targets=[]), "at least one target"),
        (lambda: memory_budget(rank=0), "rank must be a whole number >= 1"),
        (lambda: memory_budget(adapters=-1), "adapters must be"),
        (lambda: memory_budget(sequences=-3), "sequences must be"),
        (lambda: memory_budget(context=0), "context must be"),
        (lambda: memory_budget(adapters=True), "adapters must be"),
        (lambda: scale(-1, ACTIVATION_TIERS, server=DESIGN_SERVER), "npcs must be"),
        (lambda: scale(10, uniform_tier(1.0), server=DESIGN_SERVER, tasks_per_action=0), "tasks"),
        (lambda: scale(10, uniform_tier(-1.0), server=DESIGN_SERVER), "update_hz must be >= 0"),
        (lambda: scale(10, uniform_tier(float("nan")), server=DESIGN_SERVER), "finite"),
        (lambda: scale(10, (), server=DESIGN_SERVER), "at least one tier"),
        (lambda: scale(10, (ActivationTier("a", 0.5, 1.0),), server=DESIGN_SERVER), "sum to 1"),
        (
            lambda: scale(
                10, (ActivationTier("a", 0.5, 1), ActivationTier("a", 0.5, 1)), server=DESIGN_SERVER
            ),
            "unique",
        ),
        (lambda: ServerThroughput(inferences_per_s=0), "inferences_per_s must be > 0"),
        (lambda: ServerThroughput(prefill_tokens_per_s=100), "needs inferences_per_s, or both"),
        (lambda: ServerThroughput(prefill_tokens_per_s=1, decode_tokens_per_s=-1), "decode"),
        (
            lambda: scale(
                10,
                uniform_tier(1.0),
                server=ServerThroughput(prefill_tokens_per_s=1, decode_tokens_per_s=1),
            ),
            "no prompt or output tokens",
        ),
        (lambda: design_examples(npcs=[-5]), "npcs must be"),
    ],
)
def test_bad_input_is_a_typed_error_with_the_valid_choices(
    call: Callable[[], object], match: str
) -> None:
    with pytest.raises(PlanError, match=match) as info:
        call()
    assert isinstance(info.value, MythicError)


def test_unknown_presets_are_their_own_error_type() -> None:
    with pytest.raises(UnknownPresetError) as info:
        device_preset("a10")
    assert (info.value.kind, info.value.name) == ("device", "a10")


# -- the command --------------------------------------------------------------------------------


def test_the_help_texts_name_every_preset() -> None:
    for name in MODELS:
        assert name in plan_cli.MODEL_HELP
    for name in QUANTS:
        assert name in plan_cli.QUANT_HELP
    for name in DEVICES:
        assert name in plan_cli.DEVICE_HELP
    for name in KV_DTYPES:
        assert name in plan_cli.KV_HELP
    for name in LORA_TARGETS:
        assert name in plan_cli.TARGETS_HELP


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_cli.plan_command)
    app.command("other")(lambda: None)  # two commands: `plan` stays a subcommand
    return app


def test_the_command_prints_tables_json_and_typed_errors() -> None:
    runner = CliRunner()
    shown = runner.invoke(_app(), ["plan", "--npcs", "100,1k", "--archetypes", "vampire,zombie"])
    assert shown.exit_code == 0, shown.output
    for text in ("Memory of one server", "Placement", "Scaling", "vampire", "1,000"):
        assert text in shown.output
    data = json.loads(runner.invoke(_app(), ["plan", "--json", "--npcs", "10000"]).output)
    assert data["memory"]["adapters"] == 35
    assert [s["npcs"] for s in data["scaling"]] == [10_000]
    design = json.loads(runner.invoke(_app(), ["plan", "--design", "--json"]).output)
    assert [ex["design"]["servers"] for ex in design["scaling"]] == [2, 18, 175]
    bad = runner.invoke(_app(), ["plan", "--device", "a10"])
    assert bad.exit_code == 2
    assert "unknown device 'a10'" in bad.output
    oversize = runner.invoke(_app(), ["plan", "--active-sequences", "100"])
    assert oversize.exit_code == 2
    assert "archetype chain" in oversize.output
