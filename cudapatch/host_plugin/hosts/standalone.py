"""The standalone host: a patch file (or the embedded demo) run in the preview window or headless.

``StandaloneHost`` owns the engine, the adapter and the preview. Every frame it cooks the engine
operator and draws; about four times a second it checks the patch file, and applies an edit as a
difference (``apply_patch``). A broken edit is logged with its file and line, and the last good
patch keeps running.
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import CudapatchError, PatchFileError
from ..adapter import HostAdapter
from ..manager import PluginHost
from ..patch import apply_patch, load_patch, parse_patch

__all__ = ["StandaloneHost", "demo_patch_text"]

log = logging.getLogger("cudapatch.host")
PATCH_POLL_S = 0.25


def demo_patch_text() -> str:
    """The embedded demo patch (a million-particle system)."""
    return resources.files(__package__).joinpath("demo.toml").read_text(encoding="utf-8")


class StandaloneHost:
    """Runs a patch: ``StandaloneHost(path or None, plugins=...)``, then ``open_preview`` and ``run``.

    Args:
        patch_path: A patch file (watched for edits), or None for the embedded demo.
        plugins: The plugin host (default: built-ins plus installed plugins).
        profiling: Overrides the patch's profiling level.
        device: CUDA device ordinal.
    """

    def __init__(
        self,
        patch_path: str | Path | None = None,
        *,
        plugins: PluginHost | None = None,
        profiling: str | None = None,
        device: int | None = None,
    ) -> None:
        from ...engine.engine import Engine

        self.plugins = plugins or PluginHost()
        for err in self.plugins.errors:
            log.error("%s", err)
        registry = self.plugins.registry
        self.patch_path = Path(patch_path) if patch_path is not None else None
        if self.patch_path is None:
            self.patch = parse_patch(demo_patch_text(), path="<demo>", registry=registry)
        else:
            self.patch = load_patch(self.patch_path, registry)
        self._mtime = self._stat()
        self._next_poll = 0.0
        self.profiling_override = profiling
        dev = device if device is not None else int(self.patch.engine.get("device", 0))
        self.engine = Engine(dev, name=str(self.patch.engine.get("name", "CudaEngine")))
        search = [self.patch_path.parent] if self.patch_path is not None else []
        self.adapter = HostAdapter(self.engine, registry, search_paths=search + self.plugins.kernel_search_paths())
        apply_patch(self.adapter, self.patch)
        if profiling is not None:
            self.engine.set_profiling(profiling)
        self.plugins.engine_started(self.engine)
        self.reloads = 0
        self.reload_errors: list[PatchFileError] = []
        self.preview: Any = None

    def _stat(self) -> float | None:
        try:
            return self.patch_path.stat().st_mtime_ns if self.patch_path is not None else None
        except OSError:
            return None

    def poll_patch(self, *, force: bool = False) -> bool:
        """Reload the patch file if it changed (checked at most every 0.25 s). Returns whether an edit
        was applied. A bad edit is logged and kept in ``reload_errors``; the old patch stays."""
        if self.patch_path is None:
            return False
        now = time.monotonic()
        if not force and now < self._next_poll:
            return False
        self._next_poll = now + PATCH_POLL_S
        mtime = self._stat()
        if mtime == self._mtime and not force:
            return False
        self._mtime = mtime
        try:
            new = load_patch(self.patch_path, self.plugins.registry)
            counts = apply_patch(self.adapter, new, self.patch)
        except CudapatchError as exc:
            err = exc if isinstance(exc, PatchFileError) else PatchFileError(str(exc), file=str(self.patch_path))
            self.reload_errors.append(err)
            log.error("patch not applied, the last good patch keeps running: %s", err)
            return False
        if self.profiling_override is not None:
            self.engine.set_profiling(self.profiling_override)
        self.patch = new
        self.reloads += 1
        log.info("patch reloaded: %s", ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no changes")
        return True

    def open_preview(self, context: Any, *, overlay: bool = True) -> Any:
        """Create the preview for the patch's ``[preview]`` settings in ``context``."""
        from ...interop.preview import Preview

        points = image = None
        pv = self.patch.preview
        if "points" in pv:
            op, port = pv["points"].split(".", 1)
            points = (self.adapter.block(op), port)
        if "image" in pv:
            op, port = pv["image"].split(".", 1)
            w, h = pv.get("size", (512, 512))
            image = (self.adapter.block(op), port, int(w), int(h))
        self.engine.wait_ready()
        self.preview = Preview(self.engine, context, points=points, image=image, overlay=overlay)
        return self.preview

    def run(self, frames: int | None = None, *, out_dir: str | Path | None = None, png_every: int = 0) -> Any:
        """Run the preview; the patch file is polled between frames."""
        assert self.preview is not None, "open_preview first"
        return self.preview.run(frames, out_dir=out_dir, png_every=png_every, before_frame=self.poll_patch)

    def close(self) -> None:
        """Stop: plugins are told, the preview and engine are released."""
        self.plugins.engine_stopping(self.engine)
        if self.preview is not None:
            self.preview.close()
        self.engine.close()

    def __enter__(self) -> StandaloneHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
