"""The kernel builder's pacing (its work runs after a frame, not during one), the compiler process's
pipe protocol, and swaps done between frames. NVRTC compiles for real on the CPU; only loading a
cubin needs a driver, so the module loader here hands out a token instead of a CUfunction."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from cudapatch import CudaSource, CustomKernel
from cudapatch.engine import Context
from cudapatch.engine.kernels import KernelOutcome, KernelTracker
from cudapatch.errors import KernelCompileError
from cudapatch.kernels import CubinCache, KernelBuilder, ModuleCache
from cudapatch.kernels import builder as builder_module
from cudapatch.kernels.builder import CompiledKernel
from cudapatch.kernels.compiler_process import CompilerProcess
from cudapatch.kernels.pacing import FrameGate
from cudapatch.kernels.source import KernelImage, KernelSource

ELF = b"\x7fELF"
GAIN = """extern "C" __global__ void k(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
"""


class _Loader(ModuleCache):
    """Loads nothing: returns the image's key (a GPU-less stand-in for cuModuleLoadData)."""

    def function(self, image: KernelImage) -> str:
        return f"fn:{image.key}"


def _builder(*, paced: bool, idle_s: float = 60.0) -> KernelBuilder:
    return KernelBuilder(
        arch="sm_90",
        cache=CubinCache(False),
        modules=_Loader(device_key="t"),
        make_current=lambda: None,
        paced=paced,
        idle_s=idle_s,
    )


def test_frame_gate_wakes_one_waiter_per_open() -> None:
    gate = FrameGate()
    assert not gate.wait(0.01)  # closed until opened
    woke: list[float] = []

    def waiter() -> None:
        gate.wanted = True
        if gate.wait(5.0):
            woke.append(time.monotonic())

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    assert not woke and gate.wanted
    opened = time.monotonic()
    gate.open()
    t.join(5.0)
    assert woke and woke[0] >= opened and not gate.wanted
    gate.open()
    gate.open()  # opening an open gate is harmless; the next wait passes once
    assert gate.wait(0.0) and not gate.wait(0.01)


def test_a_paced_builder_works_only_after_a_frame() -> None:
    b = _builder(paced=True)
    try:
        fut = b.submit(CudaSource(code=GAIN))
        time.sleep(0.3)
        assert not fut.done() and b.gate.wanted  # it waits for the engine's frame to end
        for _ in range(400):  # frames: each one lets the builder take a step
            b.gate.open() if b.gate.wanted else None
            if fut.done():
                break
            time.sleep(0.005)
        ck = fut.result(timeout=0)
        assert ck.image.image.startswith(ELF) and ck.origin == "compiled" and ck.function == f"fn:{ck.image.key}"
        again = b.submit(CudaSource(code=GAIN))
        b.gate.open()
        assert again.result(timeout=5).origin == "memory"
    finally:
        b.close()


def test_an_unpaced_builder_and_unpaced_blocks_start_at_once() -> None:
    b = _builder(paced=True)
    try:
        with b.unpaced():
            fut = b.submit(CudaSource(code=GAIN.replace("gain;", "gain * 3.0f;")))
            assert fut.result(timeout=60).origin == "compiled"
    finally:
        b.close()
    free = _builder(paced=False)
    try:
        bad = free.submit(CudaSource(code=GAIN.replace("gain;", "undefined_thing;")))
        exc = bad.exception(timeout=60)
        assert isinstance(exc, KernelCompileError) and "undefined_thing" in str(exc)
    finally:
        free.close()


@dataclass(frozen=True)
class _Heavy(KernelSource):
    """A source whose Python costs ``ms`` before anything is compiled (a fused group's source rendered
    for its cache key), compiled at once; it notes when it was taken up."""

    name: str
    ms: float
    taken: list = field(default_factory=list, compare=False, hash=False)

    @property
    def debug_name(self) -> str:
        return self.name

    def describe(self) -> Any:
        return CudaSource(code=GAIN).describe()

    def cache_key(self, arch: str) -> str:
        self.taken.append((self.name, time.monotonic()))
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass
        return f"heavy-{self.name}"

    def compile(self, arch: str) -> KernelImage:
        return KernelImage(self.describe(), ELF, "cubin", f"k-{self.name}", self.name)


def test_a_paced_step_starts_requests_only_just_after_the_frame_that_woke_it() -> None:
    # Requests whose Python takes 3 ms each: the step after a frame takes two (the budget ran out
    # after the second), the next frame's end the next two; none starts late in a frame interval.
    # The cache key is worked out once per request, compiled or not (a fused source renders for it).
    b = _builder(paced=True)
    taken: list = []
    try:
        futures = [b.submit(_Heavy(f"h{i}", 3.0, taken)) for i in range(5)]
        time.sleep(0.05)
        assert not taken and b.gate.wanted
        opened: list[float] = []
        while len(taken) < 5 and len(opened) < 10:
            opened.append(time.monotonic())
            b.gate.open()
            time.sleep(0.05)  # a frame interval
        steps = [len([t for _, t in taken if a <= t < a + 0.05]) for a in opened]
        assert sum(steps) == 5 and all(n in (1, 2) for n in steps)  # 2 unless a preempted one ran past the budget
        late = [t - max(a for a in opened if a <= t) for _, t in taken]
        assert max(late) < builder_module.STEP_BUDGET_S + 0.01  # (scheduling slack)
        assert [n for n, _ in taken] == [f"h{i}" for i in range(5)]  # each keyed once, compiled or not
        assert all(f.result(timeout=5).origin == "compiled" for f in futures)
    finally:
        b.close()
    idle = _builder(paced=True, idle_s=0.05)  # no frames come (a host paused): no frame to keep clear of
    taken.clear()
    try:
        futures = [idle.submit(_Heavy(f"i{i}", 3.0, taken)) for i in range(6)]
        idle.gate.open()  # one frame, then none: what its step left runs after idle_s, all in one step
        assert all(f.result(timeout=5).origin == "compiled" for f in futures)
        starts = [t for _, t in taken]
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert max(gaps) > 0.04 and sum(g > 0.04 for g in gaps) == 1  # one wait of idle_s, not one per request pair
    finally:
        idle.close()
    free = _builder(paced=True)
    taken.clear()
    try:
        with free.unpaced():  # waited for (``Engine.wait_ready``): all at once
            futures = [free.submit(_Heavy(f"u{i}", 3.0, taken)) for i in range(5)]
            assert all(f.result(timeout=5).origin == "compiled" for f in futures)
    finally:
        free.close()


@dataclass(frozen=True)
class _FileKernel(KernelSource):
    """A source read from a file, which ``edit_during_compile`` rewrites while the compile runs."""

    path: Any
    edit_during_compile: str = ""

    @property
    def debug_name(self) -> str:
        return "file"

    def describe(self) -> Any:
        return CudaSource(code=GAIN).describe()

    def watched_files(self) -> tuple:
        return (self.path,)

    def cache_key(self, arch: str) -> str:
        return "file-" + self.path.read_text()

    def compile(self, arch: str) -> KernelImage:
        text = self.path.read_text()
        if self.edit_during_compile:
            self.path.write_text(self.edit_during_compile)
        return KernelImage(self.describe(), ELF + text.encode(), "cubin", f"k-{text}", "file")


def test_a_kernel_whose_file_changed_while_it_compiled_is_not_cached_under_either_version(tmp_path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("v1")
    b = _builder(paced=False)
    try:
        first = b.submit(_FileKernel(path, edit_during_compile="v2")).result(timeout=5)
        assert first.image.image == ELF + b"v1" and first.origin == "compiled"
        again = b.submit(_FileKernel(path)).result(timeout=5)  # v2 now: compiled, not v1 from the cache
        assert again.image.image == ELF + b"v2" and again.origin == "compiled"
        third = b.build(_FileKernel(path))  # unchanged while it compiled: kept
        assert third.origin == "memory" and third.image.image == ELF + b"v2"
    finally:
        b.close()


def test_closing_fails_what_was_not_built() -> None:
    b = _builder(paced=True)
    fut = b.submit(CudaSource(code=GAIN.replace("gain;", "gain + 7.0f;")))
    b.close()
    assert fut.cancelled() or fut.exception(timeout=5) is not None
    assert b.is_closed


def test_compiler_process_serves_jobs_over_its_pipe() -> None:
    proc = CompilerProcess()
    try:
        jobs = [proc.send(CudaSource(code=GAIN.replace("gain;", f"gain + {i}.0f;")), "sm_90") for i in range(3)]
        bad = proc.send(CudaSource(code=GAIN.replace("gain;", "nope;")), "sm_90")
        assert proc.in_flight == 4
        for job in [*jobs, bad]:
            proc.wait(job, timeout=60)
        assert all(j.done and j.image is not None and j.image.image.startswith(ELF) for j in jobs)
        assert isinstance(bad.error, KernelCompileError) and "nope" in str(bad.error)
        assert proc.in_flight == 0
    finally:
        proc.close()
    late = proc.send(CudaSource(code=GAIN), "sm_90")  # a closed process fails jobs, never hangs
    assert late.done and isinstance(late.error, KernelCompileError)


class _Finished:
    """Completes every request at once (as the service thread would, between frames)."""

    def submit(self, source: CudaSource) -> Future:
        f: Future = Future()
        if "undefined_thing" in (source.code or ""):
            f.set_exception(KernelCompileError("identifier undefined_thing is undefined"))
        else:
            f.set_result(
                CompiledKernel(
                    source, KernelImage(source.describe(), b"", "cubin", "k", "k.cu"), object(), "compiled", 0.0
                )
            )
        return f

    def unpaced(self) -> nullcontext:
        return nullcontext()

    def close(self) -> None:
        pass


def test_swaps_happen_through_the_swapper_and_only_news_reach_the_frame_thread() -> None:
    t = KernelTracker(_Finished(), watch_files=False)  # type: ignore[arg-type]
    c = Context()
    ck = c.register_block(CustomKernel(name="ck", Code=GAIN))
    key = (ck.id, 0)
    t.resolve(c.snapshot())
    assert [o.action for o in t.collect()] == ["rebuild"]
    swapped: list[KernelOutcome] = []
    accept = True
    t.swapper = lambda o: accept and not swapped.append(o)  # type: ignore[func-returns-value]

    def edit(code: str) -> list[str]:
        ck.set("Code", code)
        t.source_changed(key, ck.description.kernels[0].source, ck.name)
        c.dirty.code.clear()
        t.flush()
        return [o.action for o in t.collect()]

    assert edit(GAIN.replace("gain;", "gain * 2.0f;")) == [] and len(swapped) == 1  # nothing for the frame
    assert edit(GAIN.replace("gain;", "undefined_thing;")) == ["rebuild"] and t.diagnostics()
    assert edit(GAIN.replace("gain;", "gain * 4.0f;")) == ["swapped"] and not t.diagnostics()  # republish
    accept = False  # the graph was busy: the frame thread swaps it
    assert edit(GAIN.replace("gain;", "gain * 5.0f;")) == ["swap"] and len(swapped) == 2
    assert not t.pending
