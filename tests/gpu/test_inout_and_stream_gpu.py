"""On the GPU: an appending kernel whose ``inout`` counter the user binds keeps adding to that counter
in place over frames (never zeroed, never reallocated by the engine), and CuPy work queued on
``engine.stream`` after ``update()`` sees that frame's outputs with no synchronize in between."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, Fill, KernelFile, Scale
from cudapatch.kernels.source import BUNDLED_KERNEL_DIR

pytestmark = pytest.mark.gpu

APPEND_CODE = """\
extern "C" __global__ void keep_big(const float* in, float* out, /*inout*/ unsigned int* counter,
                                    float threshold, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] > threshold) {
        unsigned int slot = atomicAdd(counter, 1u);
        if (slot < n) out[slot] = in[i];
    }
}
"""

#: The appending kernel as VL.CudaGraph ships it (PTX + JSON sidecar, ``uint* counter`` inout) and as CUDA C++.
MAKERS = {
    "KernelFile-ptx": lambda n: KernelFile(BUNDLED_KERNEL_DIR / "append_filter.ptx", name="keep", capacity=n),
    "CustomKernel": lambda n: CustomKernel(name="keep", Code=APPEND_CODE),
}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_an_appending_kernel_adds_to_the_users_counter_in_place_over_frames(make, rng):
    cp = pytest.importorskip("cupy")
    n, thr = 100_000, 0.6
    x = rng.standard_normal(n).astype(np.float32)
    ref = np.sort(x[x > np.float32(thr)])
    m = ref.size
    assert 3 * m <= n  # three frames of appends fit in the output
    with Engine(wait_for_compile=True) as engine:
        keep = engine.add(make(n))
        keep.set("threshold", thr)
        engine.bind(keep, "in", x)
        on_engine = cp.cuda.Stream.from_external(engine)
        with on_engine:
            counter = cp.zeros(1, dtype=cp.uint32)
        on_engine.synchronize()
        engine.bind(keep, "counter", counter)
        engine.wait_ready()
        for frame in range(1, 4):
            engine.update()
            engine.synchronize()
            # the engine neither zeroed nor replaced the user's counter: each frame adds m to it
            assert int(counter.get()[0]) == frame * m, f"frame {frame}"
            out = engine.read(keep, "out")
            np.testing.assert_array_equal(np.sort(out[: frame * m]), np.sort(np.tile(ref, frame)))
        engine.update()  # a fourth frame overruns: the kernel counts on but writes nothing past its output
        engine.synchronize()
        assert int(counter.get()[0]) == 4 * m
        assert not [d for d in engine.diagnostics(keep) if d.severity == "error"]
        # the user starts it again, on the engine's stream, ordered before the next frame
        with on_engine:
            counter.fill(0)
        engine.update()
        engine.synchronize()
        assert int(counter.get()[0]) == m
        np.testing.assert_array_equal(np.sort(engine.read(keep, "out")[:m]), ref)


def test_an_unbound_inout_counter_keeps_the_block_out_naming_the_port(rng):
    with Engine(wait_for_compile=True) as engine:
        keep = engine.add(CustomKernel(name="keep", Code=APPEND_CODE))
        engine.bind(keep, "in", rng.standard_normal(1000).astype(np.float32))
        engine.wait_ready()
        engine.update()
        engine.synchronize()
        messages = [d.message for d in engine.diagnostics(keep)]
        assert any("'counter'" in msg for msg in messages), messages
        assert engine.graph is not None and keep.id not in engine.graph.plan.block_order


@pytest.mark.parametrize("isolated", [False, True], ids=["engine", "isolated"])
def test_cupy_on_the_engine_stream_runs_after_each_frame_with_no_synchronize(isolated, rng):
    cp = pytest.importorskip("cupy")
    frames, factor = 12, float(rng.uniform(1.5, 3.0))
    values = rng.uniform(1.0, 100.0, frames).astype(np.float32)
    with Engine(isolated=isolated, wait_for_compile=True) as engine:
        fill = engine.add(Fill(name="fill", Count=1 << 22, Value=-1.0))
        scale = engine.add(Scale(name="scale", Factor=factor))
        engine.connect(fill, "Out", scale, "In")
        engine.wait_ready()
        engine.update()
        engine.synchronize()
        out = cp.asarray(engine.output(scale, "Out"))  # a view made once, before the frames
        stream = engine.stream
        assert stream is engine.stream and int(stream) != 0  # read-only, the same handle each time
        with pytest.raises(AttributeError):
            engine.stream = stream  # type: ignore[misc]
        on_engine = cp.cuda.Stream.from_external(engine)
        with on_engine:
            lows = cp.full(frames, np.nan, dtype=cp.float32)
            highs = cp.full(frames, np.nan, dtype=cp.float32)
        for k in range(frames):
            fill.set("Value", float(values[k]))  # Hot: the next frame writes k's value everywhere
            engine.update()
            if isolated:  # host time only (no GPU wait): an isolated engine drops frames while its child lags
                time.sleep(0.05)
            with on_engine:  # queued behind frame k: never the frame before, never half of it
                lows[k] = out.min()
                highs[k] = out.max()
        on_engine.synchronize()  # the first wait of the loop, after every frame was queued
        assert getattr(engine.counters, "frames_dropped", 0) == 0
        want = (values.astype(np.float32) * np.float32(factor)).astype(np.float32)
        np.testing.assert_array_equal(cp.asnumpy(lows), want)
        np.testing.assert_array_equal(cp.asnumpy(highs), want)
