"""What a running server holds in memory, and where: `mythic serve` on the example world.

Starts `mythic serve --world examples/worlds/ravenmoor` (with `--voice` unless `--no-voice`) on
a free loopback port, waits for `/readyz`, has each of `--npcs` NPCs answer a line over HTTP
(`POST /v1/npcs/{id}/say`: retrieval, the engine, memory: what lazily loads, loads), then reads
the resident memory of the server and of every process under it from `/proc/<pid>/smaps`,
mapping by mapping, and groups it: the GGUF models (mapped files), each Python package's native
libraries (torch, onnxruntime, llama.cpp...), other files, and anonymous memory (the heap:
the KV memory llama.cpp reserves, PyTorch's tensors, Python's objects). Beside it, what the
engine settings reserve for KV: `n_ctx x max_sequences` cells of each model at its bytes a
cell (from its GGUF: layers x KV heads x head size x 2 (K and V) x 2 bytes, f16), and the bytes
one active NPC's full context takes. Reserved is not resident: the engine hands back the KV
buffer llama.cpp zeroes at load, and a cell's bytes become resident when it is written, so an
active NPC costs its bytes a token times the tokens its sequence holds. Writes
bench/results/memory_footprint.json (memory_footprint_no_voice.json with --no-voice).

    .venv/bin/python bench/memory_footprint.py [--npcs 3] [--no-voice]

The issue's target is 1.5 GB resident for the example world on the default model.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _procs import free_port, process_tree  # noqa: E402
from _results import write_results  # noqa: E402
from mythic.config import effective_route, load_settings  # noqa: E402
from mythic.engine._gguf import read_gguf_info  # noqa: E402
from mythic.engine.models import ModelStore  # noqa: E402
from mythic.route import engine_sizes  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "memory_footprint.json"
WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
TARGET_MB = 1536
LINE = "Evening. What news from the road?"


def _role(pid: int) -> str:
    """A process by what it runs: its command line, shortened, and its pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            args = cmdline.read().decode(errors="replace").split("\0")
    except OSError:
        return str(pid)
    words = [a for a in args[1:] if a][:4]
    return f"{' '.join(words)[:60]} ({pid})"


def _group(path: str) -> str:
    """What a mapping belongs to, in a few words."""
    if not path or path.startswith("[") or path.startswith("/memfd:") or path == "[heap]":
        return "anonymous (heap: KV memory, tensors, Python objects)"
    if path.endswith(".gguf"):
        return f"model file {Path(path).name}"
    package = re.search(r"site-packages/([^/]+)", path)
    if package:
        name = package.group(1)
        name = name.removesuffix(".libs").split("-")[0].split(".")[0]
        return f"native libraries of {name}"
    return "other files (Python, system libraries)"


def _rss_by_group(pids: list[int]) -> tuple[Counter[str], dict[int, int]]:
    """Resident kB by group over `pids`, and each process's total."""
    groups: Counter[str] = Counter()
    per_pid: dict[int, int] = {}
    for pid in pids:
        total = 0
        path = ""
        try:
            lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                path = parts[5] if len(parts) > 5 else ""
            elif parts and parts[0] == "Rss:":
                kb = int(parts[1])
                groups[_group(path)] += kb
                total += kb
        per_pid[pid] = total
    return groups, per_pid


def _kv(model: str, n_ctx: int, sequences: int) -> dict[str, Any]:
    """What the engine reserves for `model`'s KV (f16 keys and values)."""
    path = ModelStore(load_settings().engine.models_dir).resolve(model).path
    meta = read_gguf_info(path).metadata
    arch = str(meta["general.architecture"])

    def number(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if not isinstance(value, int):
            raise SystemExit(f"{path.name} has no {arch}.{key}")
        return value

    heads = number("attention.head_count")
    head_dim = number("attention.key_length", number("embedding_length") // heads)
    per_token = number("block_count") * number("attention.head_count_kv", heads) * head_dim * 4
    context = min(n_ctx, number("context_length", n_ctx))
    return {
        "model": model,
        "bytes_per_token": per_token,
        "bytes_per_npc_context": per_token * context,
        "sequences": sequences,
        "reserved_mb": per_token * context * sequences / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npcs", type=int, default=3)
    parser.add_argument("--no-voice", action="store_true")
    args = parser.parse_args()
    settings = load_settings()
    port = free_port()
    command = [sys.executable, "-m", "mythic", "serve", "--world", str(WORLD), "--port", str(port)]
    if not args.no_voice:
        command.append("--voice")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 600
        seen = b""
        while b"NPCs: " not in seen:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mythic serve did not start: {seen.decode()[-2000:]}")
            if select.select([proc.stdout], [], [], 5)[0]:
                seen += os.read(proc.stdout.fileno(), 4096)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
            while http.get("/readyz").status_code != 200:
                time.sleep(0.5)
            ready_groups, _ = _rss_by_group(process_tree(proc.pid))
            npcs = [n["npc_id"] for n in http.get("/v1/npcs").json()["npcs"]][: args.npcs]
            for npc in npcs:
                http.post(f"/v1/npcs/{npc}/say", json={"text": LINE}).raise_for_status()
        pids = process_tree(proc.pid)
        groups, per_pid = _rss_by_group(pids)
        roles = {pid: _role(pid) for pid in pids}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    engine = settings.engine
    # Each embedded model's engine as the server sized it (the gold endpoint's is smaller).
    sizes = engine_sizes(effective_route(settings).endpoints.values(), engine)
    kv = [_kv(model, size["n_ctx"], size["max_sequences"]) for model, size in sizes.items()]
    total_mb = sum(groups.values()) / 1024
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    print(f"{'resident memory of the server and its workers':<60} {total_mb:8.0f} MB")
    for name, kb in rows:
        print(f"  {name:<58} {kb / 1024:8.0f} MB")
    for pid, kb in per_pid.items():
        print(f"  process {roles[pid]:<50} {kb / 1024:8.0f} MB")
    for k in kv:
        print(
            f"KV reserved for {k['model']}: {k['reserved_mb']:.0f} MB "
            f"({k['bytes_per_token'] / 1024:.1f} KB a token, "
            f"{k['bytes_per_npc_context'] / 2**20:.1f} MB an NPC's full context)"
        )
    print(f"target: <= {TARGET_MB} MB: {'met' if total_mb <= TARGET_MB else 'not met'}")
    write_results(
        RESULTS if not args.no_voice else RESULTS.with_name("memory_footprint_no_voice.json"),
        ROOT,
        results={
            "total_mb": total_mb,
            "target_mb": TARGET_MB,
            "processes": len(pids),
            "per_process_mb": {roles[pid]: kb / 1024 for pid, kb in per_pid.items()},
            "groups_mb": {name: kb / 1024 for name, kb in rows},
            "ready_before_turns_mb": sum(ready_groups.values()) / 1024,
            "kv": kv,
        },
        world=WORLD.name,
        voice=not args.no_voice,
        npcs_talked=args.npcs,
        engines=sizes,
    )


if __name__ == "__main__":
    main()
