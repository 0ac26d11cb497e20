"""Where archetype chains are kept.

`YamlRegistry` keeps the chains in one YAML file (a world's `archetypes.yaml`: the embedded
default), `RedisRegistry` in Redis, shared by several servers. Both number each task's adapter
versions, keep the earlier ones, change a chain atomically and never expire anything.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import re
import stat
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import yaml
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from mythic._extras import require
from mythic.archetypes._chain import (
    _TASKS,
    SERVED_TASKS,
    AdapterInfo,
    AdapterTask,
    ArchetypeChain,
    InvalidAdapterError,
    RankBudgetError,
    RegistryError,
    RegistryFormatError,
    RegistryProblem,
    RegistryUnavailableError,
    Slug,
    UnknownArchetypeError,
    _Entry,
    _Model,
    _name,
    _retire,
    _task,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)

REGISTRY_FILE = "archetypes.yaml"
"""The registry's file in a world folder."""

MAX_REGISTRY_BYTES = 4 * 1024 * 1024
"""A registry file larger than this is refused rather than parsed."""

DEFAULT_PREFIX = "mythic:archetypes"
"""The Redis key prefix of `RedisRegistry`."""

# -- the registry ---------------------------------------------------------------------------------

Change = Callable[[_Entry | None], _Entry | None]


class ArchetypeRegistry(ABC):
    """Where archetype chains are kept.

    This class checks the arguments, numbers adapter versions and keeps their history; a
    backend implements `_read`, `_chains` and `_transact` (an atomic read-modify-write of one
    archetype). Changes are pure functions of the stored chain, so a backend may run them again
    when another writer got there first.
    """

    where: str
    """Where the chains are kept, for messages: a file, or a Redis URL and key prefix."""

    async def get(self, archetype: str) -> ArchetypeChain | None:
        """The chain of `archetype`, or None."""
        entry = await self._read(_name(archetype))
        return entry.chain if entry else None

    async def require(self, archetype: str) -> ArchetypeChain:
        """The chain of `archetype`.

        Raises:
            UnknownArchetypeError: none is registered; the message lists those that are.
        """
        chain = await self.get(archetype)
        if chain is None:
            raise UnknownArchetypeError(archetype, [c.archetype for c in await self.list()])
        return chain

    async def list(self) -> builtins.list[ArchetypeChain]:
        """Every chain, by archetype name."""
        return sorted(await self._chains(), key=lambda c: c.archetype)

    async def adapter_for(self, archetype: str, task: AdapterTask | str) -> AdapterInfo | None:
        """The current adapter of `archetype` for `task`; None: no chain or no adapter (the
        base model serves the task)."""
        task = _task(task)
        chain = await self.get(archetype)
        return chain.adapters.get(task) if chain else None

    async def history(self, archetype: str, task: AdapterTask | str) -> builtins.list[AdapterInfo]:
        """Every kept version of the adapter of `archetype` for `task`, oldest first; the last
        is the current one, unless the chain no longer has one.

        Raises:
            UnknownArchetypeError: no chain of that name.
        """
        task = _task(task)
        entry = await self._read(_name(archetype))
        if entry is None:
            raise UnknownArchetypeError(archetype, [c.archetype for c in await self.list()])
        current = entry.chain.adapters.get(task)
        return [*entry.history.get(task, ()), *([current] if current else [])]

    async def put(self, chain: ArchetypeChain) -> ArchetypeChain:
        """Create or replace a whole chain, adapters included. An adapter it replaces or drops
        is kept in the history; to add a new version of one, `register_adapter` numbers it."""
        name = _name(chain.archetype)
        entry = await self._transact(name, lambda old: _retire(old, chain))
        assert entry is not None
        return entry.chain

    async def update(
        self, archetype: str, change: Callable[[ArchetypeChain], ArchetypeChain]
    ) -> ArchetypeChain:
        """Change one chain atomically: `change` gets the stored chain (a new, empty one if
        there is none) and returns the new one, e.g. `lambda c: c.changed(voice="vampire")`. It
        may be called more than once when other writers race, so it must not have effects."""
        name = _name(archetype)

        def apply(old: _Entry | None) -> _Entry:
            chain = change(old.chain if old else ArchetypeChain(archetype=name))
            if chain.archetype != name:
                raise RegistryError(f"an update of {name!r} cannot rename it {chain.archetype!r}")
            return _retire(old, chain)

        entry = await self._transact(name, apply)
        assert entry is not None
        return entry.chain

    async def register_adapter(self, archetype: str, info: AdapterInfo) -> AdapterInfo:
        """Add or replace the adapter of `info.task`, creating the chain if there is none. The
        registry numbers it (one more than the task's latest version) and keeps the one it
        replaces in the history; returns the adapter as registered. An adapter of a task that
        is not `served` is kept, and a warning says that no request applies it.

        Raises:
            RankBudgetError: the adapter alone is over the chain's `max_total_rank`.
        """
        name = _name(archetype)
        if not isinstance(info, AdapterInfo):
            raise InvalidAdapterError(f"expected an AdapterInfo, got {type(info).__name__}")

        def add(old: _Entry | None) -> _Entry:
            chain = old.chain if old else ArchetypeChain(archetype=name)
            if info.rank > chain.max_total_rank:
                raise RankBudgetError(name, [info], chain.max_total_rank)
            earlier = [*(old.history.get(info.task, ()) if old else ()), *chain.adapters.values()]
            latest = max((a.version for a in earlier if a.task == info.task), default=0)
            new = info.model_copy(update={"version": latest + 1})
            return _retire(old, chain.changed(adapters={**chain.adapters, info.task: new}))

        entry = await self._transact(name, add)
        assert entry is not None
        registered = entry.chain.adapters[info.task]
        if not info.task.served:
            served = " and ".join(sorted(SERVED_TASKS))
            log.warning(
                "%s %s v%d is registered but not served: Mythic applies only %s adapters",
                name,
                info.task.value,
                registered.version,
                served,
            )
        return registered

    async def remove(self, archetype: str) -> bool:
        """Forget a chain and its history; False when there was none."""
        found = False

        def drop(old: _Entry | None) -> None:
            nonlocal found
            found = old is not None

        await self._transact(_name(archetype), drop)
        return found

    async def aclose(self) -> None:  # noqa: B027 - a backend with connections overrides it
        """Release connections."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @abstractmethod
    async def _read(self, archetype: str) -> _Entry | None:
        """The stored chain and history of `archetype`."""

    @abstractmethod
    async def _chains(self) -> builtins.list[ArchetypeChain]:
        """Every stored chain, in any order."""

    @abstractmethod
    async def _transact(self, archetype: str, change: Change) -> _Entry | None:
        """Atomically replace the entry of `archetype` by `change(entry)` (None: delete it);
        nothing is written when `change` returns the entry it got. Returns what is stored."""


# -- YAML -----------------------------------------------------------------------------------------

_HEADER = """\
# Archetype chains: per archetype, the LoRA adapter of each task and the servers hosting it
# (voice, face and body are kept but not used yet). Change it with `mythic archetypes register`
# or by hand; Mythic rewrites this file on each change, so comments are not kept.
"""


class _RegistryFile(_Model):
    schema_version: Literal[1] = 1
    archetypes: dict[Slug, ArchetypeChain] = Field(default_factory=dict)
    history: dict[Slug, dict[AdapterTask, tuple[AdapterInfo, ...]]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: Any) -> Any:
        # In the file a chain's name is its key; the model carries it as a field.
        if isinstance(data, dict) and isinstance(data.get("archetypes"), dict):
            chains = {
                key: {"archetype": key, **value}
                if isinstance(value, dict) and "archetype" not in value
                else value
                for key, value in data["archetypes"].items()
            }
            return {**data, "archetypes": chains}
        return data

    def entry(self, archetype: str) -> _Entry | None:
        chain = self.archetypes.get(archetype)
        return _Entry(chain, self.history.get(archetype, {})) if chain else None

    def mismatches(self) -> Iterator[tuple[tuple[int | str, ...], str]]:
        """Where a record sits under another name than its own: (location, message)."""
        for key, chain in self.archetypes.items():
            if chain.archetype != key:
                yield (
                    ("archetypes", key, "archetype"),
                    (f"names the archetype {chain.archetype!r} under the key {key!r}"),
                )
        for name, tasks in self.history.items():
            for task, infos in tasks.items():
                for i, info in enumerate(infos):
                    if info.task != task:
                        yield (
                            ("history", name, task.value, i, "task"),
                            (f"a {info.task.value} adapter in the history of {task.value}"),
                        )


def _line_of(node: yaml.Node, loc: Sequence[int | str]) -> int:
    """The line of the value at `loc` in a YAML document, as deep as it can be followed."""
    line = node.start_mark.line + 1
    current: yaml.Node | None = node
    for part in loc:
        if isinstance(current, yaml.MappingNode):
            found = next(
                (
                    (k, v)
                    for k, v in current.value
                    if isinstance(k, yaml.ScalarNode) and k.value == str(part)
                ),
                None,
            )
            if found is None:
                break
            line, current = found[0].start_mark.line + 1, found[1]
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(current.value):
                break
            current = current.value[part]
            line = current.start_mark.line + 1
        else:
            break
    return line


def _problems(source: str, exc: ValidationError, node: yaml.Node | None) -> list[RegistryProblem]:
    problems = []
    bad_keys = {tuple(e["loc"][:-1]) for e in exc.errors() if e["loc"][-1:] == ("[key]",)}
    for err in exc.errors():
        loc = tuple(err["loc"])
        # A bad chain name is also reported as a bad `archetype` field: once is enough.
        if loc[-1:] == ("archetype",) and loc[:-1] in bad_keys:
            continue
        name = ".".join(str(p) for p in loc if p != "[key]") or None
        line = _line_of(node, loc) if node is not None else None
        problems.append(RegistryProblem(source, line, name, err["msg"]))
    return problems


def _malformed(source: str, line: int | None, message: str) -> RegistryFormatError:
    return RegistryFormatError([RegistryProblem(source, line, None, message)])


def _parse_file(source: str, text: str) -> _RegistryFile:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        why = exc.problem or exc.context or "invalid YAML"
        line = mark.line + 1 if mark else None
        raise _malformed(source, line, f"invalid YAML: {why}") from None
    except yaml.YAMLError as exc:
        raise _malformed(source, None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise _malformed(source, None, "invalid YAML: nested too deeply") from None
    if data is None or node is None:
        return _RegistryFile()
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise _malformed(source, 1, f"expected a mapping (archetypes: ...), got a {kind}")
    try:
        parsed = _RegistryFile.model_validate(data)
    except ValidationError as exc:
        raise RegistryFormatError(_problems(source, exc, node)) from None
    problems = [
        RegistryProblem(source, _line_of(node, loc), ".".join(map(str, loc)), message)
        for loc, message in parsed.mismatches()
    ]
    if problems:
        raise RegistryFormatError(problems)
    return parsed


def _dump_file(data: _RegistryFile) -> str:
    chains = {
        name: data.archetypes[name].model_dump(
            mode="json", exclude_none=True, exclude={"archetype"}
        )
        for name in sorted(data.archetypes)
    }
    history = {
        name: {
            task.value: [i.model_dump(mode="json", exclude_none=True) for i in infos]
            for task, infos in tasks.items()
            if infos
        }
        for name, tasks in sorted(data.history.items())
        if any(tasks.values())
    }
    doc: dict[str, Any] = {"schema_version": 1, "archetypes": chains}
    if history:
        doc["history"] = history
    return _HEADER + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


class YamlRegistry(ArchetypeRegistry):
    """Archetype chains in one YAML file: the embedded default, a world's `archetypes.yaml`.

    A missing file is an empty registry, created at the first change. Each change reads,
    changes and rewrites the whole file under a lock on its folder (`flock`: processes on one
    machine take turns; without `fcntl`, on Windows, keep to one writer at a time). The new
    content goes to a temporary file moved over the old one, so readers never see half a file
    and a failed write leaves the old one as it was. A malformed file is never overwritten.
    """

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 10.0) -> None:
        """`path`: the YAML file, or a folder holding `archetypes.yaml`."""
        p = Path(path).expanduser()
        self.path = p / REGISTRY_FILE if p.is_dir() else p
        self.where = str(self.path)
        self.lock_timeout_s = lock_timeout_s
        self._lock = asyncio.Lock()

    @property
    def root(self) -> Path:
        """The folder relative adapter paths start from."""
        return self.path.parent

    async def _read(self, archetype: str) -> _Entry | None:
        return (await asyncio.to_thread(self._load)).entry(archetype)

    async def _chains(self) -> builtins.list[ArchetypeChain]:
        return builtins.list((await asyncio.to_thread(self._load)).archetypes.values())

    async def _transact(self, archetype: str, change: Change) -> _Entry | None:
        async with self._lock:
            return await asyncio.to_thread(self._transact_sync, archetype, change)

    def _transact_sync(self, archetype: str, change: Change) -> _Entry | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unavailable("create the folder of", exc) from exc
        with self._folder_lock():
            data = self._load()
            old = data.entry(archetype)
            new = change(old)
            if new is old:
                return old
            chains = dict(data.archetypes)
            history = dict(data.history)
            if new is None:
                chains.pop(archetype, None)
                history.pop(archetype, None)
            else:
                chains[archetype] = new.chain
                history[archetype] = dict(new.history)
            self._write(_RegistryFile(archetypes=chains, history=history))
            return new

    def _unavailable(self, what: str, exc: OSError) -> RegistryUnavailableError:
        return RegistryUnavailableError(f"cannot {what} {self.path}: {exc.strerror or exc}")

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        # The folder, not the file: the file is replaced at each write, and a lock on the old
        # file would not stop a writer that opened the new one.
        try:
            import fcntl
        except ImportError:
            yield
            return
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError as exc:
            raise self._unavailable("lock the folder of", exc) from exc
        try:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RegistryUnavailableError(
                            f"{self.path} stayed locked by another writer for "
                            f"{self.lock_timeout_s:g} s"
                        ) from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _load(self) -> _RegistryFile:
        source = self.where
        try:
            st = self.path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise _malformed(source, None, "not a regular file")
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_REGISTRY_BYTES + 1)
        except FileNotFoundError:
            return _RegistryFile()
        except OSError as exc:
            raise self._unavailable("read", exc) from exc
        if len(raw) > MAX_REGISTRY_BYTES:
            raise _malformed(source, None, f"larger than {MAX_REGISTRY_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed(source, None, "not UTF-8 text") from None
        return _parse_file(source, text)

    def _write(self, data: _RegistryFile) -> None:
        text = _dump_file(data)
        folder = self.path.parent
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
        except OSError:
            mode = 0o644
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise self._unavailable("write", exc) from exc
        written = False
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, self.path)
            written = True
        except OSError as exc:
            raise self._unavailable("write", exc) from exc
        finally:
            if not written:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        # The rename is durable once the folder is; not every platform can sync a folder.
        with contextlib.suppress(OSError):
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


# -- Redis ----------------------------------------------------------------------------------------

_HISTORY = TypeAdapter(tuple[AdapterInfo, ...])


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class RedisRegistry(ArchetypeRegistry):
    """Archetype chains in Redis, shared by several servers (redis-py asyncio).

    Keys, none with a TTL: `{prefix}:chain:{archetype}` (the chain as JSON), `{prefix}:history:
    {archetype}` (a hash: task -> JSON list of earlier versions) and `{prefix}:index` (the set
    of archetype names). A change is a WATCH/MULTI transaction on the archetype's two keys,
    retried when another writer changed them first, so concurrent registrations all land.
    """

    def __init__(
        self,
        redis: str | Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 2.0,
        max_attempts: int = 100,
    ) -> None:
        """`redis`: a `redis://host:port/db` URL, or a client (left open by `aclose`)."""
        aioredis = require("redis.asyncio", package="redis", extra="services")
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError, WatchError

        # Braces allowed: a prefix like `{mythic}:archetypes` puts every key in one Redis
        # Cluster slot, which MULTI across an archetype's keys needs there.
        if not re.fullmatch(r"[A-Za-z0-9_.:{}-]{1,128}", prefix):
            raise RegistryError(f"Redis key prefix {prefix!r}: letters, digits, _ . : - {{ }} only")
        self.prefix = prefix
        self.max_attempts = max_attempts
        if isinstance(redis, str):
            self._redis: Redis = aioredis.Redis.from_url(
                redis,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
            )
            self._owned = True
            url = redis
        else:
            self._redis = redis
            self._owned = False
            kwargs = redis.connection_pool.connection_kwargs
            url = (
                f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
            )
        self.where = f"{_redacted(url)} {prefix}:*"
        self._watch_error = WatchError
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

    def _keys(self, archetype: str) -> tuple[str, str]:
        return f"{self.prefix}:chain:{archetype}", f"{self.prefix}:history:{archetype}"

    @property
    def _index(self) -> str:
        return f"{self.prefix}:index"

    def _unavailable(self, what: str, exc: BaseException) -> RegistryUnavailableError:
        return RegistryUnavailableError(f"archetype registry at {self.where}: {what} failed: {exc}")

    def _parse(
        self, archetype: str, raw: bytes | str | None, history: Mapping[Any, Any]
    ) -> _Entry | None:
        if raw is None:
            return None
        ckey, hkey = self._keys(archetype)
        try:
            chain = ArchetypeChain.model_validate_json(raw)
        except ValidationError as exc:
            raise RegistryFormatError(_problems(ckey, exc, None)) from None
        if chain.archetype != archetype:
            why = f"holds the chain of {chain.archetype!r}"
            raise RegistryFormatError([RegistryProblem(ckey, None, "archetype", why)])
        tasks: dict[AdapterTask, tuple[AdapterInfo, ...]] = {}
        for raw_task, value in history.items():
            name = _text(raw_task)
            if name not in _TASKS:
                why = f"unknown task {name!r}"
                raise RegistryFormatError([RegistryProblem(hkey, None, name, why)])
            try:
                tasks[AdapterTask(name)] = _HISTORY.validate_json(value)
            except ValidationError as exc:
                raise RegistryFormatError(_problems(f"{hkey} {name}", exc, None)) from None
        return _Entry(chain, tasks)

    async def _read(self, archetype: str) -> _Entry | None:
        ckey, hkey = self._keys(archetype)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(ckey)
                pipe.hgetall(hkey)
                raw, history = await pipe.execute()
        except self._errors as exc:
            raise self._unavailable("read", exc) from exc
        return self._parse(archetype, raw, history)

    async def _chains(self) -> builtins.list[ArchetypeChain]:
        try:
            names = sorted(_text(n) for n in await self._redis.smembers(self._index))
            keys = [self._keys(n)[0] for n in names]
            values = await self._redis.mget(keys) if keys else []
        except self._errors as exc:
            raise self._unavailable("list", exc) from exc
        chains = []
        for name, raw in zip(names, values, strict=True):
            entry = self._parse(name, raw, {})
            if entry is not None:  # a name whose chain was removed between the two reads
                chains.append(entry.chain)
        return chains

    async def _transact(self, archetype: str, change: Change) -> _Entry | None:
        ckey, hkey = self._keys(archetype)
        for _attempt in range(self.max_attempts):
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    await pipe.watch(ckey, hkey)
                    raw = await pipe.get(ckey)
                    history = await pipe.hgetall(hkey)
                    old = self._parse(archetype, raw, history)
                    new = change(old)
                    if new is old:
                        return old  # leaving the pipeline unwatches
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.delete(hkey)
                    if new is None:
                        pipe.delete(ckey)
                        pipe.srem(self._index, archetype)
                    else:
                        pipe.set(ckey, new.chain.model_dump_json())
                        stored = {
                            task.value: _HISTORY.dump_json(infos)
                            for task, infos in new.history.items()
                            if infos
                        }
                        if stored:
                            pipe.hset(hkey, mapping=stored)  # type: ignore[arg-type]
                        pipe.sadd(self._index, archetype)
                    await pipe.execute()
                    return new
            except self._watch_error:
                continue
            except self._errors as exc:
                raise self._unavailable("write", exc) from exc
        raise RegistryUnavailableError(
            f"archetype registry at {self.where}: {archetype!r} kept changing under "
            f"{self.max_attempts} attempts to write it"
        )

    async def ping(self) -> None:
        """Raises `RegistryUnavailableError` when Redis does not answer."""
        try:
            await self._redis.ping()
        except self._errors as exc:
            raise self._unavailable("ping", exc) from exc

    async def aclose(self) -> None:
        if self._owned:
            await self._redis.aclose()


def _redacted(url: str) -> str:
    """`url` without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def open_registry(where: str | Path, *, prefix: str = DEFAULT_PREFIX) -> ArchetypeRegistry:
    """A `RedisRegistry` for a `redis://`, `rediss://` or `unix://` URL, else a `YamlRegistry`
    on that file (or on `archetypes.yaml` in that folder)."""
    text = str(where)
    if text.startswith(("redis://", "rediss://", "unix://")):
        return RedisRegistry(text, prefix=prefix)
    return YamlRegistry(where)
