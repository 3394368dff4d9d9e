"""The ``cudapatch`` command: ``run`` a patch in the preview, list ``blocks``, ``check`` the machine.

cudapatch run [PATCH] [--headless --frames N --out DIR] [--profiling LEVEL] [--size WxH] [--isolated] [--editor]
              [--no-fuse]
cudapatch blocks
cudapatch check
cudapatch plan PATCH [--no-fuse]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["main"]

log = logging.getLogger("cudapatch")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 1280x720, got {text!r}") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return w, h


def _one_line(exc: Exception) -> str:
    """What a command prints for an error that stops it: no CUDA gets the driver it needs and ``cudapatch check``."""
    from .errors import CudaUnavailableError
    from .preflight import explain_unavailable

    return explain_unavailable(exc) if isinstance(exc, CudaUnavailableError) else str(exc)


def cmd_run(args: argparse.Namespace) -> int:
    if args.headless:
        # An entry point chooses PyOpenGL's platform, before anything imports OpenGL.
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    from .errors import CudapatchError
    from .host_plugin.hosts.standalone import StandaloneHost, take_restart_state

    w, h = args.size
    resumed = take_restart_state()  # set when this process replaced one that a GPU fault ended
    start = int(resumed.get("frames", 0))
    try:
        host = StandaloneHost(
            args.patch, profiling=args.profiling, isolated=args.isolated, fuse=False if args.no_fuse else None
        )
    except CudapatchError as exc:
        print(f"cudapatch: {_one_line(exc)}", file=sys.stderr)
        return 2
    host.disable_operators(resumed.get("disabled", {}))
    if args.isolated and (args.frames is not None or args.out is not None):
        # A count of frames, or frames written to files: each frame runs (the child is waited for, not
        # skipped while it lags), so the picture at frame N is the patch's frame N as in process.
        host.engine.drop_frames = False
    if resumed:
        # Measured on an H100 with driver 580 (benchmarks/probes/probe_after_fault.py): once a process has
        # faulted on a GPU, later processes' previews there can show nothing (CUDA results are right).
        log.warning("after a GPU fault some drivers show an empty preview until the GPU is reset")
    with host:
        try:
            if args.headless:
                from .interop import EglContext

                context = EglContext(w, h)
            else:
                from .interop import GlfwWindow

                context = GlfwWindow(w, h, f"cudapatch — {args.patch or 'demo'}")
        except CudapatchError as exc:
            print(f"cudapatch: {_one_line(exc)}", file=sys.stderr)
            return 2
        try:
            host.engine.device.make_current()
            host.open_preview(context, overlay=not args.no_overlay, editor=args.editor)
            report = host.run(args.frames, out_dir=args.out, png_every=args.png_every, start=start)
            if host.engine.lost is not None:  # CUDA refuses this process: go on in a new one
                host.restart(args.argv, frames_done=start + report.frames, restarts=int(resumed.get("restarts", 0)))
                print(f"cudapatch: {host.engine.lost}", file=sys.stderr)
                return 1
            stats = host.engine.stats()
            log.info("%d frames in %.2f s (%.0f fps)", report.frames, report.seconds, report.fps)
            internal = host.preview.bridge.internal_blocks  # the preview's GL writers: marked, not the patch's
            for b in stats.blocks:
                ms = f"{b.gpu_ms:.3f} ms" if b.gpu_ms is not None else "-"
                log.info("  %-12s %-9s %s%s", b.name, b.state, ms, "  (internal)" if b.block_id in internal else "")
            for path in report.pngs:
                print(path)
            errors = host.messages("error")  # each at the line of the operator it is on
            for message in errors:
                print(f"cudapatch: {message}", file=sys.stderr)
            return 1 if errors else 0
        finally:
            if host.preview is not None:
                host.preview.close()
                host.preview = None
            context.close()


def cmd_blocks(args: argparse.Namespace) -> int:
    from .host_plugin import PluginHost

    plugins = PluginHost()
    for bt in plugins.registry:
        print(f"{bt.name}  (v{bt.version}, from {bt.origin})")
        if bt.doc:
            print(f"    {bt.doc}")
        for direction, name, kind in bt.ports:
            print(f"    {'in ' if direction == 'in' else 'out'} {name}: {kind}")
        choices = dict(bt.choices)
        for name, kind, default in bt.params:
            shown = "<code>" if kind == "text" and len(str(default)) > 40 else repr(default)
            listed = f"  (one of: {', '.join(str(c) for c in choices[name])})" if name in choices else ""
            print(f"    par {name}: {kind} = {shown}{listed}")
    for err in plugins.errors:
        print(f"error: {err}", file=sys.stderr)
    return 1 if plugins.errors else 0


def cmd_check(args: argparse.Namespace) -> int:
    from .preflight import preflight

    ok = True
    for item in preflight():
        mark = "ok " if item.ok else ("-- " if item.optional else "!! ")
        ok &= item.ok or item.optional
        line = f"{mark} {item.name:<14} {item.detail}"
        if not item.ok and item.fix:
            line += f"\n      fix: {item.fix}"
        print(line)
    return 0 if ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from .errors import CudapatchError
    from .host_plugin.plan_view import format_plan, plan_patch

    try:
        engine, plan = plan_patch(args.patch, fuse=False if args.no_fuse else None)
    except CudapatchError as exc:
        print(f"cudapatch: {exc}", file=sys.stderr)
        return 2
    print(format_plan(engine, plan))
    return 0 if plan is not None else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cudapatch`` console script."""
    parser = argparse.ArgumentParser(prog="cudapatch", description="CUDA blocks in one live CUDA graph")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a patch file (default: the embedded particle demo) in the preview")
    run.add_argument("patch", nargs="?", type=Path, help="a .toml patch file; edits apply while it runs")
    run.add_argument("--headless", action="store_true", help="render without a display (EGL)")
    run.add_argument("--frames", type=int, default=None, help="stop after N frames")
    run.add_argument("--out", type=Path, default=None, help="write PNGs of the frames here")
    run.add_argument("--png-every", type=int, default=0, help="with --out: also every N frames")
    run.add_argument("--profiling", default=None, help="None, Summary, PerBlock, PerKernel, DeepAsync, DeepSync")
    run.add_argument("--size", type=_size, default=(1280, 720), help="WxH (default 1280x720)")
    run.add_argument("--no-overlay", action="store_true", help="hide the profiling overlay")
    run.add_argument(
        "--isolated", action="store_true", help="run the engine in a child process: a GPU fault restarts only it"
    )
    run.add_argument(
        "--editor", action="store_true", help="open the node editor over the preview (F2 toggles it; PNGs show it)"
    )
    run.add_argument("--no-fuse", action="store_true", help="run without fusing elementwise blocks (one kernel each)")
    run.set_defaults(func=cmd_run)
    sub.add_parser("blocks", help="list installed block types").set_defaults(func=cmd_blocks)
    sub.add_parser("check", help="preflight: driver, GPU, libraries, GL").set_defaults(func=cmd_check)
    plan = sub.add_parser("plan", help="print the compiled plan of a patch file (no GPU needed)")
    plan.add_argument("patch", type=Path, help="a .toml patch file")
    plan.add_argument("--no-fuse", action="store_true", help="plan without fusing elementwise blocks")
    plan.set_defaults(func=cmd_plan)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a restart after a GPU fault runs again
    _setup_logging(args.verbose)
    if args.command == "run" and args.frames is not None and args.frames <= 0:
        parser.error("--frames must be positive")
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
