"""Lifecycle of every handle type: double close, use after close, context managers."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CudapatchError, DType, Engine, Scale
from cudapatch.engine import DeviceContext, GpuBuffer, compile_plan, realize
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
