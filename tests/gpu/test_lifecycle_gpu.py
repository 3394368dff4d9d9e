"""Lifecycle of every handle type: double close, use after close, context managers, and the
finalizer policy of ``cudapatch._lifecycle`` on the real driver."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cudapatch import CudapatchError, DType, Engine, Scale
from cudapatch._lifecycle import Lifecycle
from cudapatch.engine import BufferPool, DeviceContext, GpuBuffer, compile_plan, realize
from cudapatch.engine.libraries import LibraryHandles
from cudapatch.errors import KernelLoadError
from cudapatch.kernels import ModuleCache, bundled_kernel

pytestmark = pytest.mark.gpu


def test_device_context() -> None:
    dev = DeviceContext(0)
    assert dev.arch.startswith("sm_") and dev.total_memory > 0 and "closed=False" in repr(dev)
    free, total = dev.mem_info()
    assert 0 < free <= total
    dev.close()
    dev.close()
    assert dev.is_closed
    with DeviceContext(0) as d2:
        assert not d2.is_closed
    assert d2.is_closed


def test_device_out_of_range() -> None:
    from cudapatch import CudaUnavailableError

    with pytest.raises(CudaUnavailableError, match="device 999 requested"):
        DeviceContext(999)


def test_gpu_buffer(engine: Engine) -> None:
    rng = np.random.default_rng()
    host = rng.standard_normal(1000).astype(np.float32)
    with GpuBuffer(engine.pool, DType.FLOAT32, 1000, stream=engine.device.stream) as buf:
        buf.upload(host)
        np.testing.assert_array_equal(buf.download(), host)
        with pytest.raises(CudapatchError, match="upload of float64"):
            buf.upload(host.astype(np.float64))
        with pytest.raises(CudapatchError, match="4 bytes into a buffer of 4000"):
            buf.upload(host[:1])
        in_use = engine.pool.in_use_bytes
    assert buf.is_closed and engine.pool.in_use_bytes == in_use - buf.capacity_bytes
    buf.close()  # idempotent
    with pytest.raises(CudapatchError, match="closed"):
        buf.download()
    with pytest.raises(CudapatchError, match="closed"):
        buf.__cuda_array_interface__  # noqa: B018


def test_vector_buffer_round_trip(engine: Engine) -> None:
    host = np.random.default_rng().standard_normal((10, 4)).astype(np.float32)
    with GpuBuffer(engine.pool, DType.FLOAT4, 10, stream=engine.device.stream) as buf:
        buf.upload(host)
        assert buf.__cuda_array_interface__["shape"] == (10, 4)
        np.testing.assert_array_equal(buf.download(), host)


def test_module_cache(engine: Engine) -> None:
    img = bundled_kernel("scale").load()
    cache = ModuleCache(device_key=engine.device.key)
    fn1, fn2 = cache.function(img), cache.function(img)
    assert int(fn1) == int(fn2) and cache.misses == 1 and cache.hits == 1 and img in cache
    assert cache.evict(img) and not cache.evict(img) and len(cache) == 0
    cache.function(img)
    cache.close()
    cache.close()
    with pytest.raises(KernelLoadError, match="closed"):
        cache.function(img)


def test_compiled_graph(engine: Engine) -> None:
    s = engine.add(Scale(name="s"))
    engine.bind(s, "In", np.ones(64, np.float32))
    plan = compile_plan(engine.context.snapshot())
    functions = {(s.id, 0): engine.modules.function(bundled_kernel("scale").load())}  # PTX, loaded by the driver
    g = realize(plan, device=engine.device, pool=engine.pool, functions=functions, bindings=engine.context.bindings)
    g.adopt(None)
    assert "closed=False" in repr(g) and g.kernel_count == 1
    g.update_scalar(s.id, "Factor", 4.0)
    assert g.node_arg(0, 2) == 4.0
    g.launch(engine.device.stream)
    engine.synchronize()
    np.testing.assert_array_equal(g.output(s.id, "Out").download(), np.full(64, 4.0, np.float32))
    with pytest.raises(CudapatchError, match="not a kernel node"):
        g.update_grid(5, 1)
    with g:
        pass
    assert g.is_closed
    g.close()


def test_engine_context_manager_and_double_close() -> None:
    with Engine() as e:
        e.add(Scale(name="s"))
        assert "CudaEngine: 1 blocks" in str(e)
    assert e.is_closed
    e.close()


# -- the lifecycle protocol over every owner an engine can make (cudapatch/_lifecycle.py) -----------
def _readback(engine: Engine) -> tuple[Any, Any]:
    from cudapatch.engine.readback import ReadbackRing

    block = GpuBuffer(engine.pool, DType.UINT64, 8, stream=engine.device.stream)
    ring = ReadbackRing(block.ptr, 4, stamps=1, frames_ptr=block.ptr + 48, stream=engine.device.stream)
    return ring, block  # the block outlives the ring


def _surface_writer(engine: Engine) -> tuple[Any, Any]:
    from cudapatch.interop.surface import SurfaceWriter

    return SurfaceWriter(64, 32, 4), None


def _gpu_buffer(engine: Engine) -> tuple[Any, Any]:
    return GpuBuffer(engine.pool, DType.FLOAT32, 10, stream=engine.device.stream), None


def _graph(engine: Engine) -> tuple[Any, Any]:
    s = engine.add(Scale(name=f"s{len(engine.blocks)}"))
    engine.bind(s, "In", np.ones(64, np.float32))
    plan = compile_plan(engine.context.snapshot())
    functions = {(b.id, 0): engine.modules.function(bundled_kernel("scale").load()) for b in engine.blocks}
    g = realize(plan, device=engine.device, pool=engine.pool, functions=functions, bindings=engine.context.bindings)
    g.adopt(None)
    return g, None


def _upload_ring(engine: Engine) -> tuple[Any, Any]:
    from cudapatch.blocks.library.transfer import Upload
    from cudapatch.engine import UploadRing

    block = engine.add(Upload(name=f"up{len(engine.blocks)}", Count=16))
    return UploadRing(engine, block), None


def _download_ring(engine: Engine) -> tuple[Any, Any]:
    from cudapatch.blocks.library.transfer import Download
    from cudapatch.engine import DownloadRing

    block = engine.add(Download(name=f"down{len(engine.blocks)}"))
    return DownloadRing(engine, block, count=16), None


_OWNERS: dict[str, tuple[Callable[[Engine], tuple[Any, Any]], Callable[[Any], Any] | None]] = {
    "ReadbackRing": (_readback, lambda r: r.publish_args()),
    "SurfaceWriter": (_surface_writer, lambda w: w.write(0, 0, 64, None)),
    "GpuBuffer": (_gpu_buffer, lambda b: b.download()),
    "BufferPool": (lambda e: (BufferPool(e.device.make_current), None), lambda p: p.acquire(64)),
    "ModuleCache": (
        lambda e: (ModuleCache(device_key=e.device.key), None),
        lambda c: c.function(bundled_kernel("scale").load()),
    ),
    "LibraryHandles": (lambda e: (LibraryHandles(e.device, e.pool), None), lambda h: h.scope((1, 0))),
    "CompiledGraph": (_graph, lambda g: g.replay(0)),
    "DeviceContext": (lambda e: (DeviceContext(0), None), lambda d: d.mem_info()),
    "UploadRing": (_upload_ring, lambda r: r.write(np.zeros(16, np.float32))),
    "DownloadRing": (_download_ring, lambda r: r.read()),
}


@pytest.mark.parametrize("name", list(_OWNERS), ids=list(_OWNERS))
def test_every_owner_follows_the_lifecycle_protocol(engine: Engine, name: str) -> None:
    make, use = _OWNERS[name]
    owner, keep = make(engine)
    assert isinstance(owner, Lifecycle) and not owner.is_closed and "closed=False" in repr(owner)
    owner.close()
    owner.close()
    assert owner.is_closed
    if use is not None:
        with pytest.raises(CudapatchError, match="closed"):
            use(owner)
    with make(engine)[0] as other:
        assert not other.is_closed
    assert other.is_closed
    engine.synchronize()  # no fault left behind by any of it
    del keep


# (An Upload/DownloadRing bound to an engine is kept alive by the binding: tests/unit covers its finalizer.)
@pytest.mark.parametrize("name", ["ReadbackRing", "SurfaceWriter", "DeviceContext"])
def test_an_unclosed_driver_owner_is_released_by_its_finalizer_with_a_warning(engine: Engine, name: str) -> None:
    owner, keep = _OWNERS[name][0](engine)
    with pytest.warns(ResourceWarning, match=f"unclosed {name}.*released by its finalizer"):
        del owner
        gc.collect()
    # A DeviceContext's finalizer released its streams and its retain of the primary context, which
    # the engine retains too: the engine's context lives on and runs.
    engine.device.make_current()
    engine.synchronize()
    del keep


def test_engine_parts_dropped_unclosed_are_released_quietly(engine: Engine) -> None:
    """A graph's finalizer destroys its graphs, a buffer's gives its block back to the pool: no
    warning (warnings are errors here), no fault, and the pool reuses the block."""
    pool = BufferPool(engine.device.make_current)
    host = np.random.default_rng().standard_normal(1000).astype(np.float32)
    buf = GpuBuffer(pool, DType.FLOAT32, 1000, stream=engine.device.stream)
    buf.upload(host)
    ptr = buf.ptr
    del buf
    gc.collect()
    assert pool.in_use_bytes == 0 and pool.idle_bytes > 0
    again = GpuBuffer(pool, DType.FLOAT32, 1000, stream=engine.device.stream)
    assert again.ptr == ptr and pool.driver_allocations == 1  # the same block, no new cuMemAlloc
    graph, _ = _graph(engine)
    graph.launch(engine.device.stream)
    del graph
    gc.collect()
    engine.synchronize()
    pool.close()  # frees the block ``again`` still holds: the buffer is closed with it
    assert again.is_closed
    with pytest.raises(CudapatchError, match="GpuBuffer.download: GpuBuffer float\\[1000\\] is closed"):
        again.download()


def test_abandoned_owners_forget_their_handles_without_freeing_them(engine: Engine) -> None:
    from cudapatch.kernels._driver import check, driver

    ring, keep = _readback(engine)
    writer, _ = _surface_writer(engine)
    host, module = ring._host, writer._module
    ring.abandon()
    writer.abandon()
    assert ring.is_closed and writer.is_closed and ring.poll() is False
    del ring, writer
    gc.collect()  # no finalizer runs: nothing warns (warnings are errors here)
    d = driver()  # forgotten, not freed: giving them back now succeeds, once
    check(d.cuMemFreeHost(host), "cuMemFreeHost")
    check(d.cuModuleUnload(module), "cuModuleUnload")
    del keep
