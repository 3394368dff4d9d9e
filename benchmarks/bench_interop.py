#!/usr/bin/env python3
"""Interop and particle-demo benchmark (headless EGL on the GPU machine), ours beside peers.

1. Per-frame interop host overhead: the engine's GL bridge mapping one buffer + one texture around
   an (empty-ish) frame, beside the raw map+unmap pair of cuda-python in the same run.
2. 4K RGBA8 texture update (the bridge's copy into the mapped array) beside a device-to-device copy
   of the same bytes (GPU time, events).
3. The particle demo: engine frames per second with nothing drawn (GPU ms per block from PerBlock),
   and the headless preview at 1920x1080 with the overlay for 1M and 10M points.

Prints a table and writes ``interop.json`` to ``$RESULTS_DIR`` when set.
Usage: ``PYOPENGL_PLATFORM=egl python benchmarks/bench_interop.py``
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # an entry point: chooses PyOpenGL's platform
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import gpu_ms  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.blocks.library import CustomKernel, Emitter, Forces, Integrate, ToPoints  # noqa: E402
from cudapatch.interop import EglContext, GlBridge, ResourceGroup, SharedBuffer, SharedTexture2D  # noqa: E402
from cudapatch.interop.preview import Preview  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402

ROWS: list[tuple[str, float, str, float | None, str]] = []


def row(what: str, ours: float, peer_name: str = "", peer: float | None = None, unit: str = "µs") -> None:
    ROWS.append((what, ours, peer_name, peer, unit))
    ratio = f"{ours / peer:6.2f}x" if peer else ""
    peer_s = f"{peer:10.2f} {unit} ({peer_name})" if peer is not None else ""
    print(f"{what:52s} {ours:10.2f} {unit}   {peer_s} {ratio}", flush=True)


def host_median_us(fn, n: int = 2000, before=None) -> float:
    """Median host µs of ``fn``; ``before`` (untimed) runs first each time, e.g. to pace frames."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def warm_gpu_ms(fn, stream, n: int = 50) -> float:
    """GPU ms per call of ``fn`` over ``n`` calls, after one untimed call: first-use work (module loads,
    caches) is not what is measured."""
    fn()
    return gpu_ms(fn, stream, n, repeats=1)


TINY = """extern "C" __global__ void tiny(unsigned int* image, unsigned int count) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < count) image[i] = i; }"""


def bench_bridge(engine: Engine, ctx: EglContext) -> None:
    s = engine.device.stream
    w, h = 256, 256
    block = engine.add(CustomKernel(Code=TINY))
    block.set("Count", w * h)
    engine.wait_ready()
    buf = SharedBuffer.create(w * h * 4)
    engine.synchronize()
    # Paced like a preview: the previous frame has finished before the timed update (untimed sync).
    # Back to back, a map waits for the GL/CUDA hand-over of earlier frames (~0.3 ms each here).
    # Rounds alternate the patch without the bridge, with it, and the driver calls alone (the host's
    # speed drifts within a run; alternating keeps each round's numbers comparable).
    for flags in ("surface_ldst", "write_discard"):
        tex = SharedTexture2D.create(w, h, format="rgba8", flags=flags)
        group = ResourceGroup([buf, tex])

        def floor(group=group, tex=tex) -> None:  # the driver calls a frame cannot avoid
            group.map(stream=s)
            check(d.cuGraphicsResourceGetMappedPointer(buf.handle))
            check(d.cuGraphicsSubResourceGetMappedArray(tex.handle, 0, 0))
            group.unmap()

        diffs, floors = [], []
        for _ in range(6):
            engine.update()  # the rebuild after the bridge left (untimed)
            without = host_median_us(engine.update, n=400, before=engine.synchronize)
            bridge = GlBridge(engine)
            bridge.show_buffer(block, "image", buf)
            bridge.show_texture(block, "image", tex)
            engine.update()  # the rebuild with its writer blocks (untimed)
            diffs.append(host_median_us(engine.update, n=400, before=engine.synchronize) - without)
            bridge.close()
            engine.synchronize()
            floors.append(host_median_us(floor, n=400, before=engine.synchronize))
        print(
            f"   {flags}, 6 rounds: overhead {min(diffs):.2f}..{max(diffs):.2f} µs; the driver calls alone "
            f"(group map + 2 queries + unmap) {min(floors):.2f}..{max(floors):.2f} µs",
            flush=True,
        )
        if flags == "surface_ldst":
            b_h, t_h = buf.handle, tex.handle
            tex_keep = tex
        else:
            tex.close()
        row(
            f"interop overhead per frame (1 buffer + 1 texture, {flags})",
            statistics.median(diffs),
            "driver calls alone",
            statistics.median(floors),
        )
    tex = tex_keep

    def raw_pair() -> None:
        check(d.cuGraphicsMapResources(1, b_h, s))
        check(d.cuGraphicsResourceGetMappedPointer(b_h))
        check(d.cuGraphicsUnmapResources(1, b_h, s))
        check(d.cuGraphicsMapResources(1, t_h, s))
        check(d.cuGraphicsSubResourceGetMappedArray(t_h, 0, 0))
        check(d.cuGraphicsUnmapResources(1, t_h, s))

    raw = host_median_us(raw_pair, before=engine.synchronize)
    print(f"   raw map+unmap x2 (cuda-python, one resource per call): {raw:.2f} µs")
    from cudapatch.interop.imported import ImportedRing

    ring = ImportedRing(w * h * 4)
    bridge = GlBridge(engine)
    bridge.show_buffer_ring(block, "image", ring)  # adds the in-graph writer block: one rebuild
    engine.update()
    engine.synchronize()
    # The graph now holds the writer; without the bridge's hook it launches the same way, copying
    # nothing. Rounds alternate frames without the hook, zero-map frames and raw map+unmap pairs: the
    # host's speed drifts within a run, and alternating keeps each round's numbers comparable.

    def end_of_frame() -> None:  # untimed: what a preview does anyway (a swap flushes GL), then pacing
        ctx.swap()
        engine.synchronize()

    diffs, ratios, bases, updates, fronts = [], [], [], [], []
    for _ in range(8):
        engine.remove_frame_hook(bridge)
        base_round = host_median_us(engine.update, n=300, before=end_of_frame)
        engine.add_frame_hook(bridge)
        in_update, in_front = [], []
        for _ in range(300):  # a zero-map frame: the engine's update, then the GL side picks its buffer
            end_of_frame()
            t0 = time.perf_counter_ns()
            engine.update()
            t1 = time.perf_counter_ns()
            ring.front()
            in_update.append(t1 - t0)
            in_front.append(time.perf_counter_ns() - t1)
        frame = statistics.median(a + b for a, b in zip(in_update, in_front, strict=True)) / 1e3
        pair = host_median_us(raw_pair, n=300, before=engine.synchronize) / 2  # one resource's map+unmap
        diffs.append(frame - base_round)
        ratios.append((frame - base_round) / pair)
        bases.append(base_round)
        updates.append(statistics.median(in_update) / 1e3)
        fronts.append(statistics.median(in_front) / 1e3)
    zero = statistics.median(diffs)
    print(
        f"   zero-map over 8 rounds: overhead {min(diffs):.2f}..{max(diffs):.2f} µs, ratio to one raw "
        f"map+unmap {min(ratios):.2f}..{max(ratios):.2f} (median {statistics.median(ratios):.2f}); update() "
        f"{statistics.median(bases):.2f} µs without the hook, {statistics.median(updates):.2f} with the "
        f"request; front() {statistics.median(fronts):.2f} µs; dropped {ring.dropped}",
        flush=True,
    )
    # Where the host time goes (each part alone, median of 2000 calls)
    query = ring._queries[0]
    parts = {
        "done word load": lambda: ring._done.value,
        "newest done slot": ring._newest_done,
        "glQueryCounter (end of a slot's draws)": lambda: ring._gl_counter(query, 0x8E28),
        "query availability check": lambda: ring._gl_query(query, 0x8867, ring._available_ref),
    }
    for name, fn in parts.items():
        print(f"   {name}: {host_median_us(fn):.2f} µs", flush=True)
    bridge.close()
    engine.synchronize()
    row("interop overhead per frame, zero-map (1 buffer)", zero, "raw map+unmap x1", raw / 2)
    ring.close()
    engine.remove(block)
    buf.close()
    tex.close()


def bench_texture_4k(engine: Engine) -> None:
    import cupy

    s = engine.device.stream
    w, h = 3840, 2160
    src = cupy.empty(w * h, dtype=cupy.uint32)
    dst = cupy.empty_like(src)
    peer = warm_gpu_ms(lambda: check(d.cuMemcpyDtoDAsync(dst.data.ptr, src.data.ptr, src.nbytes, s)), s)
    for flags, how in (("surface_ldst", "surface stores"), ("write_discard", "array copy")):
        tex = SharedTexture2D.create(w, h, format="rgba8", flags=flags)
        m = tex.map(stream=s)
        ours = warm_gpu_ms(lambda m=m: m.copy_from(src.data.ptr), s)
        m.unmap()
        tex.close()
        row(f"4K RGBA8 texture update, map + {how} (GPU)", ours * 1e3, "D2D copy same bytes", peer * 1e3)
    import ctypes

    from OpenGL import GL

    from cudapatch.errors import InteropError
    from cudapatch.interop._gl import gl_function
    from cudapatch.interop.imported import ImportedImage

    try:
        image = ImportedImage(w, h)
    except InteropError as exc:
        print("zero-map texture unavailable:", exc, flush=True)
        return
    # Zero-map: CUDA's part is the copy into the ring's buffer (the peer, same bytes); GL's part is
    # its compute-shader copy from that buffer into the texture, timed with a GL query over n copies.
    assert image.ring.write(src.data.ptr, src.nbytes, s)
    engine.synchronize()
    result = ctypes.c_uint64(0)
    get_u64 = gl_function("glGetQueryObjectui64v", None, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64))
    image.front()
    GL.glFinish()
    names = (ctypes.c_uint * 1)()
    GL.glGenQueries(1, names)
    query = int(names[0])
    n = 50
    GL.glBeginQuery(GL.GL_TIME_ELAPSED, query)
    for _ in range(n):
        image._shown = (-1, -1)  # copy again: what a new frame costs GL
        image.front()
    GL.glEndQuery(GL.GL_TIME_ELAPSED)
    get_u64(int(query), GL.GL_QUERY_RESULT, ctypes.byref(result))
    upload_ms = result.value / 1e6 / n
    GL.glDeleteQueries(1, names)
    row("4K RGBA8 texture update, zero-map: GL's copy (GPU)", upload_ms * 1e3, "D2D copy same bytes", peer * 1e3)
    row("  the same, with CUDA's copy into the ring", (upload_ms + peer) * 1e3, "D2D copy same bytes", peer * 1e3)
    image.close()


def particles(engine: Engine, capacity: int):
    e, f, i, t = (engine.add(cls()) for cls in (Emitter, Forces, Integrate, ToPoints))
    e.set("Capacity", capacity)
    e.set("Rate", capacity / 3.0)  # lifetimes average 3 s -> close to full at steady state
    e.set("MaxPerFrame", max(1 << 16, capacity // 60))
    engine.connect(e, "Particles", f, "Particles")
    engine.connect(f, "Particles", i, "Particles")
    engine.connect(i, "Particles", t, "Particles")
    engine.wait_ready()
    return e, f, i, t


def bench_particles(ctx: EglContext, results: dict) -> None:
    for capacity in (1_000_000, 10_000_000):
        engine = Engine(name="particles", wait_for_compile=True)
        ctx.make_current()
        blocks = particles(engine, capacity)
        for _ in range(240):  # fill up towards steady state
            engine.update()
        engine.synchronize()
        n = 300
        t0 = time.perf_counter()
        for _ in range(n):
            engine.update()
        engine.synchronize()
        fps = n / (time.perf_counter() - t0)
        engine.set_profiling("PerBlock")
        for _ in range(10):
            engine.update()
        engine.synchronize()
        st = engine.stats()
        per_block = {b.name: b.gpu_ms for b in st.blocks}
        row(f"particle engine frames/s, {capacity // 10**6}M particles", fps, unit="fps")
        print("   GPU ms per block:", {k: round(v, 4) if v else v for k, v in per_block.items()}, flush=True)
        results[f"engine_fps_{capacity}"] = fps
        results[f"block_ms_{capacity}"] = per_block
        engine.set_profiling("None")
        big = EglContext(1920, 1080)
        engine.device.make_current()
        for zero_map in (True, False):
            with Preview(engine, big, points=(blocks[3], "Points"), overlay=True, zero_map=zero_map) as preview:
                preview.run(30)
                report = preview.run(200)
                used = preview.zero_map  # False where the coherence check made it fall back
            how = "zero-map" if used else "map/unmap" + (" (zero-map fell back)" if zero_map else "")
            row(f"preview 1920x1080 + overlay, {capacity // 10**6}M points, {how}", report.fps, unit="fps")
            results[f"preview_fps_{capacity}_{how}"] = report.fps
        big.close()
        engine.close()


def main() -> None:
    ctx = EglContext(256, 256)
    print("GL:", ctx.info(), flush=True)
    engine = Engine(name="bench", wait_for_compile=True)
    ctx.make_current()
    engine.device.make_current()
    bench_bridge(engine, ctx)
    bench_texture_4k(engine)
    engine.close()
    results: dict = {}
    if "--bridge-only" in sys.argv:
        return
    bench_particles(ctx, results)
    results["rows"] = ROWS
    write_results("interop.json", results, default=str)
    ctx.close()


if __name__ == "__main__":
    main()
