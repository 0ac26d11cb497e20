"""Adapter training on the real SmolLM2 base: train, export, serve in llama.cpp, match PEFT.

The conversion check runs llama.cpp on a float32 copy of the base (dequantised from the
packaged Q4_1 file, exactly the weights transformers trains on), so any difference between
the two runtimes' greedy output is the adapter's conversion, not quantisation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mythic import MissingExtraError
from mythic.config import EngineSettings, MythicSettings
from mythic.engine import (
    ChatMessage,
    Engine,
    GenerationRequest,
    ModelError,
    ModelStore,
    ResolvedModel,
    Sampling,
)
from mythic.knowledge import load_world
from mythic.training import BuiltAdapter, TrainSettings, build_adapter, curate, load_base
from tests.conftest import EXAMPLE_WORLD, unavailable

pytestmark = pytest.mark.integration

BASE = "smollm2-135m-instruct"
TINY = TrainSettings(rank=8, alpha=16, steps=8, batch_size=4, learning_rate=4e-3, max_tokens=192)


@pytest.fixture(scope="module")
def resolved(settings: MythicSettings) -> ResolvedModel:
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        unavailable(f"the train extra is not installed: {exc}")
    try:
        return ModelStore(settings.engine.models_dir).resolve(BASE)
    except ModelError as exc:
        unavailable(f"{BASE} is not available: {exc}")
        raise


@pytest.fixture(scope="module")
def base(resolved: ResolvedModel) -> tuple[Any, Any]:
    return load_base(resolved, threads=1)


@pytest.fixture(scope="module")
def built(
    resolved: ResolvedModel, base: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory
) -> BuiltAdapter:
    world = load_world(EXAMPLE_WORLD)
    data = curate(world, "zombie", "dialogue_style")
    root = tmp_path_factory.mktemp("adapters")
    return build_adapter(resolved, data, root, TINY, loaded=base)


def test_a_trained_adapter_is_written_in_both_formats_with_its_manifest(
    built: BuiltAdapter, resolved: ResolvedModel, base: tuple[Any, Any]
) -> None:
    assert built.version == 1 and built.base == BASE
    assert (built.peft_dir / "adapter_model.safetensors").is_file()
    config = json.loads((built.peft_dir / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["base_model_name_or_path"] == BASE
    manifest = json.loads((built.folder / "manifest.json").read_text())
    assert manifest["data"]["sha256"] and manifest["data"]["sources"]["card"] > 0
    assert len(manifest["training"]["losses"]) == TINY.steps
    # Held-out loss with and without the adapter, measured in the same run.
    metrics = built.metrics
    assert metrics["held_out_loss"] < metrics["base_held_out_loss"]
    assert built.size_bytes == built.gguf.stat().st_size > 0
    # The base model came back without the adapter's layers.
    model, _ = base
    assert not any("lora" in name for name, _ in model.named_parameters())


def _dequantised_copy(src: Path, dst: Path) -> Path:
    """The GGUF at `src` with every tensor stored as float32."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def f32_engine(
    resolved: ResolvedModel, built: BuiltAdapter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    path = _dequantised_copy(resolved.path, tmp_path_factory.mktemp("f32") / "smollm2-f32.gguf")
    settings = EngineSettings(
        adapters={"zombie": built.gguf}, seed=0, n_threads=2, chat_format="chatml"
    )
    try:
        engine = Engine.load(settings, str(path))
    except MissingExtraError as exc:
        unavailable(f"llama-cpp-python is not installed: {exc}")
        raise
    yield engine
    engine.close()


PROMPTS = ("Who are you?", "Where is the Drowned Chapel?", "What do you want from me?")


def test_the_converted_adapter_in_llama_cpp_matches_peft_greedy(
    built: BuiltAdapter, base: tuple[Any, Any], f32_engine: Engine, resolved: ResolvedModel
) -> None:
    import peft
    import torch

    model, tokenizer = base
    tuned = peft.PeftModel.from_pretrained(model, str(built.peft_dir)).eval()
    system = ChatMessage("system", "You are Old Tobin, a zombie of Ravenmoor.")
    assert resolved.chat_format is not None
    try:
        changed = 0
        for question in PROMPTS:
            messages = [system, ChatMessage("user", question)]
            prompt = resolved.chat_format.render(messages)
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            outputs = {}
            for name, adapters in (("adapter", {"zombie": 1.0}), ("base", {})):
                request = GenerationRequest(
                    npc_id="old_tobin",
                    session_id=f"match-{name}",
                    messages=messages,
                    sampling=Sampling(max_tokens=12, temperature=0.0, repeat_penalty=1.0),
                    adapters=adapters,
                )
                served = f32_engine.submit_sync(request).collect()
                with torch.no_grad():
                    if name == "adapter":
                        gen = tuned.generate(ids, max_new_tokens=12, do_sample=False)
                    else:
                        with tuned.disable_adapter():
                            gen = tuned.generate(ids, max_new_tokens=12, do_sample=False)
                reference = tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
                assert served.text.strip() == reference.strip(), (name, question)
                outputs[name] = served.text
            changed += outputs["adapter"] != outputs["base"]
        assert changed, "the adapter changed no greedy reply: the test would not see a bad export"
    finally:
        tuned.unload()
