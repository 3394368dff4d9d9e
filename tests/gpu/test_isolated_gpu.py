"""The isolated engine on the GPU: the same results as a normal engine, outputs shared with no
copy, and (marked ``gpu_fault``, run last) a planted fault that ends only the engine process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudapatch import Engine, Fill, Scale, VectorAdd
from cudapatch.blocks.shape import Shape
from cudapatch.isolated import IsolatedEngine

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("isolated_fault_scenario.py")


def _patch(e, value: float, factor: float):
    f = e.add(Fill(name="f", Count=5000, Value=value))
    s = e.add(Scale(name="s", Factor=factor, Offset=0.5))
    a = e.add(VectorAdd(name="a"))
    e.connect(f, "Out", s, "In")
    e.connect(s, "Out", a, "A")
    e.connect(f, "Out", a, "B")
    return f, s, a


def test_isolated_results_equal_a_normal_engine(rng):
    value, factor = float(rng.uniform(1, 5)), float(rng.uniform(-3, 3))
    with Engine(wait_for_compile=True) as normal, Engine(isolated=True, wait_for_compile=True) as iso:
        results = []
        for e in (normal, iso):
            f, s, a = _patch(e, value, factor)
            e.wait_ready()
            for _ in range(2):
                e.update()
            first = e.read(a, "Sum")
            s.set("Factor", factor * 2)  # Hot
            e.update()
            results.append((first, e.read(a, "Sum")))
        for (n1, n2), (i1, i2) in zip(results[:1], results[1:], strict=True):
            np.testing.assert_array_equal(n1, i1)
            np.testing.assert_array_equal(n2, i2)
        assert np.allclose(results[1][1], value * factor * 2 + 0.5 + value)


def test_outputs_are_the_childs_memory_with_no_copy(rng):
    import cupy as cp

    with Engine(isolated=True, wait_for_compile=True) as iso:
        f, s, a = _patch(iso, 2.0, 3.0)
        iso.wait_ready()
        iso.update()
        out = iso.output(a, "Sum")
        view = cp.asarray(out)  # the IPC mapping: no copy, the same pointer each frame
        assert view.data.ptr == out.ptr
        iso.synchronize()
        assert np.allclose(cp.asnumpy(view), 2.0 * 3.0 + 0.5 + 2.0)
        value = float(rng.uniform(5, 9))
        f.set("Value", value)  # the child writes new values into the same buffer
        iso.update()
        assert iso.output(a, "Sum").ptr == out.ptr
        iso.synchronize()
        assert np.allclose(cp.asnumpy(view), value * 3.0 + 0.5 + value)


def test_bound_host_memory_is_read_by_the_child_with_no_copy(rng):
    import cupy as cp

    data = rng.standard_normal(5000).astype(np.float32)
    src = cp.asarray(data)
    with Engine(isolated=True, wait_for_compile=True) as iso:
        s = iso.add(Scale(name="s", Factor=2.0, Offset=0.0))
        iso.bind(s, "In", src)
        iso.wait_ready()
        iso.update()
        np.testing.assert_allclose(iso.read(s, "Out"), data * 2.0, rtol=1e-6)
        src *= 3  # the host writes its memory; the child reads the same bytes
        cp.cuda.Device().synchronize()
        iso.update()
        np.testing.assert_allclose(iso.read(s, "Out"), data * 6.0, rtol=1e-6)


def _counters(e):
    """The counters of the engine that runs the graph (an isolated engine's child's)."""
    return e.engine_counters() if isinstance(e, IsolatedEngine) else e.counters


def test_a_warm_growth_reaches_the_host_outputs_as_in_process(rng):
    """Rebinding an input twice the size grows the output in place (Warm, no new graph): the host's
    ``output()``, ``output_shape()`` and ``read()`` give the new size and values, and the child counts
    the same rebuilds (none) and growths as an engine in this process."""
    import cupy as cp

    n = 30_000
    x1 = cp.asarray(rng.standard_normal(n).astype(np.float32))
    x2 = cp.asarray(rng.standard_normal(2 * n).astype(np.float32))
    cp.cuda.get_current_stream().synchronize()  # bound arrays are written before the update
    deltas = []
    with Engine(wait_for_compile=True) as normal, Engine(isolated=True, wait_for_compile=True) as iso:
        for e in (normal, iso):
            s = e.add(Scale(name="s", Factor=2.0, Offset=1.0))
            keep = e.add(Fill(name="keep", Count=1000, Value=4.0))  # not resized: its mapping stays valid
            e.bind(s, "In", x1)
            e.keep(s, "Out")  # read by the host from the first build on: the same plan in both
            e.keep(keep, "Out")
            e.wait_ready()
            e.update()
            e.synchronize()
            kept = cp.asarray(e.output(keep, "Out"))
            out = e.output(s, "Out")
            assert out.count == n and e.output_shape(s, "Out") == Shape.flat(n)
            np.testing.assert_allclose(cp.asnumpy(cp.asarray(out)), cp.asnumpy(x1) * 2 + 1, rtol=1e-6)
            before = _counters(e)
            before = (before.rebuilds, before.growths, before.instantiations)
            e.bind(s, "In", x2)  # twice the size: the output outgrows its buffer, reallocated Warm
            e.update()
            e.wait_ready()  # the child has applied it and sent the outputs it moved
            e.update()
            e.synchronize()
            out = e.output(s, "Out")
            assert out.count == 2 * n and e.output_shape(s, "Out") == Shape.flat(2 * n)
            view = cp.asarray(out)
            assert view.shape == (2 * n,)
            want = cp.asnumpy(x2) * 2 + 1
            np.testing.assert_allclose(cp.asnumpy(view), want, rtol=1e-6)
            np.testing.assert_allclose(e.read(s, "Out"), want, rtol=1e-6)
            assert np.allclose(cp.asnumpy(kept), 4.0)  # the view taken before the growth still reads
            after = _counters(e)
            deltas.append((after.rebuilds - before[0], after.growths - before[1], after.instantiations - before[2]))
    assert deltas[0][0] == 0 and deltas[0][1] >= 1 and deltas[0][2] == 0, deltas  # in process: Warm, grown
    assert deltas[1] == deltas[0], deltas  # the child did the same


@pytest.mark.gpu_fault
def test_a_planted_fault_ends_only_the_engine_process_20_times():
    out = subprocess.run([sys.executable, str(SCENARIO), "20"], capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().startswith("OK"), out.stdout + out.stderr[-4000:]
    times = [float(t) for t in out.stdout.split()[1:]]
    assert len(times) == 20
    # How soon it runs again is measured by benchmarks/bench_isolated.py (no timed assertions here).
