"""CubinCache: compiled kernels in memory and on disk, keyed by content, options, arch and compiler.

Disk entries are ``<key>.cubin`` files: a header (magic, SHA-256, metadata length), JSON metadata,
then the payload. The checksum covers the key, the metadata and the payload, so an entry that is
truncated, corrupt anywhere, or stored under another key's name is detected. Such an entry is a miss:
it is logged, deleted and rebuilt, never an exception (the cache is only a shortcut) and never handed
to the driver. Entries are read like every user file (``_files``: regular files only, bounded size),
and the metadata must be a flat JSON object. Entries of the older format (``CPCUBIN1``, whose checksum
left the metadata out) are misses too, and are rewritten.

The directory is ``$CUDAPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/cudapatch/kernels``, else
``~/.cache/cudapatch/kernels``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal, NamedTuple

from ..errors import CudapatchError, KernelLoadError
from ._files import MAX_CACHE_ENTRY_BYTES, read_user_bytes

__all__ = ["CubinCache", "CacheEntry", "default_cache_dir", "cache_key"]

log = logging.getLogger("cudapatch.kernels")

_MAGIC = b"CPCUBIN2"
_OLD_MAGIC = b"CPCUBIN1"
_HEADER = struct.Struct("<8s32sI")  # magic, sha256(key, metadata, payload), metadata length
_MAX_META_BYTES = 64 << 10
_SCALARS = (str, int, float, bool, type(None))


def _digest(key: str, meta_raw: bytes, payload: bytes) -> bytes:
    h = hashlib.sha256()
    for part in (key.encode(), meta_raw, payload):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


class _Corrupt(Exception):
    """Why a disk entry cannot be used (internal: it becomes a logged miss)."""


class CacheEntry(NamedTuple):
    """A cache hit: the payload, its metadata, and which level it came from."""

    payload: bytes
    meta: dict
    level: Literal["memory", "disk"]


def default_cache_dir() -> Path:
    """Where compiled kernels are kept between runs."""
    env = os.environ.get("CUDAPATCH_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudapatch" / "kernels"


def cache_key(*parts: str | bytes) -> str:
    """SHA-256 over the parts (length-prefixed, so ``("ab", "c")`` and ``("a", "bc")`` differ)."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _decode(key: str, raw: bytes) -> tuple[bytes, dict]:
    """Payload and metadata of a disk entry for ``key``.

    Raises:
        _Corrupt: anything wrong (``"old"``: the previous format).
    """
    if len(raw) < _HEADER.size:
        raise _Corrupt(f"{len(raw)} bytes, shorter than the header")
    magic, digest, meta_len = _HEADER.unpack_from(raw)
    if magic == _OLD_MAGIC:
        raise _Corrupt("old")
    if magic != _MAGIC:
        raise _Corrupt("not a cudapatch cache entry")
    if meta_len > min(_MAX_META_BYTES, len(raw) - _HEADER.size):
        raise _Corrupt(f"metadata length {meta_len} does not fit the entry")
    meta_raw = raw[_HEADER.size : _HEADER.size + meta_len]
    payload = raw[_HEADER.size + meta_len :]
    if _digest(key, meta_raw, payload) != digest:
        raise _Corrupt("checksum mismatch")
    try:
        meta: Any = json.loads(meta_raw)
    except (ValueError, RecursionError) as exc:  # a hand-made entry with a valid checksum
        raise _Corrupt(f"metadata is not JSON: {type(exc).__name__}") from None
    if not isinstance(meta, dict) or not all(isinstance(v, _SCALARS) for v in meta.values()):
        raise _Corrupt("metadata is not a flat JSON object")
    return payload, meta


class CubinCache:
    """Compiled kernels by key: an LRU in memory over a directory on disk. Thread-safe.

    Args:
        directory: The disk cache (None: ``default_cache_dir()``; ``False``: memory only).
        memory_items: How many entries the memory level keeps.
    """

    def __init__(self, directory: Path | str | None | bool = None, *, memory_items: int = 512) -> None:
        if directory is False:
            self.directory: Path | None = None
        else:
            self.directory = Path(directory) if directory not in (None, True) else default_cache_dir()  # type: ignore[arg-type]
        self._memory: OrderedDict[str, tuple[bytes, dict]] = OrderedDict()
        self._memory_items = memory_items
        self._lock = threading.Lock()
        self.memory_hits = 0
        self.disk_hits = 0
        self.misses = 0
        self.corrupt = 0

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{key}.cubin"

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` from memory, else disk, else None (a miss; a corrupt disk entry is a
        miss too, logged and deleted). Never raises for what is on disk."""
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                self.memory_hits += 1
                return CacheEntry(hit[0], hit[1], "memory")
        path = self._path(key)
        if path is not None:
            entry = self._read(key, path)
            if entry is not None:
                with self._lock:
                    self.disk_hits += 1
                    self._remember(key, entry)
                return CacheEntry(entry[0], entry[1], "disk")
        with self._lock:
            self.misses += 1
        return None

    def _read(self, key: str, path: Path) -> tuple[bytes, dict] | None:
        try:
            raw = read_user_bytes(path, what="kernel cache entry", limit=MAX_CACHE_ENTRY_BYTES, error=KernelLoadError)
        except CudapatchError as exc:
            if not os.path.lexists(path):
                return None  # the ordinary miss
            return self._discard(path, exc.message)
        try:
            return _decode(key, raw)
        except _Corrupt as exc:
            if str(exc) == "old":
                log.info("kernel cache entry %s is from an older cudapatch; rebuilding it", path)
                self._unlink(path)
                return None
            return self._discard(path, str(exc))
        except Exception as exc:  # whatever else a damaged entry provokes is a miss, never a crash
            return self._discard(path, f"{type(exc).__name__}: {exc}")

    def _discard(self, path: Path, why: str) -> None:
        log.warning("kernel cache entry %s is corrupt (%s); rebuilding it", path, why)
        with self._lock:
            self.corrupt += 1
        self._unlink(path)
        return None

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            if not path.is_dir():
                path.unlink()
        except OSError:
            pass

    def _remember(self, key: str, entry: tuple[bytes, dict]) -> None:
        self._memory[key] = entry
        self._memory.move_to_end(key)
        while len(self._memory) > self._memory_items:
            self._memory.popitem(last=False)

    def put(self, key: str, payload: bytes, meta: dict | None = None, *, disk: bool = True) -> None:
        """Store an entry in memory and (atomically, unless ``disk`` is False) on disk; disk errors
        are logged, not raised."""
        entry = (bytes(payload), dict(meta or {}))
        with self._lock:
            self._remember(key, entry)
        path = self._path(key) if disk else None
        if path is None:
            return
        try:
            meta_raw = json.dumps(entry[1]).encode()
        except (TypeError, ValueError) as exc:
            log.warning("kernel cache entry %s not written: its metadata is not JSON (%s)", path, exc)
            return
        blob = _HEADER.pack(_MAGIC, _digest(key, meta_raw, entry[0]), len(meta_raw)) + meta_raw + entry[0]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)  # readers see the old entry or the whole new one, never half
        except OSError as exc:
            log.warning("cannot write kernel cache entry %s: %s", path, exc)

    def clear_memory(self) -> None:
        """Forget the memory level (the disk stays)."""
        with self._lock:
            self._memory.clear()

    def __repr__(self) -> str:
        return (
            f"<CubinCache dir={self.directory} memory={len(self._memory)} hits={self.memory_hits}+{self.disk_hits} "
            f"misses={self.misses} corrupt={self.corrupt}>"
        )
