"""The engine's kernel bookkeeping (which compile results swap, rebuild or re-describe), driven by a
stand-in for the background builder that returns finished futures. The real builder and its
compilers are tested in test_runtime_kernels.py and on the GPU."""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import nullcontext

from cudapatch import CudaSource, CustomKernel
from cudapatch.engine import Context
from cudapatch.engine.kernels import KernelTracker
from cudapatch.errors import KernelCompileError
from cudapatch.kernels.builder import CompiledKernel
from cudapatch.kernels.source import KernelImage

GAIN = """extern "C" __global__ void k(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
"""


class FinishedBuilder:
    """Completes every request at once: a compile error where the code says ``undefined_thing``."""

    def __init__(self) -> None:
        self.requests: list[CudaSource] = []

    def submit(self, source: CudaSource) -> Future:
        self.requests.append(source)
        f: Future = Future()
        if "undefined_thing" in (source.code or ""):
            f.set_exception(KernelCompileError("identifier undefined_thing is undefined", log="k.cu(4): error"))
        else:
            d = source.describe()
            f.set_result(CompiledKernel(source, KernelImage(d, b"", "cubin", "key", "k.cu"), object(), "compiled", 0.0))
        return f

    def unpaced(self) -> nullcontext:
        return nullcontext()

    def close(self) -> None:
        pass


def _edit(c: Context, t: KernelTracker, ck: CustomKernel, code: str) -> None:
    ck.set("Code", code)
    for key in c.dirty.code:
        t.source_changed(key, ck.description.kernels[key[1]].source, ck.name)
    c.dirty.code.clear()


def test_first_compile_rebuilds_then_edits_swap_and_errors_keep_the_old_version() -> None:
    b = FinishedBuilder()
    t = KernelTracker(b, watch_files=False)  # type: ignore[arg-type]
    c = Context()
    ck = c.register_block(CustomKernel(name="ck", Code=GAIN))
    key = (ck.id, 0)
    functions, status = t.resolve(c.snapshot())
    assert not functions and status[key][1] == "kernel-compiling" and t.pending == [key]
    (o,) = t.collect()
    assert o.action == "rebuild" and not t.pending  # the block can run now
    functions, status = t.resolve(c.snapshot())
    first = functions[key]
    assert not status and len(b.requests) == 1  # no recompile of an unchanged source

    _edit(c, t, ck, GAIN.replace("out[i] = in[i] * gain;", "out[i] = in[i] * gain + undefined_thing;"))
    version = t.diag_version
    (o,) = t.collect()
    assert o.action == "rebuild" and t.diag_version == version + 1
    (d,) = t.diagnostics()
    assert d.block_id == ck.id and "undefined_thing" in d.message and "keeps running" in d.message
    functions, status = t.resolve(c.snapshot())
    assert functions[key] is first and not status  # the previous version keeps running

    _edit(c, t, ck, GAIN.replace("in[i] * gain", "in[i] * gain * 2.0f"))
    (o,) = t.collect()
    assert o.action == "swap" and o.compiled.function is not first and not t.diagnostics()
    assert t.diag_version == version + 2  # the engine republishes: the block is no longer red


def _compiled() -> tuple[FinishedBuilder, KernelTracker, Context, CustomKernel, tuple[int, int]]:
    """A tracker whose one CustomKernel (``GAIN``) has compiled: builder, tracker, context, block, key."""
    b = FinishedBuilder()
    t = KernelTracker(b, watch_files=False)  # type: ignore[arg-type]
    c = Context()
    ck = c.register_block(CustomKernel(name="ck", Code=GAIN))
    t.resolve(c.snapshot())
    t.collect()
    return b, t, c, ck, (ck.id, 0)


def test_signature_change_asks_for_a_refresh_and_stale_results_are_dropped() -> None:
    b, t, c, ck, key = _compiled()
    new_sig = GAIN.replace("float gain,", "float gain, float bias,")
    t.source_changed(key, CudaSource(code=new_sig, name="ck.cu"), "ck")
    (o,) = t.collect()
    assert o.action == "refresh"  # the block must re-describe itself: its ports change
    # a block removed from the patch is forgotten, with its diagnostics
    c.unregister_block(ck)
    assert t.resolve(c.snapshot()) == ({}, {}) and not t._slots


class CachingBuilder(FinishedBuilder):
    """Sources it was told are cached load at once on the caller's thread; others stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.cached: set[str] = set()
        self.in_flight: list[Future] = []

    def submit(self, source: CudaSource) -> Future:
        self.requests.append(source)
        f: Future = Future()
        self.in_flight.append(f)
        return f

    def build_cached(self, source: CudaSource) -> CompiledKernel | None:
        if source.code not in self.cached:
            return None
        return CompiledKernel(
            source, KernelImage(source.describe(), b"", "cubin", "key", "k.cu"), object(), "memory", 0.0
        )


def test_a_cached_kernel_is_taken_by_the_build_and_the_builders_late_result_is_ignored() -> None:
    b = CachingBuilder()
    t = KernelTracker(b, watch_files=False)  # type: ignore[arg-type]
    c = Context()
    hit = c.register_block(CustomKernel(name="hit", Code=GAIN))
    miss = c.register_block(CustomKernel(name="miss", Code=GAIN.replace("gain;", "gain * 3.0f;")))
    b.cached.add(GAIN)
    functions, status = t.resolve(c.snapshot())
    assert set(status) == {(hit.id, 0), (miss.id, 0)}
    t.flush()
    assert t.take_cached(list(status)) == 1  # the miss keeps compiling
    snap = c.snapshot()
    # Only the blocks that were compiling are looked at again, with what resolve() gives for all of them.
    again = t.resolve_again(snap, list(status), (functions, status))
    functions, status = t.resolve(snap)
    assert again == (functions, status)
    assert set(functions) == {(hit.id, 0)} and set(status) == {(miss.id, 0)} and t.pending == [(miss.id, 0)]
    late = CompiledKernel(hit.description.kernels[0].source, None, object(), "memory", 0.0)  # type: ignore[arg-type]
    b.in_flight[0].set_result(late)  # the builder's own answer for the request the build took over
    assert t.collect() == [] and t.resolve(c.snapshot())[0][(hit.id, 0)] is functions[(hit.id, 0)]
    assert t.take_cached([(hit.id, 0)]) == 0  # nothing in flight for it any more


def test_a_code_edit_after_a_builds_snapshot_is_not_undone_by_that_build() -> None:
    """A build resolves the snapshot it took; a Code edit made after (while the build runs) made a slot
    for the new code. Resolving the older snapshot keeps that slot (the build runs its last good build:
    the edit's, once compiled) instead of going back to the snapshot's code and compiling it again."""
    b, t, c, ck, key = _compiled()
    first = t.resolve(c.snapshot())[0][key]
    since = t.edits
    snap = c.snapshot()  # a build's snapshot: the old code
    newer = GAIN.replace("in[i] * gain", "in[i] * gain * 2.0f")
    _edit(c, t, ck, newer)  # the host edits the code while the build runs
    (o,) = t.collect()
    assert o.action == "swap"  # the edit's compile landed: it swaps into the running graph
    requests = len(b.requests)
    functions, status = t.resolve(snap, since)
    edited = t.running(key)
    assert newer in edited.source.code and len(b.requests) == requests  # the edit's slot stays, no recompile
    assert functions[key] is edited.function is not first and not status  # the newest good build runs
    functions, _ = t.resolve(c.snapshot(), t.edits)  # the next build's snapshot has the new code
    assert functions[key] is edited.function and len(b.requests) == requests
