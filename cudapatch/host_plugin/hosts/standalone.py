"""The standalone host: a patch file (or the embedded demo) run in the preview window or headless.

``StandaloneHost`` owns the engine, the adapter and the preview. Every frame it cooks the engine
operator and draws; about four times a second it checks the patch file, and applies an edit as a
difference (``apply_patch``). A broken edit, whatever broke it, is logged with its file and line and
the last good patch keeps running; an edit that empties the patch is held for a moment (see
``live_reload.PatchReloader``).

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
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import CudapatchError, PatchFileError
from ..adapter import HostAdapter
from ..generated_code import generated_code
from ..manager import PluginHost
from ..patch import Patch, apply_patch, load_patch, parse_patch
from ..places import located, operator_places
from .composite_reload import CompositeReloader
from .live_reload import PATCH_POLL_S, PatchReloader

__all__ = ["StandaloneHost", "demo_patch_text", "RESTART_ENV", "MAX_RESTARTS", "PATCH_POLL_S", "take_restart_state"]

log = logging.getLogger("cudapatch.host")
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
    except (ValueError, RecursionError):  # malformed, a number of 4,300+ digits, nested too deep
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
        isolated: Run the engine in a child process (``Engine(isolated=True)``).
        fuse: Elementwise fusion (``Engine(fuse=...)``); None: the patch's ``[engine] fuse`` (on by default).
    """

    def __init__(
        self,
        patch_path: str | Path | None = None,
        *,
        plugins: PluginHost | None = None,
        profiling: str | None = None,
        device: int | None = None,
        isolated: bool = False,
        fuse: bool | None = None,
    ) -> None:
        from ...engine.engine import Engine

        self.plugins = plugins or PluginHost()
        for err in self.plugins.errors:
            log.error("%s", err)
        registry = self.plugins.registry
        self.patch_path = Path(patch_path) if patch_path is not None else None
        if self.patch_path is None:
            patch = parse_patch(demo_patch_text(), path="<demo>", registry=registry)
        else:
            patch = load_patch(self.patch_path, registry)
        self._reloader = PatchReloader(
            self.patch_path, patch, load=lambda p: load_patch(p, registry), apply=self._apply_edit
        )
        self.profiling_override = profiling
        dev = device if device is not None else patch.engine.get("device", 0)  # an int: parse_patch checks
        options: dict[str, bool] = {"fuse": patch.fuse if fuse is None else fuse}
        if not isolated:  # the isolated child never shares buffers (the host maps each output)
            options["reuse_buffers"] = bool(patch.engine.get("reuse_buffers", True))
        self.engine = Engine(dev, name=str(patch.engine.get("name", "CudaEngine")), isolated=isolated, **options)
        search = [self.patch_path.parent] if self.patch_path is not None else []
        self.adapter = HostAdapter(self.engine, registry, search_paths=search + self.plugins.kernel_search_paths())
        apply_patch(self.adapter, patch)
        self._composites = CompositeReloader(self.adapter)  # composite files are edited live too
        self._composites.poll(force=True)  # their files as they are now: the baseline
        if profiling is not None:
            self.engine.set_profiling(profiling)
        self.plugins.engine_started(self.engine)
        self.preview: Any = None
        self.editor: Any = None  # the node editor's EditorModel, made by open_preview(editor=True)

    @property
    def patch(self) -> Patch:
        """The patch running now (the last good one)."""
        return self._reloader.patch

    @property
    def reloads(self) -> int:
        """How many edits of the patch file were applied."""
        return self._reloader.reloads

    @property
    def reload_errors(self) -> list[PatchFileError]:
        """Every edit of the patch file, or of a composite file it uses, that was refused (the last
        good patch kept running)."""
        return self._reloader.errors + self._composites.errors

    @property
    def status(self) -> str:
        """One line on live editing: loaded, reloaded, an edit refused (with its error), or held; then
        the running patch's first error, at its operator's file and line, when it has any."""
        errors = self.messages("error")
        if not errors:
            return self._reloader.status
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"{self._reloader.status}; {errors[0]}{more}"

    def generated_code(self, block_id: int) -> str | None:
        """The code the block ``block_id`` generates for its kernel (an Expression's; inside a composite
        too), generated once per Code: the overlay's tooltip on the block's name shows it."""
        op = self.adapter.operators_by_block().get(block_id)
        block = self.adapter.block(op) if op is not None else None
        if block is not None and block.id != block_id:  # an inner block of the composite ``op``
            block = next((b for _, b in block.inner_blocks() if b.id == block_id), None)
        return generated_code(block)

    def places(self) -> dict[int, str]:
        """Block id → ``path:line`` of the operator of the running patch that made it (``operator_places``)."""
        return operator_places(self.adapter, self.patch)

    def messages(self, severity: str | None = None) -> list[str]:
        """The engine's diagnostics (only those of ``severity``, when given) as text, each after the
        ``path:line`` of the operator whose block it is on: the compiler's errors name blocks, not
        lines of the patch file."""
        diags = [d for d in self.engine.diagnostics() if severity is None or d.severity == severity]
        if not diags:
            return []
        places = self.places()
        return [located(d, places) for d in diags]

    def _apply_edit(self, new: Patch, old: Patch) -> dict[str, int]:
        counts = apply_patch(self.adapter, new, old)
        if self.profiling_override is not None:
            self.engine.set_profiling(self.profiling_override)
        return counts

    def poll_patch(self, *, force: bool = False) -> bool:
        """Reload the patch file if it changed, and the composite files its operators use (checked at
        most every 0.25 s). Returns whether an edit was applied. An edit that fails in any way is
        logged, kept in ``reload_errors`` and shown in ``status``; the old patch stays. An edit that
        empties the patch is held for a moment."""
        applied = self._reloader.poll(force=force)
        return self._composites.poll(force=force) > 0 or applied

    def open_editor(self) -> Any:
        """The node editor's model of this patch (made once): its edits go through the adapter and are
        written to the patch file, which the file watcher then takes as no change."""
        if self.editor is None:
            from ..editor_model import EditorModel

            reloader = self._reloader
            self.editor = EditorModel(
                self.adapter, reloader.patch, path=self.patch_path, adopt=reloader.adopt, current=lambda: reloader.patch
            )
        return self.editor

    def open_preview(self, context: Any, *, overlay: bool = True, editor: bool = False) -> Any:
        """Create the preview for the patch's ``[preview]`` settings in ``context`` (``editor``: with
        the node editor panel)."""
        from ...interop.preview import Preview

        points = image = None
        pv = self.patch.preview
        if "points" in pv:
            op, port = pv["points"].split(".", 1)
            points = (self.adapter.block(op), port)
        self.engine.wait_ready()
        if "image" in pv:
            op, port = pv["image"].split(".", 1)
            image = (self.adapter.block(op), port)
            if "size" in pv:
                w, h = pv["size"]
                image = (*image, int(w), int(h))
            else:  # a 2-D output shows at its own size; anything else at the old default
                try:
                    shape = self.engine.output_shape(image[0], port)
                except (CudapatchError, AttributeError):  # not running, or an engine without shapes
                    shape = None
                if shape is None or shape.ndim != 2:
                    image = (*image, 512, 512)
        model = self.open_editor() if editor else None
        self.preview = Preview(self.engine, context, points=points, image=image, overlay=overlay, editor=model)
        if self.preview.overlay is not None:  # its diagnostics list shows each at its operator's line
            self.preview.overlay.places = self.places
            self.preview.overlay.generated = self.generated_code
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
        self.adapter.close_rings()  # before the engine: their frees wait for frames still running
        self.engine.close()

    def __enter__(self) -> StandaloneHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
