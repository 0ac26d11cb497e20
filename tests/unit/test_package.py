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
]

# ARCHITECTURE.md: imports point down only. Each package may import the ones listed.
BASE = {"_errors", "_extras", "config", "contracts", "obs"}
ALLOWED: dict[str, set[str]] = {
    "config": {"_errors"},
    "contracts": {"_errors"},
    "engine": BASE,
    "knowledge": BASE,
    "memory": BASE,
    "speech": BASE,
    # Training is fed by the engine's models and chat formats and the knowledge's worlds and
    # prompts: it sits just above them, below the archetype chains it trains for.
    "training": BASE | {"engine", "knowledge"},
    "route": BASE | {"engine", "knowledge", "memory"},
    "archetypes": BASE | {"engine", "knowledge", "memory", "training"},
    "dialogue": BASE | {"engine", "knowledge", "memory", "route", "archetypes"},
    "server": BASE
    | {"engine", "knowledge", "memory", "speech", "training", "route", "archetypes", "dialogue"},
    # A game vendors the client without the server: it may import only the wire contracts.
    "client": {"_errors", "_extras", "contracts"},
    "control": {"_errors", "contracts"},
    "cli": BASE
    | {
        "engine",
        "knowledge",
        "memory",
        "speech",
        "training",
        "route",
        "archetypes",
        "dialogue",
        "server",
        "client",
        "control",
    },
}
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
        "mythic.archetypes, mythic.cli\n"
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


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(ALLOWED) | BASE


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
