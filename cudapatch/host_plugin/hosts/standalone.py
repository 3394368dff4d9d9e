"""The standalone host: a patch file (or the embedded demo) run in the preview window or headless.

``StandaloneHost`` owns the engine, the adapter and the preview. Every frame it cooks the engine
operator and draws; about four times a second it checks the patch file, and applies an edit as a
difference (``apply_patch``). A broken edit is logged with its file and line, and the last good
patch keeps running.

After a GPU fault CUDA refuses the rest of the process (``engine.lost``). The host then carries on
in a new process (``restart``): the same command, the frames already run and the faulting
operators in ``CUDAPATCH_RESTART``; the new process disables those operators (their error stays on
them until their code changes in the patch file) and goes on with the rest of the patch.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import CudapatchError, PatchFileError
from ..adapter import HostAdapter
from ..manager import PluginHost
from ..patch import apply_patch, load_patch, parse_patch

__all__ = ["StandaloneHost", "demo_patch_text", "RESTART_ENV", "MAX_RESTARTS", "take_restart_state"]

log = logging.getLogger("cudapatch.host")
PATCH_POLL_S = 0.25
RESTART_ENV = "CUDAPATCH_RESTART"
MAX_RESTARTS = 3  # a fault that keeps coming back (its block not found) ends the run instead


def take_restart_state() -> dict[str, Any]:
    """What a process this one replaced after a GPU fault left in ``CUDAPATCH_RESTART`` (removed
    from the environment): ``frames`` run, ``disabled`` operators (id → message), ``restarts``.
    Empty when this process was not started that way."""
    text = os.environ.pop(RESTART_ENV, "")
    if not text:
        return {}
    try:
        state = json.loads(text)
    except json.JSONDecodeError:
        log.warning("ignoring a malformed %s", RESTART_ENV)
        return {}
    return state if isinstance(state, dict) else {}


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

    def run(
        self, frames: int | None = None, *, out_dir: str | Path | None = None, png_every: int = 0, start: int = 0
    ) -> Any:
        """Run the preview (frames ``start + 1 .. frames``); the patch file is polled between frames.
        Stops early when the engine is lost to a GPU fault (see ``restart``)."""
        assert self.preview is not None, "open_preview first"
        return self.preview.run(frames, out_dir=out_dir, png_every=png_every, before_frame=self.poll_patch, start=start)

    def faulted_operators(self) -> dict[str, str]:
        """Operators whose kernels faulted on the GPU (or were disabled for it), with the message."""
        ids = {self.adapter.block(op).id: op for op in self.adapter.operators()}
        return {
            ids[d.block_id]: d.message for d in self.engine.diagnostics() if d.code == "gpu-fault" and d.block_id in ids
        }

    def disable_operators(self, disabled: dict[str, str]) -> None:
        """Keep these operators' kernels off (a process before this one faulted in them)."""
        for op, message in disabled.items():
            try:
                block = self.adapter.block(op)
            except CudapatchError:
                continue  # the patch file lost it meanwhile
            self.engine.disable(block, f"{message} (in an earlier process; edit its code to try again)")
            log.error("operator '%s' is disabled: %s", op, message)

    def restart(self, argv: list[str], *, frames_done: int, restarts: int) -> bool:
        """After ``engine.lost``: replace this process by ``python -m cudapatch`` + ``argv`` that
        disables the faulting operators and goes on after ``frames_done`` frames. Returns False
        (and does nothing) when no faulting operator is known or ``MAX_RESTARTS`` were made; on
        success it does not return."""
        faulted = self.faulted_operators()
        if not faulted or restarts >= MAX_RESTARTS:
            log.error("the engine is lost and cannot be restarted: %s", self.engine.lost)
            return False
        state = {"frames": frames_done, "disabled": faulted, "restarts": restarts + 1}
        log.error(
            "GPU fault in %s: CUDA refuses this process; restarting it without %s",
            ", ".join(faulted),
            "that operator" if len(faulted) == 1 else "those operators",
        )
        os.environ[RESTART_ENV] = json.dumps(state)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "cudapatch", *argv])
        return True  # pragma: no cover (execv does not return)

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
