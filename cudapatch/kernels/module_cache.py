"""Loaded CUDA modules, keyed by content hash and device, loaded once and evicted on request."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from .._lifecycle import HandleOwner
from ..errors import CudaError, KernelLoadError
from ._driver import check, driver
from .source import KernelImage

__all__ = ["ModuleCache"]

log = logging.getLogger("cudapatch.kernels")


@dataclass
class _Entry:
    module: Any
    functions: dict[str, Any]


def _load(image: KernelImage) -> Any:
    """``cuModuleLoadData``, or ``cuModuleLoadDataEx`` at the image's JIT level (ignored for a cubin)."""
    d = driver()
    if image.jit_level is None:
        return check(d.cuModuleLoadData(image.image), "cuModuleLoadData")
    opt = d.CUjit_option.CU_JIT_OPTIMIZATION_LEVEL
    return check(d.cuModuleLoadDataEx(image.image, 1, [opt], [image.jit_level]), "cuModuleLoadDataEx")


class ModuleCache(HandleOwner):
    """Modules loaded into one CUDA context, keyed by ``(image content hash, device key)``.

    Loading PTX makes the driver JIT it (milliseconds), so a Cold rebuild that finds its modules
    here costs nothing for them. Thread-safe: a background compiler may warm it.

    Lifecycle (``cudapatch._lifecycle``): no finalizer; its engine closes it (``DeviceResources``; after
    a lost context a new cache replaces it and the old one's modules are forgotten with the context).

    Args:
        device_key: Identifies the device/context (e.g. ``"0:sm_90"``); part of every key.
    """

    def __init__(self, *, device_key: str) -> None:
        self._device_key = device_key
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, image: KernelImage) -> bool:
        return (image.key, self._device_key) in self._entries

    def function(self, image: KernelImage) -> Any:
        """The ``CUfunction`` of ``image``'s entry point, loading the module on first use.

        Raises:
            KernelLoadError: the driver rejected the module (message has the driver's error and the file),
                or the entry point is missing.
        """
        if self._closed:
            raise KernelLoadError(
                "ModuleCache.function: the module cache is closed", kernel=image.descriptor.entry_point
            )
        key = (image.key, self._device_key)
        entry_point = image.descriptor.entry_point
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                try:
                    module = _load(image)
                except CudaError as exc:
                    hint = ""
                    if exc.name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION":
                        hint = " (the PTX ISA is newer than this driver supports: update the driver or rebuild the PTX)"
                    raise KernelLoadError(
                        f"the driver could not load the module: {exc.message}{hint}",
                        file=image.debug_name,
                        kernel=entry_point,
                    ) from exc
                entry = _Entry(module=module, functions={})
                self._entries[key] = entry
                log.debug("loaded module %s (%s)", image.debug_name, image.key[:12])
            else:
                self.hits += 1
            fn = entry.functions.get(entry_point)
            if fn is None:
                try:
                    fn = check(
                        driver().cuModuleGetFunction(entry.module, image.entry_symbol.encode()), "cuModuleGetFunction"
                    )
                except CudaError as exc:
                    raise KernelLoadError(
                        f"entry point not found in the loaded module: {exc.message}",
                        file=image.debug_name,
                        kernel=entry_point,
                    ) from exc
                # With lazy module loading (the driver's default), a function reaches the GPU on its
                # first launch: for a swapped kernel, inside the frame's graph launch. Loading it here,
                # on the compiler's thread, keeps that cost off the frame.
                load = getattr(driver(), "cuFuncLoad", None)
                if load is not None:
                    check(load(fn), "cuFuncLoad")
                entry.functions[entry_point] = fn
            return fn

    def evict(self, image: KernelImage) -> bool:
        """Unload ``image``'s module. Only do this once no graph uses its functions. Returns whether it was loaded.

        Raises:
            CudaError: cuModuleUnload failed.
        """
        with self._lock:
            entry = self._entries.pop((image.key, self._device_key), None)
        if entry is None:
            return False
        check(driver().cuModuleUnload(entry.module), "cuModuleUnload")
        return True

    def clear(self) -> None:
        """Unload every module.

        Raises:
            CudaError: cuModuleUnload failed.
        """
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            check(driver().cuModuleUnload(entry.module), "cuModuleUnload")

    def close(self) -> None:
        """Unload everything; idempotent."""
        if self._closed:
            return
        self.clear()
        self._closed = True

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<ModuleCache modules={len(self._entries)} hits={self.hits} misses={self.misses} closed={self._closed}>"
