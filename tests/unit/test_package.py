"""The package's shape: cheap import, public surfaces, layering, missing extras."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mythic
from mythic import MissingExtraError

pytestmark = pytest.mark.unit

SRC = Path(mythic.__file__).resolve().parent
PUBLIC = [
    "mythic",
    "mythic.config",
    "mythic.contracts",
    "mythic.engine",
    "mythic.knowledge",
    "mythic.memory",
    "mythic.dialogue",
    "mythic.server",
    "mythic.client",
    "mythic.control",
    "mythic.speech",
    "mythic.training",
    "mythic.archetypes",
    "mythic.route",
    "mythic.jobs",
    "mythic.capacity",
    "mythic.voice",
    "mythic.scenes",
    "mythic.observability",
    "mythic.safety",
    "mythic.mcp",
]

# ARCHITECTURE.md: imports point down only. Each package may import the ones listed.
BASE = {"_errors", "_extras", "_heap", "config", "contracts", "observability"}
# What the server and the CLI stand on: every layer under the edges.
UNDER_EDGES = BASE | {
    "engine",
    "safety",
    "mcp",
    "knowledge",
    "memory",
    "speech",
    "training",
    "route",
    "jobs",
    "archetypes",
    "capacity",
    "dialogue",
    "voice",
    "scenes",
}
ALLOWED: dict[str, set[str]] = {
    "config": {"_errors"},
    "contracts": {"_errors"},
    "observability": {"_errors"},
    "engine": BASE,
    # A world's content policy (`safety.yaml`, a card's `safety:`) is a card the knowledge
    # loads: its models are the safety package's, the checks of which need nothing else.
    "knowledge": BASE | {"safety"},
    "safety": BASE,
    "memory": BASE,
    "speech": BASE,
    # Training is fed by the engine's models and chat formats and the knowledge's worlds and
    # prompts: it sits just above them, below the archetype chains it trains for.
    "training": BASE | {"engine", "knowledge"},
    "route": BASE | {"engine", "knowledge", "memory"},
    "archetypes": BASE | {"engine", "knowledge", "memory", "training"},
    # The planner is arithmetic on a model's shape: it needs nothing but the base.
    "capacity": BASE,
    # The bronze queue stands on the stores (see QUEUE below); its workers run a job through
    # the router, so the package sits just above `route`, and nothing under it imports jobs.
    "jobs": BASE | {"engine", "knowledge", "memory", "route"},
    "dialogue": BASE | {"engine", "knowledge", "memory", "route", "archetypes", "safety"},
    # Speech wraps a dialogue turn: voice drives the cast's NPCs, and never the server.
    "voice": BASE | {"engine", "knowledge", "memory", "speech", "route", "archetypes", "dialogue"},
    # Scenes play several NPCs' turns in one conversation: they drive the cast, like voice.
    "scenes": BASE | {"engine", "knowledge", "memory", "route", "archetypes", "dialogue"},
    # MCP: the client (tools of MCP servers, with route's breaker) and Mythic's own servers
    # (lore and memory, read-only; the game state and bronze jobs over a server's HTTP API;
    # utilities with the content filter). The dialogue never imports it: the server plugs the
    # client into the stage (`Stage.external`).
    "mcp": BASE | {"engine", "knowledge", "memory", "route", "safety"},
    "server": UNDER_EDGES,
    # A game vendors the client without the server: it may import only the wire contracts.
    "client": {"_errors", "_extras", "contracts"},
    "control": {"_errors", "contracts"},
    "cli": UNDER_EDGES | {"server", "client", "control"},
}
# ARCHITECTURE.md: "The bronze queue itself imports nothing above it"; only its workers use the
# router.
QUEUE = ("jobs/_queue.py", BASE | {"memory"})
HEAVY = [
    "llama_cpp",
    "torch",
    "numpy",
    "transformers",
    "redis",
    "asyncpg",
    "onnxruntime",
    "faster_whisper",
    "ctranslate2",
    "piper",
]


def test_import_loads_no_model_and_no_heavy_library() -> None:
    code = (
        "import sys, mythic, mythic.config, mythic.engine, mythic.knowledge, "
        "mythic.memory, mythic.route, mythic.dialogue, mythic.speech, mythic.training, "
        "mythic.archetypes, mythic.jobs, mythic.capacity, mythic.voice, mythic.cli\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", PUBLIC)
def test_public_surface_is_declared_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported, f"{name} declares an empty __all__"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr}, which does not exist"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "mythic" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down_the_layers(package: str) -> None:
    for file in (SRC / package).rglob("*.py"):
        wrong = _imports(file) - ALLOWED[package] - {package}
        assert not wrong, f"{file.relative_to(SRC)} imports {sorted(wrong)} (layering)"


def test_the_bronze_queue_imports_nothing_above_it() -> None:
    path, allowed = QUEUE
    wrong = _imports(SRC / path) - allowed - {"jobs"}
    assert not wrong, f"{path} imports {sorted(wrong)}: only the workers stand above route"


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(ALLOWED) | BASE


class ImportGraph:
    """Which module of `mythic` imports which: every `import` and `from` statement in a file,
    lazy ones inside functions and `TYPE_CHECKING` ones included. A name taken from a module
    that re-exports it (a package's `__init__`) counts as an import of the module defining it.
    """

    def __init__(self, root: Path) -> None:
        paths = {self._name(root, path): path for path in root.rglob("*.py")}
        self.trees = {name: ast.parse(path.read_text()) for name, path in paths.items()}
        self.packages = {name for name, path in paths.items() if path.name == "__init__.py"}
        self.edges = {name: self._imports(name) for name in self.trees}

    @staticmethod
    def _name(root: Path, path: Path) -> str:
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        parts = module.split(".")
        package = parts if module in self.packages else parts[:-1]
        base = package[: len(package) - node.level + 1]
        return ".".join([*base, node.module] if node.module else base)

    def _defining(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        if f"{module}.{name}" in self.trees:
            return f"{module}.{name}"
        if module not in self.trees or module in seen:
            return module
        for node in self.trees[module].body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, node)
                        return self._defining(source, alias.name, seen | {module})
        return module

    def _imports(self, module: str) -> set[str]:
        found: set[str] = set()
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node)
                found |= {self._defining(source, alias.name) for alias in node.names}
        return {name for name in found if name in self.trees and name != module}

    def cycle(self) -> list[str] | None:
        """One import cycle (its modules, the first repeated at the end), or None."""
        done: set[str] = set()
        for start in sorted(self.edges):
            # Depth first, iteratively: each frame is a module and the imports left to visit.
            frames = [(start, iter(sorted(self.edges[start])))]
            path, on_path = [start], {start}
            while frames:
                module, left = frames[-1]
                following = next(left, None)
                if following is None:
                    frames.pop()
                    on_path.discard(path.pop())
                    done.add(module)
                elif following in done:
                    continue
                elif following in on_path:
                    return [*path[path.index(following) :], following]
                else:
                    frames.append((following, iter(sorted(self.edges[following]))))
                    on_path.add(following)
                    path.append(following)
        return None


def test_the_cycle_check_sees_lazy_relative_and_re_exported_imports(tmp_path: Path) -> None:
    root = tmp_path / "game"
    (root / "npc").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "npc" / "__init__.py").write_text("from game.npc._actor import Actor\n")
    (root / "npc" / "_actor.py").write_text("class Actor: ...\n")
    (root / "npc" / "_cast.py").write_text("def cast():\n    from ._lines import line\n")
    (root / "_lines.py").write_text("line = 1\n")
    (root / "npc" / "_lines.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from game.npc import Actor\n"
    )
    graph = ImportGraph(root)
    assert graph.edges["game.npc"] == {"game.npc._actor"}
    assert graph.edges["game.npc._cast"] == {"game.npc._lines"}
    assert graph.edges["game.npc._lines"] == {"game.npc._actor"}
    assert graph.cycle() is None
    (root / "npc" / "_actor.py").write_text("def act():\n    from game.npc._cast import cast\n")
    (root / "npc" / "_cast.py").write_text("from . import _lines\n")
    cycle = ImportGraph(root).cycle()
    assert cycle == ["game.npc._actor", "game.npc._cast", "game.npc._lines", "game.npc._actor"]


def test_no_module_imports_itself_through_others() -> None:
    """ARCHITECTURE.md: no import cycles, not even lazy or TYPE_CHECKING ones."""
    cycle = ImportGraph(SRC).cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from mythic.engine import LlamaCppBackend, ResolvedModel

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    resolved = ResolvedModel(name="x", path=Path("x.gguf"), chat_format=None, context_length=None)
    with pytest.raises(MissingExtraError) as info:
        LlamaCppBackend(resolved)
    assert isinstance(info.value, ImportError)
    assert "pip install 'mythic[llm]'" in str(info.value)
    assert info.value.extra == "llm"


def test_py_typed_is_shipped() -> None:
    assert (SRC / "py.typed").is_file()


CUDA_LLAMA_CPP = """import sys
ONNXRUNTIME_FIRST = "onnxruntime" in sys.modules
def llama_backend_init():
    pass
"""


def _imports_onnxruntime_first(path: Path | None) -> str:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    code = (
        "import sys\n"
        "from mythic.engine._llamacpp import _llama_cpp\n"
        "lib = _llama_cpp()\n"
        "print(getattr(lib, 'ONNXRUNTIME_FIRST', 'onnxruntime' in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_cuda_build_of_llama_cpp_loads_after_onnxruntime(tmp_path: Path) -> None:
    """onnxruntime segfaulted in its own import once a CUDA llama.cpp had loaded (an H200):
    the engine imports it first. Here `llama_cpp` is a package shaped like a CUDA build
    (libggml-cuda in its lib/) that records what was imported before it; onnxruntime is the
    real one."""
    pytest.importorskip("onnxruntime")
    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text(CUDA_LLAMA_CPP)
    (package / "lib" / "libggml-cuda.so").write_bytes(b"")
    assert _imports_onnxruntime_first(tmp_path) == "True"


def test_a_cpu_build_of_llama_cpp_imports_no_onnxruntime() -> None:
    from mythic.engine._llamacpp import _cuda_build

    if importlib.util.find_spec("llama_cpp") is None or _cuda_build():
        pytest.skip("needs a CPU build of llama-cpp-python")
    if importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("needs onnxruntime (the speech extra): without it nothing could import it")
    assert _imports_onnxruntime_first(None) == "False"


def test_a_cuda_build_is_found_where_llama_cpp_lib_path_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mythic.engine._llamacpp import _cuda_build

    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    if _cuda_build():
        pytest.skip("the installed llama-cpp-python is a CUDA build")
    (tmp_path / "libggml-cuda.so").write_bytes(b"")
    assert _cuda_build()
