"""CubinCache: compiled kernels in memory and on disk, keyed by content, options, arch and compiler.

Disk entries are ``<key>.cubin`` files with a header (magic, SHA-256 of the payload, metadata) so
a truncated or corrupt entry is detected, deleted and rebuilt instead of crashing the driver.
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
from typing import Literal, NamedTuple

__all__ = ["CubinCache", "CacheEntry", "default_cache_dir", "cache_key"]

log = logging.getLogger("cudapatch.kernels")

_MAGIC = b"CPCUBIN1"
_HEADER = struct.Struct("<8s32sI")  # magic, sha256(payload), metadata length


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
        """The entry for ``key`` from memory, else disk, else None (a miss)."""
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                self.memory_hits += 1
                return CacheEntry(hit[0], hit[1], "memory")
        path = self._path(key)
        if path is not None:
            entry = self._read(path)
            if entry is not None:
                with self._lock:
                    self.disk_hits += 1
                    self._remember(key, entry)
                return CacheEntry(entry[0], entry[1], "disk")
        with self._lock:
            self.misses += 1
        return None

    def _read(self, path: Path) -> tuple[bytes, dict] | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("kernel cache entry %s is unreadable (%s); rebuilding it", path, exc)
            self.corrupt += 1
            return None
        try:
            magic, digest, meta_len = _HEADER.unpack_from(raw)
            meta_raw = raw[_HEADER.size : _HEADER.size + meta_len]
            payload = raw[_HEADER.size + meta_len :]
            if magic != _MAGIC or hashlib.sha256(payload).digest() != digest:
                raise ValueError("bad magic or checksum")
            meta = json.loads(meta_raw)
            if not isinstance(meta, dict):
                raise ValueError("bad metadata")
        except (struct.error, ValueError) as exc:
            log.warning("kernel cache entry %s is corrupt (%s); rebuilding it", path, exc)
            self.corrupt += 1
            try:
                path.unlink()
            except OSError:
                pass
            return None
        return payload, meta

    def _remember(self, key: str, entry: tuple[bytes, dict]) -> None:
        self._memory[key] = entry
        self._memory.move_to_end(key)
        while len(self._memory) > self._memory_items:
            self._memory.popitem(last=False)

    def put(self, key: str, payload: bytes, meta: dict | None = None) -> None:
        """Store an entry in memory and (atomically) on disk; disk errors are logged, not raised."""
        entry = (bytes(payload), dict(meta or {}))
        with self._lock:
            self._remember(key, entry)
        path = self._path(key)
        if path is None:
            return
        meta_raw = json.dumps(entry[1]).encode()
        blob = _HEADER.pack(_MAGIC, hashlib.sha256(entry[0]).digest(), len(meta_raw)) + meta_raw + entry[0]
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
