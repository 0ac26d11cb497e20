"""What one server holds and which servers host which archetype chains.

Every number is computed from a model's shape instead of quoted from a rule of thumb:

- `memory_budget()`: base weights at a quantisation, LoRA adapters (their real size from rank,
  target modules and the model's matrix shapes), the KV cache of every active sequence,
  compute buffers, the runtime's own context and a reserved headroom.
- `pack_chains()`: first-fit decreasing placement of archetype chains onto servers that all host
  the shared base; a chain (its adapters and its sequences' KV) never splits across servers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mythic._errors import MythicError

GB = 1_000_000_000
GIB = 1024**3


class PlanError(MythicError):
    """A planning input is invalid: a negative count, a zero rate, a rank of 0, a bad mix."""


class UnknownPresetError(PlanError):
    """A model, quantisation, device, dtype or LoRA target name that has no preset."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        valid = ", ".join(choices)
        super().__init__(f"unknown {kind} {name!r}; choose one of: {valid}")
        self.kind = kind
        self.name = name


class ChainTooLargeError(PlanError):
    """An archetype chain needs more memory than one whole server has for chains.

    A chain never splits across servers, so the fix is fewer active sequences for it, a
    shorter context, a quantised KV cache, a smaller base or a bigger device.
    """

    def __init__(self, archetype: str, needed: int, capacity: int, device: str) -> None:
        super().__init__(
            f"archetype chain {archetype!r} needs {needed / GB:.2f} GB but each {device} "
            f"server has {capacity / GB:.2f} GB left for chains after the base model",
            fix="fewer active sequences, a shorter context, a q8_0 KV cache or a bigger device",
        )
        self.archetype = archetype
        self.needed = needed
        self.capacity = capacity


# -- presets ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer's shape (from its config.json); sizes follow from it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = False

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the output head (one matrix when they are tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """Total parameter count, counted from the shape."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.qkv_bias:
            attention += q + 2 * kv
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden
        return self.embedding_params + self.layers * (attention + mlp + norms) + self.hidden

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each LoRA-targetable projection in one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, tied_embeddings=True),
        ModelShape(
            "qwen2.5-0.5b", 24, 896, 14, 2, 64, 4864, 151936, tied_embeddings=True, qkv_bias=True
        ),
        ModelShape(
            "qwen2.5-3b", 36, 2048, 16, 2, 128, 11008, 151936, tied_embeddings=True, qkv_bias=True
        ),
        ModelShape(
            "qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, tied_embeddings=False, qkv_bias=True
        ),
        ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, tied_embeddings=False),
        ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, tied_embeddings=False),
    )
}
"""Model shapes by name. llama-3.1-8b stands for the design's "7B/8B base"."""


@dataclass(frozen=True, slots=True)
class Quant:
    """A weight format and its real storage cost, block scales included."""

    name: str
    bits_per_weight: float
    embeddings_f16: bool = False
    """bitsandbytes leaves the embeddings and the output head in f16; GGUF quantises them."""


QUANTS: dict[str, Quant] = {
    q.name: q
    for q in (
        Quant("f16", 16.0),
        Quant("bf16", 16.0),
        Quant("q8_0", 8.5),  # 32 int8 + one f16 scale per block: 34 bytes / 32 weights
        Quant("q6_k", 6.5625),  # 210 bytes / 256 weights
        Quant("q5_k_m", 5.69),  # q5_k (5.5) with some tensors at q6_k, as llama.cpp mixes it
        Quant("q4_k_m", 4.85),  # q4_k (4.5) with half of attn_v and ffn_down at q6_k
        Quant("q4_1", 5.0),  # 16 bytes of nibbles + f16 scale + f16 min / 32 weights
        Quant("q4_0", 4.5),  # 16 bytes of nibbles + f16 scale / 32 weights
        # NF4 with double quantisation, the design's BitsAndBytesConfig(load_in_4bit=True):
        # 4 bits + an 8-bit absmax per 64 weights + an f32 scale per 256 absmaxes.
        Quant("nf4", 4.127, embeddings_f16=True),
    )
}
"""Weight quantisations by name (GGUF names, plus bitsandbytes nf4)."""

DTYPE_BITS: dict[str, float] = {
    "f32": 32.0,
    "f16": 16.0,
    "bf16": 16.0,
    "fp8": 8.0,
    "q8_0": 8.5,
    "q4_0": 4.5,
}
"""Bits per element of the formats an adapter or a KV cache can be stored in."""

ADAPTER_DTYPES = ("f32", "f16", "bf16", "q8_0")
KV_DTYPES = ("f32", "f16", "bf16", "fp8", "q8_0", "q4_0")

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_TARGETS = LORA_TARGETS[:4]
"""The design's LoraConfig targets (q, k, v and o projections)."""


@dataclass(frozen=True, slots=True)
class Device:
    """One server's accelerator (or RAM for a CPU server) and what the runtime keeps of it."""

    name: str
    label: str
    memory_gib: float
    """Total memory as nvidia-smi reports it (RAM for a CPU server)."""
    bandwidth_gbs: float
    """Peak memory bandwidth, GB/s: bounds decode speed."""
    tflops: float
    """Peak dense f16 tensor throughput, TFLOP/s: bounds prefill speed."""
    reserved_fraction: float
    """Left unused: vLLM's default gpu_memory_utilization is 0.9; a CPU server keeps RAM for
    the OS and the game's other services."""
    runtime_gib: float
    """The runtime's own footprint: CUDA context and cuBLAS workspaces on a GPU."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # AWS g5 (the design's g5.2xlarge). AWS publishes no tensor figure for the A10G; it is
        # about 70 TFLOP/s dense f16, well below the A10's 125, with the same 600 GB/s.
        Device("a10g", "NVIDIA A10G 24 GB (AWS g5)", 23028 / 1024, 600, 70, 0.10, 0.5),
        Device("l4", "NVIDIA L4 24 GB", 23034 / 1024, 300, 121, 0.10, 0.5),
        Device("a100-40", "NVIDIA A100 40 GB", 40, 1555, 312, 0.10, 0.5),
        Device("a100-80", "NVIDIA A100 80 GB", 80, 2039, 312, 0.10, 0.5),
        Device("h100", "NVIDIA H100 80 GB SXM", 81559 / 1024, 3350, 989, 0.10, 0.5),
        Device("h200", "NVIDIA H200 141 GB", 143771 / 1024, 4800, 989, 0.10, 0.5),
    )
}
"""GPU presets by name. `cpu` (32 GiB of RAM) and `cpu-<N>` (N GiB) are CPU servers."""

_CPU = re.compile(r"^cpu(?:-(\d+))?$")
CPU_DEFAULT_GIB = 32


def _cpu(gib: int) -> Device:
    # A 16-core desktop part with dual-channel DDR5: ~80 GB/s, ~2 TFLOP/s of f32 SIMD.
    return Device(f"cpu-{gib}", f"CPU server, {gib} GiB RAM", gib, 80, 2, 0.25, 0.1)


def model_preset(name: str) -> ModelShape:
    """The model shape called `name`.

    Raises:
        UnknownPresetError: no such preset; the message lists them.
    """
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise UnknownPresetError("model", name, MODELS) from None


def quant_preset(name: str) -> Quant:
    """The quantisation called `name`.

    Raises:
        UnknownPresetError: no such preset; the message lists them.
    """
    try:
        return QUANTS[name.lower()]
    except KeyError:
        raise UnknownPresetError("quantisation", name, QUANTS) from None


def device_preset(name: str) -> Device:
    """The device called `name`: a GPU preset, `cpu` (32 GiB) or `cpu-<N>` (N GiB of RAM).

    Raises:
        UnknownPresetError: no such preset; the message lists them.
    """
    key = name.lower()
    if key in DEVICES:
        return DEVICES[key]
    match = _CPU.match(key)
    if match and int(match.group(1) or CPU_DEFAULT_GIB) > 0:
        return _cpu(int(match.group(1) or CPU_DEFAULT_GIB))
    raise UnknownPresetError("device", name, [*DEVICES, "cpu", "cpu-<GiB of RAM>"])


def _dtype_bits(name: str, allowed: Sequence[str], kind: str) -> float:
    if name.lower() not in allowed:
        raise UnknownPresetError(kind, name, allowed)
    return DTYPE_BITS[name.lower()]


def _count(name: str, value: int, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def _rate(name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise PlanError(f"{name} must be {bound}, got {value!r}")
    return float(value)


def _model(model: str | ModelShape) -> ModelShape:
    return model_preset(model) if isinstance(model, str) else model


def _device(device: str | Device) -> Device:
    return device_preset(device) if isinstance(device, str) else device


# -- sizes --------------------------------------------------------------------------------------


def weight_bytes(model: str | ModelShape, quant: str = "q4_k_m") -> int:
    """Bytes of a model's weights at a quantisation: params x bits/8, block scales included."""
    shape, q = _model(model), quant_preset(quant)
    if q.embeddings_f16:
        rest = shape.params - shape.embedding_params
        return round(rest * q.bits_per_weight / 8 + shape.embedding_params * 2)
    return round(shape.params * q.bits_per_weight / 8)


def lora_params(
    model: str | ModelShape, rank: int, targets: Sequence[str] = ATTENTION_TARGETS
) -> int:
    """Parameters of one LoRA adapter: rank x sum over targeted matrices of (in + out), per layer.

    Each targeted W (out x in) gets A (rank x in) and B (out x rank).

    Raises:
        PlanError: rank below 1, no targets, or a target the model does not have.
    """
    shape = _model(model)
    _count("rank", rank, 1)
    dims = shape.projections()
    if not targets:
        raise PlanError(f"a LoRA adapter needs at least one target module: {', '.join(dims)}")
    for target in targets:
        if target not in dims:
            raise UnknownPresetError("LoRA target module", target, dims)
    per_layer = sum(dims[t][0] + dims[t][1] for t in dict.fromkeys(targets))
    return rank * per_layer * shape.layers


def lora_bytes(
    model: str | ModelShape,
    rank: int,
    targets: Sequence[str] = ATTENTION_TARGETS,
    dtype: str = "f16",
) -> int:
    """Bytes of one LoRA adapter stored as `dtype` (f16 is what llama.cpp's converter writes).

    Rank 16 on q, k, v and o of llama-3.1-8b is 13.6 M parameters: 27 MB in f16, not the
    design's 200 MB (that is nearer a 70B's, 130 MB in f16, 261 MB in f32).
    """
    bits = _dtype_bits(dtype, ADAPTER_DTYPES, "adapter dtype")
    return round(lora_params(model, rank, targets) * bits / 8)


def kv_bytes_per_token(model: str | ModelShape, kv_dtype: str = "f16") -> int:
    """KV cache bytes per token of one sequence: 2 (K and V) x layers x kv_heads x head_dim."""
    shape = _model(model)
    bits = _dtype_bits(kv_dtype, KV_DTYPES, "KV cache dtype")
    return round(2 * shape.layers * shape.kv_heads * shape.head_dim * bits / 8)


def compute_buffer_bytes(model: str | ModelShape, batch_tokens: int = 512) -> int:
    """Activation/compute buffers for one forward pass of `batch_tokens` tokens (f32).

    The logits row (vocab) dominates, then the MLP and attention activations; this is close
    to llama.cpp's compute buffer at its default 512-token micro-batch. vLLM profiles with its
    max_num_batched_tokens and reserves more: pass that number.
    """
    shape = _model(model)
    _count("batch_tokens", batch_tokens, 1)
    return batch_tokens * (shape.vocab + 4 * shape.hidden + 2 * shape.intermediate) * 4


# -- memory -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """What one server holds, in bytes; `free_bytes` is negative when it does not fit."""

    model: str
    quant: str
    device: str
    capacity_bytes: int
    reserved_bytes: int
    runtime_bytes: int
    compute_bytes: int
    weights_bytes: int
    adapters: int
    adapter_bytes: int
    """One adapter."""
    adapters_bytes: int
    """All of them."""
    sequences: int
    context: int
    kv_token_bytes: int
    kv_sequence_bytes: int
    kv_bytes: int
    used_bytes: int
    free_bytes: int
    fits: bool
    max_sequences: int
    """Sequences of `context` tokens that fit beside the weights, adapters and overheads."""


def memory_budget(
    model: str | ModelShape = "llama-3.1-8b",
    quant: str = "q4_k_m",
    device: str | Device = "a10g",
    *,
    adapters: int = 0,
    rank: int = 16,
    targets: Sequence[str] = ATTENTION_TARGETS,
    adapter_dtype: str = "f16",
    sequences: int = 0,
    context: int = 4096,
    kv_dtype: str = "f16",
    batch_tokens: int = 512,
) -> MemoryBudget:
    """One server's memory: base weights + adapters + KV per active sequence + overheads.

    Args:
        model: a preset name (`MODELS`) or a shape.
        quant: the base weights' quantisation (`QUANTS`).
        device: a preset name (`DEVICES`, `cpu`, `cpu-<GiB>`) or a device.
        adapters: LoRA adapters resident on the server.
        rank: their rank.
        targets: the projections they adapt.
        adapter_dtype: how they are stored.
        sequences: active sequences whose KV cache is resident.
        context: tokens of KV per sequence.
        kv_dtype: the KV cache's element format.
        batch_tokens: tokens per forward pass, which sizes the compute buffers.

    Raises:
        PlanError: a negative count, rank or context below 1, an unknown preset.
    """
    shape, dev = _model(model), _device(device)
    _count("adapters", adapters)
    _count("sequences", sequences)
    _count("context", context, 1)
    one_adapter = lora_bytes(shape, rank, targets, adapter_dtype)
    kv_token = kv_bytes_per_token(shape, kv_dtype)
    capacity = dev.memory_bytes
    reserved = round(capacity * dev.reserved_fraction)
    runtime = round(dev.runtime_gib * GIB)
    compute = compute_buffer_bytes(shape, batch_tokens)
    weights = weight_bytes(shape, quant)
    fixed = reserved + runtime + compute + weights + adapters * one_adapter
    kv_sequence = kv_token * context
    used = fixed + sequences * kv_sequence
    return MemoryBudget(
        model=shape.name,
        quant=quant.lower(),
        device=dev.name,
        capacity_bytes=capacity,
        reserved_bytes=reserved,
        runtime_bytes=runtime,
        compute_bytes=compute,
        weights_bytes=weights,
        adapters=adapters,
        adapter_bytes=one_adapter,
        adapters_bytes=adapters * one_adapter,
        sequences=sequences,
        context=context,
        kv_token_bytes=kv_token,
        kv_sequence_bytes=kv_sequence,
        kv_bytes=sequences * kv_sequence,
        used_bytes=used,
        free_bytes=capacity - used,
        fits=used <= capacity,
        max_sequences=max(0, (capacity - fixed) // kv_sequence),
    )


# -- placement ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainFootprint:
    """What one archetype's chain takes on a server: its adapters and its sequences' KV.

    The registry's `ArchetypeChain` says what a chain is; this is only its size.
    """

    archetype: str
    adapter_bytes: int
    """All of the archetype's adapters together."""
    active_sequences: int
    """Sequences of this archetype whose KV stays resident on its server."""


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One server of a placement: the chains it hosts and what is left."""

    index: int
    archetypes: tuple[str, ...]
    used_bytes: int
    """Taken by the chains (adapters and KV), on top of the shared base."""
    free_bytes: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Chains placed onto servers that all host the same base (`server` is one of them)."""

    server: MemoryBudget
    capacity_bytes: int
    """Memory per server left for chains after the base, overheads and headroom."""
    chain_bytes: dict[str, int]
    servers: tuple[ServerLoad, ...]

    def server_of(self, archetype: str) -> int:
        """Index of the server hosting `archetype`'s whole chain."""
        for load in self.servers:
            if archetype in load.archetypes:
                return load.index
        raise PlanError(f"archetype {archetype!r} is not in this placement")


def pack_chains(
    chains: Sequence[ChainFootprint], server: MemoryBudget, *, max_servers: int | None = None
) -> Placement:
    """Place chains onto servers by first-fit decreasing; a chain never splits across servers.

    A chain's size is its adapters plus its active sequences' KV at the server's context. The
    largest chain goes first, each into the first server with room, a new server when none has.

    Args:
        chains: the archetype chains (names must be unique).
        server: the budget of one server hosting the shared base (adapters and sequences
            already in it are taken as fixed on every server).
        max_servers: fail when the chains need more servers than this.

    Raises:
        ChainTooLargeError: a chain is bigger than a whole server's room for chains.
        PlanError: the base does not fit the device, duplicate names, more than `max_servers`.
    """
    if max_servers is not None:
        _count("max_servers", max_servers, 1)
    capacity = server.free_bytes
    if capacity <= 0:
        raise PlanError(
            f"{server.model} at {server.quant} does not fit on {server.device}: it needs "
            f"{server.used_bytes / GB:.1f} GB of {server.capacity_bytes / GB:.1f} GB",
            fix="a smaller quantisation or model, or a bigger device",
        )
    sizes: dict[str, int] = {}
    for chain in chains:
        if chain.archetype in sizes:
            raise PlanError(f"archetype {chain.archetype!r} is listed twice")
        _count(f"{chain.archetype} adapter_bytes", chain.adapter_bytes)
        _count(f"{chain.archetype} active_sequences", chain.active_sequences)
        size = chain.adapter_bytes + chain.active_sequences * server.kv_sequence_bytes
        if size > capacity:
            raise ChainTooLargeError(chain.archetype, size, capacity, server.device)
        sizes[chain.archetype] = size
    bins: list[list[str]] = []
    free: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        slot = next((i for i, room in enumerate(free) if room >= sizes[name]), None)
        if slot is None:
            if max_servers is not None and len(bins) == max_servers:
                raise PlanError(
                    f"the chains need more than {max_servers} {server.device} server(s); "
                    f"{name!r} fits on none of them"
                )
            bins.append([])
            free.append(capacity)
            slot = len(bins) - 1
        bins[slot].append(name)
        free[slot] -= sizes[name]
    loads = tuple(
        ServerLoad(i, tuple(names), capacity - room, room)
        for i, (names, room) in enumerate(zip(bins, free, strict=True))
    )
    return Placement(server, capacity, sizes, loads)
