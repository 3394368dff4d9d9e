"""Fixtures for tests that need a CUDA device (all marked ``gpu``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cudapatch import Block, BlockBuilder, CustomKernel, Engine, While
from cudapatch.kernels import PtxFileSource
from cudapatch.kernels._driver import check, driver
from cudapatch.kernels.types import bfloat16_bits

KERNELS = Path(__file__).parent / "kernels"


# CUDA C kernels the region tests build their loops from.
ADD = """extern "C" __global__ void add(/*inout*/ float* x, float step, unsigned int n)
{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += step; }"""
HALVE = """extern "C" __global__ void halve(/*inout*/ float* x, unsigned int n)
{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 0.5f; }"""
ABOVE = """extern "C" __global__ void above(const float* in, int* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] > level; }"""


def halving_while(
    engine: Engine, start: Block, *, unroll: int = 1, region: Block | None = None
) -> tuple[While, CustomKernel, CustomKernel]:
    """``While Halving { Halve: x *= 0.5; Check: more = x[0] > 1 }`` on ``start``'s ``Out`` (in
    ``region``, if given): ``(the While, Halve, Check)``. From 1024, ten halvings reach 1.0."""
    solve = engine.add(While(name="Halving", Max=100, Unroll=unroll), region=region)
    halve = engine.add(CustomKernel(name="Halve", Code=HALVE), region=solve)
    check = engine.add(CustomKernel(name="Check", Code=ABOVE, level=1.0), region=solve)
    engine.connect(start, "Out", halve, "x")
    engine.connect(halve, "x", check, "in")
    engine.connect(check, "more", solve, "Condition")
    return solve, halve, check


class Spin(Block):
    """Busy-waits ``Cycles`` GPU clock cycles (to prove the frame path does not wait)."""

    type_name = "Spin"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(PtxFileSource(KERNELS / "spin.ptx"))
        b.output("Out", k.out(0), size=32)
        b.scalar("Cycles", k.in_(1), default=1000)
        k.auto_grid(32, count_param=2)


@pytest.fixture
def engine() -> Iterator[Engine]:
    """An engine whose update() waits for kernel compiles: deterministic frames for result checks."""
    e = Engine(wait_for_compile=True)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def unfused_engine() -> Iterator[Engine]:
    """``engine`` with fusion off (``Engine(fuse=False)``): every block on nodes of its own, for tests of
    one block's node, buffer or tier (fused counterparts: test_fusion_gpu.py)."""
    e = Engine(wait_for_compile=True, fuse=False)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def live_engine(tmp_path) -> Iterator[Engine]:
    """An engine as a live host runs it: compiles in the background, a fresh kernel cache."""
    e = Engine(cache_dir=tmp_path / "kernel-cache")
    try:
        yield e
    finally:
        e.close()


def run_until(engine: Engine, predicate, timeout: float = 30.0, sleep: float = 0.002) -> int:
    """Run frames until ``predicate()`` holds; returns the number of frames it took."""
    import time

    deadline = time.monotonic() + timeout
    frames = 0
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached after {frames} frames ({timeout} s)")
        engine.update()
        frames += 1
        time.sleep(sleep)
    return frames


def stream_idle(engine: Engine) -> bool:
    """Whether every piece of work queued on the engine's stream is done (``cuStreamQuery``)."""
    d = driver()
    (err,) = d.cuStreamQuery(engine.device.stream)
    if err == d.CUresult.CUDA_ERROR_NOT_READY:
        return False
    check((err,), "cuStreamQuery")
    return True


class StreamMark:
    """An event recorded on the engine's stream behind the work queued so far: ``pending()`` says
    whether that work still runs. Whether a call waited for the GPU is then a fact the driver states
    (the event reached or not), not a host time compared with a bound."""

    def __init__(self, engine: Engine) -> None:
        d = driver()
        self._event = check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
        check(d.cuEventRecord(self._event, engine.device.stream), "cuEventRecord")

    def pending(self) -> bool:
        d = driver()
        (err,) = d.cuEventQuery(self._event)
        if err == d.CUresult.CUDA_ERROR_NOT_READY:
            return True
        check((err,), "cuEventQuery")
        return False

    def close(self) -> None:
        check(driver().cuEventDestroy(self._event), "cuEventDestroy")

    def __enter__(self) -> StreamMark:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def random_values(type_name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Fresh random data in the NumPy storage of element type ``type_name`` (``shape_blocks.COPY_TYPES``;
    vector types: a last axis of lanes)."""
    if type_name in ("char", "uchar", "short", "ushort"):
        dt = {"char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16}[type_name]
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dt)
    if type_name == "half":
        return rng.standard_normal(n).astype(np.float16)
    if type_name == "bfloat16":
        return bfloat16_bits(rng.standard_normal(n))
    if type_name == "uchar4":
        return rng.integers(0, 255, size=(n, 4), endpoint=True, dtype=np.uint8)
    lanes = int(type_name[-1])
    return rng.standard_normal((n, lanes)).astype(np.float32)


def interpreted_then_jitted(monkeypatch: pytest.MonkeyPatch, make_block) -> np.ndarray:
    """An Expression's quick build run twice in fresh engines: by the bytecode interpreter's cubin (no
    JIT), then, the interpreter turned off, by the program's PTX the driver JITs. ``make_block(engine)``
    adds the Expression (and what feeds it). Asserts both builds ran and gave the same bits; returns
    the output."""
    from cudapatch.expr import ProgramSource
    from cudapatch.expr.bytecode import INTERPRETERS

    monkeypatch.setattr(ProgramSource, "upgrade", lambda self: None)  # keep the first build running
    results, kinds = [], []
    for interpreted in (True, False):
        with Engine(wait_for_compile=True, cache_dir=False) as e:
            block = make_block(e)
            program = block.source.program
            assert program is not None
            if interpreted:
                found = INTERPRETERS.get(
                    len(program.inputs), len(program.scalars), e.device.arch, wait=True, lanes=program.input_lanes
                )
                assert found is not None, "the interpreter did not compile"
            else:
                monkeypatch.setattr(INTERPRETERS, "get", lambda *a, **k: None)
            e.update()
            running = e.kernels.running((block.id, 0))
            assert running is not None
            kinds.append(running.image.kind)
            results.append(e.read(block, "Out"))
    assert kinds == ["cubin", "ptx"]  # the interpreter's cubin, then the PTX the driver JITs
    np.testing.assert_array_equal(results[0], results[1])
    return results[0]
