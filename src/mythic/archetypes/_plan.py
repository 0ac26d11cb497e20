"""Capacity planning for archetype chains: memory per server, chain placement, server counts.

Every number is computed from a model's shape instead of quoted from a rule of thumb:

- `memory_budget()`: what one server holds: base weights at a quantisation, LoRA adapters
  (their real size from rank, target modules and the model's matrix shapes), the KV cache of
  every active sequence, compute buffers, the runtime's own context and a reserved headroom.
- `pack_chains()`: first-fit decreasing placement of archetype chains onto servers that all host
  the shared base; a chain (its adapters and its sequences' KV) never splits across servers.
- `scale()`: inferences/s, prefill and decode tokens/s, resident KV and servers needed for N
  concurrent NPCs at given update rates, per activation tier or one rate for every NPC.
- `design_examples()`: the worked examples of design documents 002 and 003 rerun with their own
  assumptions next to the numbers computed here, each difference with its reason. In short,
  the design: puts a 70B model at 4 bits in 21 GB (it is about 40 GB); gives a 7B at 4 bits
  14 GB (about 5 GB; 14 GB is its f16 size); sizes a rank-16 adapter on a 7B at 200 MB (27 MB
  in f16); adds 35 such adapters up to 1.4 GB (its own figures make 7 GB); leaves no memory
  for the KV cache; runs all 7 task adapters for every action; gives every NPC the same
  0.125 Hz; has 500 NPCs per server where its own rates allow 57; and states 1 and 5 servers
  for 100 and 1,000 NPCs where its own formula gives 2 and 18. Its 175 A10G servers for
  10,000 NPCs lands near the corrected count (185) only because errors cancel: 7x too many
  inferences against too low a rate for the NPCs near the player. The work is mostly prefill,
  so compute-rich GPUs need far fewer servers (16 H100s).

Throughputs from `roofline()` are upper-bound estimates from a device's published bandwidth and
tensor throughput; measure a real server (bench/) and pass its numbers to `scale()` instead.
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


# -- scaling ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActivationTier:
    """NPCs that update at one rate with one shape of request."""

    name: str
    share: float
    """Fraction of all NPCs in this tier; a mix's shares sum to 1."""
    update_hz: float
    """Decisions (actions) per second per NPC."""
    prompt_tokens: int = 0
    """New prompt tokens per inference (not already in a cached prefix)."""
    output_tokens: int = 0
    """Generated tokens per inference."""
    resident_tokens: int = 0
    """KV tokens kept resident per NPC between updates (0: rebuilt each time)."""


def uniform_tier(
    update_hz: float, *, prompt_tokens: int = 0, output_tokens: int = 0, resident_tokens: int = 0
) -> tuple[ActivationTier, ...]:
    """One tier holding every NPC: the same update rate for all (the design's model)."""
    return (ActivationTier("all", 1.0, update_hz, prompt_tokens, output_tokens, resident_tokens),)


ACTIVATION_TIERS: tuple[ActivationTier, ...] = (
    # Design 003's activation tiers for a 500-1,000 NPC region: gold 80-200, silver 200-400,
    # bronze 300-600 (midpoints 140/300/450, about 15/35/50 %). Gold and silver refresh their
    # intent at 1-2 Hz (the controller's intent cache), a grammar-constrained 1-8 token
    # decision after a game-state delta appended to a cached persona prefix; bronze barks now
    # and then (every 20 s) from a compact seed without resident KV.
    ActivationTier("gold", 0.15, 2.0, prompt_tokens=48, output_tokens=8, resident_tokens=2048),
    ActivationTier("silver", 0.35, 1.0, prompt_tokens=48, output_tokens=8, resident_tokens=1024),
    ActivationTier("bronze", 0.50, 0.05, prompt_tokens=256, output_tokens=16),
)
"""The tier mix the corrected examples use."""


@dataclass(frozen=True, slots=True)
class ServerThroughput:
    """What one server sustains: whole inferences/s, or prefill and decode tokens/s.

    Token rates win when both are given; `kv_capacity_bytes` (None: KV not counted, as in the
    design) bounds the NPCs whose KV stays resident.
    """

    inferences_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    kv_capacity_bytes: int | None = None
    kv_token_bytes: int = 0
    source: str = ""
    """Where the numbers come from: "design", "roofline ...", "measured ..."."""

    def __post_init__(self) -> None:
        tokens = (self.prefill_tokens_per_s, self.decode_tokens_per_s)
        if self.inferences_per_s is None and None in tokens:
            raise PlanError(
                "a server's throughput needs inferences_per_s, or both prefill_tokens_per_s "
                "and decode_tokens_per_s"
            )
        for name in ("inferences_per_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
            value = getattr(self, name)
            if value is not None:
                _rate(name, value)
        if self.kv_capacity_bytes is not None:
            _count("kv_capacity_bytes", self.kv_capacity_bytes, 1)
        _count("kv_token_bytes", self.kv_token_bytes)

    @property
    def by_tokens(self) -> bool:
        return self.prefill_tokens_per_s is not None and self.decode_tokens_per_s is not None


@dataclass(frozen=True, slots=True)
class TierLoad:
    """One tier's share of the load."""

    name: str
    npcs: int
    inferences_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    resident_kv_bytes: int


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """The load of N concurrent NPCs and the servers it needs."""

    npcs: int
    tasks_per_action: int
    tiers: tuple[TierLoad, ...]
    actions_per_s: float
    inferences_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    resident_kv_bytes: int
    servers_for_throughput: int
    servers_for_memory: int
    servers: int
    """The larger of the two, at least 1 when there are NPCs."""
    throughput: ServerThroughput


def _split(npcs: int, tiers: Sequence[ActivationTier]) -> list[int]:
    # Largest remainder: the tier counts add up to exactly `npcs`.
    raw = [npcs * t.share for t in tiers]
    counts = [math.floor(r) for r in raw]
    by_remainder = sorted(range(len(tiers)), key=lambda i: (counts[i] - raw[i], i))
    for i in by_remainder[: npcs - sum(counts)]:
        counts[i] += 1
    return counts


def _ceil(x: float) -> int:
    # 8750 / 50 must stay 175 despite float noise.
    return math.ceil(x - 1e-9)


def scale(
    npcs: int,
    tiers: Sequence[ActivationTier],
    *,
    server: ServerThroughput,
    tasks_per_action: int = 1,
) -> ScalePlan:
    """Inferences/s, tokens/s, resident KV and servers for `npcs` concurrent NPCs.

    Args:
        npcs: concurrent NPCs.
        tiers: the activation tiers (`ACTIVATION_TIERS`) or one rate for all (`uniform_tier()`).
        server: what one server sustains.
        tasks_per_action: inferences per action: the design runs all 7 task adapters for each
            action (7); one decision needs one (1).

    Raises:
        PlanError: negative counts or rates, shares not summing to 1, token throughput for
            tiers without token counts, a resident sequence bigger than a server's KV room.
    """
    _count("npcs", npcs)
    _count("tasks_per_action", tasks_per_action, 1)
    if not tiers:
        raise PlanError("at least one tier is needed")
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise PlanError(f"tier names must be unique: {', '.join(names)}")
    for t in tiers:
        _rate(f"tier {t.name} share", t.share, allow_zero=True)
        _rate(f"tier {t.name} update_hz", t.update_hz, allow_zero=True)
        for field in ("prompt_tokens", "output_tokens", "resident_tokens"):
            _count(f"tier {t.name} {field}", getattr(t, field))
    total_share = sum(t.share for t in tiers)
    if abs(total_share - 1.0) > 1e-6:
        raise PlanError(f"tier shares must sum to 1, they sum to {total_share:g}")
    if server.by_tokens and not any(t.prompt_tokens + t.output_tokens for t in tiers):
        raise PlanError(
            "the server's throughput is in tokens but the tiers give no prompt or output "
            "tokens per inference; give tokens or an inferences_per_s throughput"
        )
    loads = []
    for t, count in zip(tiers, _split(npcs, tiers), strict=True):
        inferences = count * t.update_hz * tasks_per_action
        resident = count * t.resident_tokens * server.kv_token_bytes
        if (
            server.kv_capacity_bytes is not None
            and t.resident_tokens * server.kv_token_bytes > server.kv_capacity_bytes
        ):
            raise PlanError(
                f"tier {t.name}: one NPC's {t.resident_tokens} resident tokens do not fit a "
                "server's KV room"
            )
        loads.append(
            TierLoad(
                t.name,
                count,
                inferences,
                inferences * t.prompt_tokens,
                inferences * t.output_tokens,
                resident,
            )
        )
    inferences = sum(x.inferences_per_s for x in loads)
    prefill = sum(x.prefill_tokens_per_s for x in loads)
    decode = sum(x.decode_tokens_per_s for x in loads)
    resident = sum(x.resident_kv_bytes for x in loads)
    if server.prefill_tokens_per_s is not None and server.decode_tokens_per_s is not None:
        load = prefill / server.prefill_tokens_per_s + decode / server.decode_tokens_per_s
    else:
        assert server.inferences_per_s is not None  # checked in ServerThroughput.__post_init__
        load = inferences / server.inferences_per_s
    for_throughput = _ceil(load)
    for_memory = _ceil(resident / server.kv_capacity_bytes) if server.kv_capacity_bytes else 0
    return ScalePlan(
        npcs=npcs,
        tasks_per_action=tasks_per_action,
        tiers=tuple(loads),
        actions_per_s=inferences / tasks_per_action,
        inferences_per_s=inferences,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
        resident_kv_bytes=resident,
        servers_for_throughput=for_throughput,
        servers_for_memory=for_memory,
        servers=max(for_throughput, for_memory, 1 if npcs else 0),
        throughput=server,
    )


BANDWIDTH_EFFICIENCY = 0.7
"""Share of peak bandwidth a decode step achieves (llama.cpp and vLLM reach 0.6-0.8)."""
COMPUTE_EFFICIENCY = 0.6
"""Share of peak tensor throughput a prefill achieves with quantised weights."""


def roofline(budget: MemoryBudget, *, context: int, max_batch: int = 256) -> ServerThroughput:
    """Estimated prefill and decode tokens/s of one server, from its device's peaks.

    Decode reads every weight and each sequence's KV once per step, so a step of a batch of B
    sequences takes max(bytes read / bandwidth, B x flops per token / tensor throughput);
    prefill is compute-bound. B is what fits in the server's free memory at `context` tokens,
    up to `max_batch`. These are upper bounds: use measured numbers (bench/) when you have them.

    Raises:
        PlanError: not one sequence of `context` tokens fits next to the weights.
    """
    _count("context", context, 1)
    _count("max_batch", max_batch, 1)
    shape, dev = model_preset(budget.model), device_preset(budget.device)
    kv_room = budget.free_bytes + budget.kv_bytes
    per_sequence = context * budget.kv_token_bytes
    batch = min(max_batch, kv_room // per_sequence) if kv_room > 0 else 0
    if batch < 1:
        raise PlanError(
            f"no room for one {context}-token sequence on {budget.device} next to "
            f"{budget.model} at {budget.quant}"
        )
    q = shape.heads * shape.head_dim
    flops_per_token = 2 * shape.params + 4 * shape.layers * context * q
    flops = dev.tflops * 1e12 * COMPUTE_EFFICIENCY
    bandwidth = dev.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY
    step = max(
        (budget.weights_bytes + batch * per_sequence) / bandwidth,
        batch * flops_per_token / flops,
    )
    return ServerThroughput(
        prefill_tokens_per_s=flops / flops_per_token,
        decode_tokens_per_s=batch / step,
        kv_capacity_bytes=kv_room,
        kv_token_bytes=budget.kv_token_bytes,
        source=f"roofline estimate, {dev.name}, decode batch {batch} at {context} tokens",
    )


def mean_context(tiers: Sequence[ActivationTier]) -> int:
    """Context length of the average decoding sequence of a tier mix (weighted by tokens out)."""
    weights = [t.share * t.update_hz * max(t.output_tokens, 1) for t in tiers]
    if not sum(weights):
        return 1
    tokens = [t.resident_tokens + t.prompt_tokens + t.output_tokens for t in tiers]
    return max(1, round(sum(w * n for w, n in zip(weights, tokens, strict=True)) / sum(weights)))


# -- the design's worked examples ---------------------------------------------------------------

DESIGN_ACTION_HZ = 0.125
"""Design 002: "1 action per 8 seconds" for every NPC."""
DESIGN_TASKS_PER_ACTION = 7
"""Design 002: "models_per_action = 7" (one inference per task adapter)."""
DESIGN_SERVER_INFERENCES_PER_S = 50.0
"""Design 002: "g5.2xlarge with batching: ~50 inferences/sec" (batch 50, one batch a second)."""
DESIGN_STATED_SERVERS = {100: 1, 1000: 5, 10000: 175}
"""Design 002's cost section: g5.2xlarge servers for 100, 1,000 and 10,000 NPCs."""
DESIGN_BATCH = 50
DESIGN_MAX_NPCS_PER_SERVER = 500
"""Design 002's code: "max_concurrent_npcs: 500" per g5.2xlarge."""


@dataclass(frozen=True, slots=True)
class DesignCorrection:
    """One of the design's numbers next to the computed one, and why they differ."""

    claim: str
    design: str
    computed: str
    reason: str


@dataclass(frozen=True, slots=True)
class ScaleExample:
    """One of the design's scaling examples: what it states, its formula, the corrected plan."""

    npcs: int
    design_stated_servers: int
    design: ScalePlan
    corrected: ScalePlan
    reason: str


@dataclass(frozen=True, slots=True)
class DesignReview:
    """The design's worked examples rerun: its claims (memory, rates) and scaling examples."""

    model: str
    quant: str
    device: str
    claims: tuple[DesignCorrection, ...]
    scaling: tuple[ScaleExample, ...]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _gb(n: float) -> str:
    return f"{n / GB:,.1f} GB"


def _decisions_per_s(server: ServerThroughput) -> float:
    gold = ACTIVATION_TIERS[0]
    assert server.prefill_tokens_per_s is not None
    assert server.decode_tokens_per_s is not None
    return 1 / (
        gold.prompt_tokens / server.prefill_tokens_per_s
        + gold.output_tokens / server.decode_tokens_per_s
    )


def _npcs_per_server(
    server: ServerThroughput, tiers: Sequence[ActivationTier] = ACTIVATION_TIERS
) -> float:
    # The load of many NPCs, divided out: how many one server carries, time or KV permitting.
    n = 100_000
    plan = scale(n, tiers, server=server)
    assert server.prefill_tokens_per_s is not None
    assert server.decode_tokens_per_s is not None
    time = (
        plan.prefill_tokens_per_s / server.prefill_tokens_per_s
        + plan.decode_tokens_per_s / server.decode_tokens_per_s
    )
    kv = plan.resident_kv_bytes / server.kv_capacity_bytes if server.kv_capacity_bytes else 0
    return n / max(time, kv)


def design_throughput() -> ServerThroughput:
    """The design's server: 50 inferences/s, KV not counted."""
    return ServerThroughput(inferences_per_s=DESIGN_SERVER_INFERENCES_PER_S, source="design")


def corrected_throughput(
    model: str = "llama-3.1-8b",
    quant: str = "q4_k_m",
    device: str = "a10g",
    *,
    archetypes: int = 5,
    adapters_per_archetype: int = 7,
    rank: int = 16,
    targets: Sequence[str] = ATTENTION_TARGETS,
    tiers: Sequence[ActivationTier] = ACTIVATION_TIERS,
    kv_dtype: str = "f16",
) -> ServerThroughput:
    """The roofline throughput of a server hosting every archetype's adapters."""
    _count("archetypes", archetypes)
    _count("adapters_per_archetype", adapters_per_archetype)
    budget = memory_budget(
        model,
        quant,
        device,
        adapters=archetypes * adapters_per_archetype,
        rank=rank,
        targets=targets,
        kv_dtype=kv_dtype,
    )
    return roofline(budget, context=mean_context(tiers))


def design_examples(
    model: str = "llama-3.1-8b",
    quant: str = "q4_k_m",
    device: str = "a10g",
    npcs: Sequence[int] = (100, 1000, 10000),
) -> DesignReview:
    """Design 002/003's worked numbers with their own assumptions, next to computed ones.

    The corrected side serves `model` at `quant` on `device` (by default the 8B at q4_k_m on
    the design's A10G), one inference per action, design 003's activation tiers
    (`ACTIVATION_TIERS`), and counts the KV cache.
    """
    for n in npcs:
        _count("npcs", n)
    big, small = "llama-3.1-70b", "llama-3.1-8b"
    a10g = device_preset("a10g")
    big_q4 = {q: weight_bytes(big, q) for q in ("q4_0", "nf4", "q4_k_m")}
    small_q4 = weight_bytes(small, "q4_k_m")
    qwen7_q4 = weight_bytes("qwen2.5-7b", "q4_k_m")
    small_f16 = weight_bytes(small, "f16")
    ad_small = lora_bytes(small, 16)
    ad_small_f32 = lora_bytes(small, 16, dtype="f32")
    ad_small_all = lora_bytes(small, 16, LORA_TARGETS)
    ad_big = lora_bytes(big, 16)
    ad_big_f32 = lora_bytes(big, 16, dtype="f32")
    big_params, small_params = model_preset(big).params, model_preset(small).params
    kv_small = kv_bytes_per_token(small)
    kv_big = kv_bytes_per_token(big)
    big_total = memory_budget(big, "q4_0", "a10g", adapters=35)
    small_total = memory_budget(small, "q4_k_m", "a10g", adapters=35)
    design_sum_70b = 21 + 0.2 * 5 * 7 + 1.6
    corrected = corrected_throughput(model, quant, device)
    assert corrected.prefill_tokens_per_s is not None  # a roofline is in tokens
    assert corrected.decode_tokens_per_s is not None
    reference = corrected_throughput(small, "q4_k_m", "a10g")
    design_per_server = DESIGN_SERVER_INFERENCES_PER_S / (
        DESIGN_ACTION_HZ * DESIGN_TASKS_PER_ACTION
    )
    fixed_per_server = _npcs_per_server(corrected)
    by_device: dict[str, int] = {}
    for name in DEVICES:
        try:
            server = corrected_throughput(model, quant, name)
        except PlanError:
            continue  # the base does not fit this device
        by_device[name] = scale(10_000, ACTIVATION_TIERS, server=server).servers
    claims = (
        DesignCorrection(
            "70B base at 4 bits (002)",
            "21 GB",
            f"{_gb(big_q4['q4_0'])} q4_0, {_gb(big_q4['nf4'])} nf4, {_gb(big_q4['q4_k_m'])} q4_k_m",
            "70.6 B params x 4.5 bits / 8 (4-bit values plus block scales; nf4 keeps the "
            f"embeddings in f16); 21 GB would be {21 * GB * 8 / big_params:.1f} bits per "
            "weight. It does not fit a 24 GB A10G at all.",
        ),
        DesignCorrection(
            "7B base at 4 bits (003)",
            "~14 GB",
            f"{_gb(small_q4)} (llama-3.1-8b q4_k_m), {_gb(qwen7_q4)} (qwen2.5-7b)",
            f"14-16 GB is the f16 size ({_gb(small_f16)} for the 8B); 4-5 bits per weight is "
            "under a third of it.",
        ),
        DesignCorrection(
            "one rank-16 LoRA adapter, q/k/v/o (002, 003)",
            "~200 MB",
            f"{_mb(ad_small)} on the 8B in f16 ({_mb(ad_small_f32)} f32, "
            f"{_mb(ad_small_all)} on all 7 projections); {_mb(ad_big)} on the 70B "
            f"({_mb(ad_big_f32)} f32)",
            "rank x sum over targeted matrices of (in + out) x layers x bytes; k and v are "
            "narrow (8 KV heads), so an adapter is far smaller than 200 MB on a 7-8B.",
        ),
        DesignCorrection(
            "35 adapters: 5 archetypes x 7 tasks",
            "1.4 GB (002); 7 GB (003)",
            f"{_gb(35 * ad_small)} on the 8B, {_gb(35 * ad_big)} on the 70B (f16)",
            "002's 1.4 GB is one archetype's 7 x 200 MB; its own 0.2 x 5 x 7 in the code is "
            "7 GB, as 003 says.",
        ),
        DesignCorrection(
            "g5.2xlarge total (002): 70B + adapters + engine",
            "21 + 1.4 + 1.6 = 24 GB, fits",
            f"{_gb(big_total.used_bytes)} with overheads and headroom, of "
            f"{_gb(a10g.memory_bytes)}: does not fit",
            f"its own numbers add to {design_sum_70b:.1f} GB; a 70B needs two 24 GB GPUs "
            "for the weights alone, or an 80 GB one.",
        ),
        DesignCorrection(
            "KV cache (002, 003)",
            "not counted (1.6 GB engine overhead)",
            f"{kv_small // 1024} KiB/token on the 8B, {kv_big // 1024} KiB on the 70B; a batch "
            f"of {DESIGN_BATCH} at 4,096 tokens: {_gb(DESIGN_BATCH * 4096 * kv_small)} and "
            f"{_gb(DESIGN_BATCH * 4096 * kv_big)}",
            f"with the 8B and 35 adapters an A10G has {_gb(small_total.free_bytes)} left: "
            f"{small_total.max_sequences} sequences of 4,096 tokens, not {DESIGN_BATCH}.",
        ),
        DesignCorrection(
            "inferences per NPC action (002)",
            f"{DESIGN_TASKS_PER_ACTION} (one per task adapter)",
            "1",
            "an action is one decision by one task adapter (action_policy), or one pass with "
            "the archetype's adapters stacked on the sequence; running all 7 in turn is 7x "
            "the work and the 100-200 ms chain latency the design itself warns about.",
        ),
        DesignCorrection(
            "update rate (002)",
            f"{DESIGN_ACTION_HZ} Hz for every NPC",
            "gold 2 Hz, silver 1 Hz, bronze 0.05 Hz (15/35/50 %)",
            "003's activation tiers: NPCs near the player refresh their intent at 1-2 Hz, "
            "ambient ones only bark now and then.",
        ),
        DesignCorrection(
            f"server throughput, {device} (002)",
            f"{DESIGN_SERVER_INFERENCES_PER_S:g} inferences/s (batch 50, 1 batch/s)",
            f"{corrected.prefill_tokens_per_s:,.0f} prefill + "
            f"{corrected.decode_tokens_per_s:,.0f} decode tokens/s ({model} {quant}): "
            f"{_decisions_per_s(corrected):,.0f} gold decisions/s",
            f"the 8B at q4_k_m on an A10G makes {_decisions_per_s(reference):,.0f} gold "
            "decisions/s, so 50/s is the right order for it; the 70B the design names costs "
            f"{big_params / small_params:.1f}x the FLOPs per token (and does not fit). A "
            "decision's cost is its new prompt tokens (prefill, compute-bound) plus a few "
            "decoded ones (bandwidth-bound). Roofline estimates: measure them.",
        ),
        DesignCorrection(
            "NPCs per g5.2xlarge (002 code)",
            f"{DESIGN_MAX_NPCS_PER_SERVER} concurrent at {DESIGN_SERVER_INFERENCES_PER_S:g} "
            "inferences/s",
            f"{design_per_server:.0f} by its own rates; {fixed_per_server:.0f} with tiers "
            f"({model} {quant} on {device})",
            f"{DESIGN_MAX_NPCS_PER_SERVER} NPCs x {DESIGN_ACTION_HZ} Hz x "
            f"{DESIGN_TASKS_PER_ACTION} = "
            f"{DESIGN_MAX_NPCS_PER_SERVER * DESIGN_ACTION_HZ * DESIGN_TASKS_PER_ACTION:g} "
            f"inferences/s, {DESIGN_MAX_NPCS_PER_SERVER * DESIGN_ACTION_HZ * 7 / 50:.1f}x what "
            "the same server is said to serve.",
        ),
        DesignCorrection(
            "servers for 10,000 NPCs by device",
            "175 g5.2xlarge (the only device considered)",
            ", ".join(f"{name} {count}" for name, count in by_device.items()),
            f"with {model} {quant}, one inference per action and tiers; a decision is mostly "
            "prefill, which is compute-bound, so GPUs with more tensor throughput need far "
            "fewer servers.",
        ),
    )
    examples = []
    for n in npcs:
        design = scale(
            n,
            uniform_tier(DESIGN_ACTION_HZ),
            server=design_throughput(),
            tasks_per_action=DESIGN_TASKS_PER_ACTION,
        )
        fixed = scale(n, ACTIVATION_TIERS, server=corrected)
        stated = DESIGN_STATED_SERVERS.get(n)
        if stated is None:
            said = f"the design gives no figure for {n:,} NPCs"
            stated = design.servers
        elif stated == design.servers:
            said = f"the design's {stated} matches its formula"
        else:
            said = (
                f"the design states {stated} but its own formula gives "
                f"{design.inferences_per_s:,.1f} / {DESIGN_SERVER_INFERENCES_PER_S:g} = "
                f"{design.servers}"
            )
        prefill_time = fixed.prefill_tokens_per_s / corrected.prefill_tokens_per_s
        decode_time = fixed.decode_tokens_per_s / corrected.decode_tokens_per_s
        prefill_share = prefill_time / (prefill_time + decode_time or 1)
        bound = (
            "resident KV"
            if fixed.servers_for_memory > fixed.servers_for_throughput
            else f"server time, {prefill_share:.0%} of it prefill"
        )
        examples.append(
            ScaleExample(
                npcs=n,
                design_stated_servers=stated,
                design=design,
                corrected=fixed,
                reason=(
                    f"{said}. Corrected: {fixed.inferences_per_s:,.0f} inferences/s "
                    f"(1 per action, tiered) instead of {design.inferences_per_s:,.0f}; "
                    f"{fixed.servers} servers, bound by {bound} "
                    f"({fixed.servers_for_throughput} for throughput, "
                    f"{fixed.servers_for_memory} for {_gb(fixed.resident_kv_bytes)} of KV)."
                ),
            )
        )
    return DesignReview(model, quant.lower(), device, claims, tuple(examples))
