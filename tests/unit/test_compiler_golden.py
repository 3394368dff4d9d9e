"""Golden plans: ``compile_plan`` of a varied set of patches, at every profiling level, must stay what
it was when the golden file was recorded.

The file ``golden/compile_plans.json`` holds each plan as lines of a canonical text form (every
field of the GraphPlan, nodes, buffers and dict entries one per line, in order), so a change shows
as a readable diff. Block ids are renumbered 1..n in registration order before compiling, so the
plans do not depend on how many blocks other tests made first.

A change that alters plans on purpose (memory reuse, fusion) records the file again with
``PYTHONPATH=. python3 tests/unit/test_compiler_golden.py --record`` and shows the diff in review.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import pytest

from cudapatch import (
    AppendFilter,
    Block,
    BlockBuilder,
    CustomKernel,
    Fill,
    NumbaSource,
    Scale,
    VectorAdd,
    compile_plan,
    like,
)
from cudapatch.blocks.captured import CapturedSpec
from cudapatch.blocks.library import FFT, GEMM, Emitter, Forces, Integrate, LUSolve, Random, ToPoints
from cudapatch.engine import Arg, Context, ExternalBinding, GraphPlan, Link, PatchSnapshot
from cudapatch.engine.diagnostics import Diagnostic
from cudapatch.engine.memory_plan import MemoryPlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import GraphCompileError
from cudapatch.kernels.descriptor import KernelDescriptor
from cudapatch.kernels.source import KernelSource, bundled_kernel
from tests.unit.test_captured_plan import AXPY, Axpy, _axpy
from tests.unit.test_compiler import OptionalAdd, TwoStage

GOLDEN = Path(__file__).parent / "golden" / "compile_plans.json"


# -- the patches ------------------------------------------------------------------------------------
class Case:
    """One compiler input: the snapshot (ids renumbered), kernel status and faulted blocks."""

    def __init__(
        self,
        ctx: Context,
        *,
        status: Callable[[dict[str, int]], dict] | None = None,
        faulted: Callable[[dict[str, int]], dict] | None = None,
        edit: Callable[[PatchSnapshot, dict[str, int]], PatchSnapshot] | None = None,
        reuse: bool = True,
    ) -> None:
        self.reuse = reuse
        snap = ctx.snapshot()
        ids = {b.id: i + 1 for i, b in enumerate(snap.blocks)}
        for b in snap.blocks:  # an automatic name carries the global block id: not reproducible
            assert not b.name.endswith(str(b.id)), f"give block '{b.name}' a name"
        self.snap = PatchSnapshot(
            0,
            tuple(dataclasses.replace(b, id=ids[b.id], context_id=0) for b in snap.blocks),
            tuple(Link(ids[lk.src], lk.src_port, ids[lk.dst], lk.dst_port) for lk in snap.links),
            {(ids[k[0]], k[1]): v for k, v in snap.bindings.items()},
            kept=frozenset((ids[k[0]], k[1]) for k in snap.kept),
        )
        by_name = {b.name: b.id for b in self.snap.blocks}
        self.status = status(by_name) if status else None
        self.faulted = faulted(by_name) if faulted else None
        if edit is not None:
            self.snap = edit(self.snap, by_name)

    def compile(self, fn: Callable[..., GraphPlan], level: ProfilingLevel) -> GraphPlan:
        # Unfused: the golden plans pin one node per block (fused plans: test_fusion.py, test_plan_cli.py).
        return fn(self.snap, self.status, level, self.faulted, reuse=self.reuse, fuse=False)


def _ctx(*blocks: Block) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _bind(c: Context, block: Block, port: str, count: int, ptr: int = 0x7000_0000) -> None:
    c.bind_input(block, port, ExternalBinding(ptr, count, block.description.input(port).dtype))


def chain() -> Case:
    f, s1, s2 = Fill(name="f", Count=1000), Scale(name="s1", Factor=2.0), Scale(name="s2")
    c = _ctx(f, s1, s2)
    c.connect(f, "Out", s1, "In")
    c.connect(s1, "Out", s2, "In")
    return Case(c)


def diamond() -> Case:
    f, left, right, add = Fill(name="f", Count=300), Scale(name="left"), Scale(name="right"), VectorAdd(name="add")
    c = _ctx(add, right, left, f)  # registration order is not topological order
    c.connect(f, "Out", left, "In")
    c.connect(f, "Out", right, "In")
    c.connect(left, "Out", add, "A")
    c.connect(right, "Out", add, "B")
    return Case(c)


def appends() -> Case:
    f, a1, a2 = Fill(name="f", Count=5000), AppendFilter(name="a1", Capacity=64), AppendFilter(name="a2", Capacity=128)
    s = Scale(name="after")
    c = _ctx(f, a1, a2, s)
    c.connect(f, "Out", a1, "In")
    c.connect(f, "Out", a2, "In")
    c.connect(a2, "Kept", s, "In")  # an append output read as a buffer
    return Case(c)


def skipped() -> Case:
    s1, s2, f, s3 = Scale(name="s1"), Scale(name="s2"), Fill(name="f"), Scale(name="s3")
    c = _ctx(s1, s2, f, s3)
    c.connect(s1, "Out", s2, "In")
    c.connect(f, "Out", s3, "In")
    return Case(c)


def bindings() -> Case:
    add, s1, s2 = VectorAdd(name="add"), Scale(name="s1"), Scale(name="s2")
    c = _ctx(add, s1, s2)
    _bind(c, add, "A", 777, 0x1000)
    _bind(c, add, "B", 777, 0x2000)
    _bind(c, s1, "In", 100, 0x3000)
    _bind(c, s2, "In", 100, 0x3000)  # two readers of one external buffer
    return Case(c)


class ScaleThenAdd(Block):
    """``Out = A * F + B``: its second kernel waits for its first and for B's producer."""

    type_name = "ScaleThenAdd"

    def describe(self, b: BlockBuilder) -> None:
        pre = b.add_kernel(bundled_kernel("scale"))
        add = b.add_kernel(bundled_kernel("vector_add"))
        b.input("A", pre.in_(0))
        b.input("B", add.in_(1))
        b.connect(pre.out(1), add.in_(0), size=like("A"))
        b.scalar("F", pre.in_(2), default=3.0)
        b.scalar("O", pre.in_(3), default=0.0)
        b.output("Out", add.out(2), size=like("A"))
        pre.auto_grid(like("A"), count_param=4)
        add.auto_grid(like("A"), count_param=3)


def optional_and_internal() -> Case:
    opt, two, s = OptionalAdd(name="opt"), TwoStage(name="two"), Scale(name="s")
    mix = ScaleThenAdd(name="mix")
    c = _ctx(opt, two, s, mix)
    _bind(c, opt, "A", 64)
    c.connect(opt, "Out", two, "In")
    c.connect(opt, "Scaled", s, "In")
    c.connect(two, "Out", mix, "A")
    c.connect(s, "Out", mix, "B")
    return Case(c)


def particles() -> Case:
    c = Context()
    e, f, i, t = (c.register_block(cls(name=cls.__name__.lower())) for cls in (Emitter, Forces, Integrate, ToPoints))
    e.set("Capacity", 1000)
    c.connect(e, "Particles", f, "Particles")
    c.connect(f, "Particles", i, "Particles")
    c.connect(i, "Particles", t, "Particles")
    t2 = c.register_block(ToPoints(name="direct"))
    c.connect(e, "Particles", t2, "Particles")  # reads the state that Forces modifies in place
    return Case(c)


class ScaleThenAxpy(Block):
    type_name = "ScaleThenAxpy"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("scale"))
        c = b.add_captured(_axpy, AXPY)
        b.input("In", k.in_(0))
        b.connect(k.out(1), c.in_("X"), size=like("In"))
        b.output("Out", c.out("Y"), size=like("In"))
        b.scalar("Factor", k.in_(2), default=1.0)
        b.scalar("Offset", k.in_(3), default=0.0)
        b.scalar("Alpha", c.in_("Alpha"), default=1.0)
        k.auto_grid(like("In"), count_param=4)
        c.set_count("N", like("In"))


def captured() -> Case:
    c = Context()
    pre, mid, post = (c.register_block(b) for b in (Scale(name="pre"), Axpy(name="mid"), Scale(name="post")))
    _bind(c, pre, "In", 4096)
    c.connect(pre, "Out", mid, "X")
    c.connect(mid, "Y", post, "In")
    mix = c.register_block(ScaleThenAxpy(name="mix"))
    c.connect(post, "Out", mix, "In")
    g = c.register_block(GEMM(name="gemm", M=3, N=5, K=4))
    _bind(c, g, "A", 12)
    _bind(c, g, "B", 20)
    fft = c.register_block(FFT(name="fft", Kind="R2C", Nx=64))
    _bind(c, fft, "In", 64 * 10)
    c.register_block(Random(name="rand", Count=100, Precision="double"))
    lu = c.register_block(LUSolve(name="lu", N=3, NRHS=2))
    _bind(c, lu, "A", 9)
    _bind(c, lu, "B", 6)
    bad = c.register_block(GEMM(name="badgemm", M=4, N=5, K=6))  # library-shape error: skipped
    _bind(c, bad, "A", 28)
    _bind(c, bad, "B", 30)
    after = c.register_block(Scale(name="afterbad"))
    c.connect(bad, "C", after, "In")
    return Case(c)


def _saxpy(out, x, y, a, n):  # noqa: ANN001 - a Numba kernel, described only (never compiled here)
    raise AssertionError("a plan test must not run kernels")


class NumbaSaxpy(Block):
    """A Numba kernel: every array argument expands to the seven slots of Numba's ABI."""

    type_name = "NumbaSaxpy"

    def describe(self, b: BlockBuilder) -> None:
        src = NumbaSource(_saxpy, ("float32[:]", "float32[:]", "float32[:]", "float32", "int32"), outputs=("out",))
        k = b.add_kernel(src)
        b.input("X", k.in_(1))
        b.input("Y", k.in_(2), required=False)
        b.scalar("A", k.in_(3), default=0.5)
        b.output("Out", k.out(0), size=like("X"))
        k.auto_grid(like("X"), count_param=4)


def numba_and_custom() -> Case:
    f, nb, ck = Fill(name="f", Count=333), NumbaSaxpy(name="nb"), CustomKernel(name="ck")
    c = _ctx(f, nb, ck)
    c.connect(f, "Out", nb, "X")
    c.connect(nb, "Out", ck, "in")
    return Case(c)


def profiled() -> Case:
    c = Context()
    f = c.register_block(Fill(name="f", Count=1000))
    s = c.register_block(Scale(name="s"))
    a = c.register_block(VectorAdd(name="a"))
    k = c.register_block(AppendFilter(name="k"))
    c.connect(f, "Out", s, "In")
    c.connect(f, "Out", a, "A")
    c.connect(s, "Out", a, "B")
    c.connect(a, "Sum", k, "In")
    return Case(c)


def faulted() -> Case:
    fill, bad, after, two = Fill(name="fill"), Scale(name="bad"), Scale(name="after"), TwoStage(name="two")
    c = _ctx(fill, bad, after, two)
    c.connect(fill, "Out", bad, "In")
    c.connect(bad, "Out", after, "In")
    c.connect(after, "Out", two, "In")
    return Case(c, faulted=lambda ids: {ids["bad"]: "illegal address", ids["two"]: "misaligned"})


def kernel_status() -> Case:
    f, s, v, w = Fill(name="f"), Scale(name="s"), VectorAdd(name="v"), Scale(name="w")
    c = _ctx(f, s, v, w)
    c.connect(f, "Out", s, "In")
    c.connect(s, "Out", v, "A")
    c.connect(f, "Out", v, "B")
    c.connect(f, "Out", w, "In")
    return Case(c, status=lambda ids: {(ids["s"], 0): ("info", "kernel-compiling", "compiling 'scale'")})


def random_dag(seed: int = 17, n: int = 32) -> Case:
    """A seeded random patch of elementwise, append and two-kernel blocks: fan-in, fan-out, unlinked
    inputs, external bindings."""
    rng = random.Random(seed)
    c = Context()
    outs: list[tuple[Block, str]] = []
    for i in range(n):
        kind, name = rng.choice(["fill", "scale", "scale", "add", "append", "opt", "two"]), f"n{i}"
        if kind == "fill":
            blk: Block = Fill(name=name, Count=rng.choice([1, 255, 256, 257, 4096]))
        elif kind == "scale":
            blk = Scale(name=name, Factor=rng.random())
        elif kind == "append":
            blk = AppendFilter(name=name, Capacity=rng.choice([8, 100]))
        else:
            blk = {"add": VectorAdd, "opt": OptionalAdd, "two": TwoStage}[kind](name=name)
        c.register_block(blk)
        for port in blk.description.inputs:
            roll = rng.random()
            if outs and roll < 0.8:
                src, src_port = rng.choice(outs)
                c.connect(src, src_port, blk, port.name)
            elif roll < 0.9:
                _bind(c, blk, port.name, rng.choice([10, 1000]), 0x1000 * (1 + rng.randrange(3)))
        outs.extend((blk, p.name) for p in blk.description.outputs)
    return Case(c)


def big_chain(*, keep: tuple[int, ...] = (), reuse: bool = True) -> Case:
    """24 blocks after a Fill: with buffer reuse, the intermediates take turns in two buffers."""
    c = Context()
    prev = c.register_block(Fill(name="head", Count=2048))
    for i in range(24):
        s = c.register_block(Scale(name=f"s{i}"))
        c.connect(prev, "Out", s, "In")
        if i in keep:
            c.keep(s, "Out")
        prev = s
    return Case(c, reuse=reuse)


def _errors(edit: Callable[[PatchSnapshot, dict[str, int]], PatchSnapshot]) -> Callable[[], Case]:
    def make() -> Case:
        f, s, s2, e, f2 = Fill(name="f"), Scale(name="s"), Scale(name="s2"), Emitter(name="e"), Scale(name="f2")
        c = _ctx(f, s, s2, e, f2)
        c.connect(f, "Out", s, "In")
        c.connect(s, "Out", s2, "In")
        return Case(c, edit=edit)

    return make


def _links(snap: PatchSnapshot, *links: Link) -> PatchSnapshot:
    return dataclasses.replace(snap, links=tuple(links))


CASES: dict[str, Callable[[], Case]] = {
    "chain": chain,
    "diamond": diamond,
    "appends": appends,
    "skipped": skipped,
    "bindings": bindings,
    "optional_and_internal": optional_and_internal,
    "particles": particles,
    "captured": captured,
    "numba_and_custom": numba_and_custom,
    "profiled": profiled,
    "faulted": faulted,
    "kernel_status": kernel_status,
    "random_dag": random_dag,
    "random_dag_2": lambda: random_dag(seed=2024, n=20),
    "big_chain": big_chain,
    "big_chain_kept": lambda: big_chain(keep=(3, 10)),
    "big_chain_no_reuse": lambda: big_chain(reuse=False),
    "error_unknown_ports": _errors(
        lambda snap, ids: _links(snap, Link(ids["f"], "Nope", ids["s"], "In"), Link(ids["f"], "Out", ids["s"], "No"))
    ),
    "error_cycle": _errors(lambda snap, ids: _links(snap, *snap.links[1:], Link(ids["s2"], "Out", ids["s"], "In"))),
    "error_duplicate_link": _errors(
        lambda snap, ids: _links(snap, *snap.links, Link(ids["f"], "Out", ids["s2"], "In"))
    ),
    "error_stranger": _errors(lambda snap, ids: _links(snap, Link(99_999, "Out", ids["s"], "In"), *snap.links)),
    "error_foreign_block": _errors(
        lambda snap, ids: dataclasses.replace(
            snap, blocks=(dataclasses.replace(snap.blocks[0], context_id=-1),) + snap.blocks[1:]
        )
    ),
    "error_type_mismatch": _errors(
        lambda snap, ids: _links(snap, *snap.links, Link(ids["e"], "Particles", ids["f2"], "In"))
    ),
}


# -- the canonical text form ------------------------------------------------------------------------
def canon(x: object, table: dict[object, int] | None = None) -> str:
    """A stable text form of a plan value: no addresses, paths or global ids. Kernel descriptors and
    captured specs are numbered in ``table`` (written out once per plan) and named by number."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return repr(x)
    if isinstance(x, Enum):
        return f"{type(x).__name__}.{x.name}"
    if isinstance(x, KernelSource):
        return f"{type(x).__name__}({x.debug_name})"
    if isinstance(x, (KernelDescriptor, CapturedSpec)) and table is not None:
        return f"#{table.setdefault(x, len(table))}"
    if isinstance(x, KernelDescriptor):
        params = ", ".join(f"{p.direction} {p.type_name} {p.name}" for p in x.parameters)
        extra = f" device={list(x.device_scalars)}" if getattr(x, "device_scalars", ()) else ""
        return (
            f"{type(x).__name__}({x.entry_point}({params}) block={x.block_size} shared={x.shared_memory_bytes}"
            f" groups={[len(g) for g in x.groups]}{extra})"
        )
    if isinstance(x, CapturedSpec):
        return f"CapturedSpec({x.call.__qualname__}, {canon(x.descriptor)}, counts={canon(x.counts)})"
    if isinstance(x, Diagnostic):
        return f"Diagnostic({x.severity}, {x.block_id}, {x.code}, {x.message!r})"
    if isinstance(x, Arg):
        return f"{x.kind} {x.dtype.c_name}{'*' if x.is_pointer else ''} {canon(x.ref)} {canon(x.value)}"
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        fields = ", ".join(
            f"{f}={canon(v, table)}" for f, v in zip(x._fields, x, strict=True) if _QUIET.get(f, _NOT) != v
        )
        return f"{type(x).__name__}({fields})"
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(canon(v, table) for v in x) + ")"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{canon(k)}: {canon(v)}" for k, v in x.items()) + "}"
    if dataclasses.is_dataclass(x):  # SizeRule in CapturedSpec.counts
        return str(x)
    raise TypeError(f"no canonical form for {type(x).__name__}")


_NOT = object()
#: Fields added after the golden file was first recorded, left out where they hold their default (a
#: 1-D launch), so plans that do not use them read as they always did.
_QUIET: dict[str, object] = {"yz": (1, 1, 1, 1)}
#: Plan fields of features the recorded patches do not use: shown only when set, so adding such a
#: feature leaves the golden plans as they were recorded.
WHEN_USED = {"probes": (), "probe_words": 0, "children": (), "delays": ()}


def dump(plan: GraphPlan) -> list[str]:
    """Every field of ``plan``, one line per node, buffer, diagnostic, timing and dict entry, then the
    kernel descriptors and captured specs the nodes name by number."""
    lines: list[str] = []
    table: dict[object, int] = {}
    for f in dataclasses.fields(plan):
        value = getattr(plan, f.name)
        if f.name in WHEN_USED and value == WHEN_USED[f.name]:
            continue
        if isinstance(value, MemoryPlan):
            lines.append(f"memory reuse={value.reuse} value_buffer={canon(value.value_buffer)}")
            lines.extend(f"memory pinned {vi} {why}" for vi, why in value.pinned)
            if value.values != plan.buffers:  # shared buffers: the values are not the buffers
                lines.extend(f"memory values[{i}] {canon(v)}" for i, v in enumerate(value.values))
        elif isinstance(value, dict):
            lines.extend(f"{f.name} {canon(k)} -> {canon(v)}" for k, v in value.items())
        elif isinstance(value, tuple) and f.name in ("nodes", "buffers", "diagnostics", "timings"):
            lines.extend(f"{f.name}[{i}] {canon(v, table)}" for i, v in enumerate(value))
        else:
            lines.append(f"{f.name} {canon(value)}")
    lines.extend(f"#{i} {canon(x)}" for x, i in table.items())
    return lines


def run(case: Case, level: ProfilingLevel, fn: Callable[..., GraphPlan] = compile_plan) -> list[str]:
    try:
        return dump(case.compile(fn, level))
    except GraphCompileError as exc:
        return [f"error {exc}"] + [f"diagnostics {canon(d)}" for d in exc.diagnostics]


def record() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, make in CASES.items():
        case = make()
        for level in ProfilingLevel:
            out[f"{name}@{level.name}"] = run(case, level)
    return out


# -- the tests --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def golden() -> dict[str, list[str]]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_plans_match_the_golden_file(name: str, golden: dict[str, list[str]]) -> None:
    case = CASES[name]()
    for level in ProfilingLevel:
        assert run(case, level) == golden[f"{name}@{level.name}"], f"{name} at {level}"


def test_the_golden_file_covers_every_case_and_level(golden: dict[str, list[str]]) -> None:
    assert set(golden) == {f"{n}@{lv.name}" for n in CASES for lv in ProfilingLevel}
    # the cases reach every node kind, every argument kind and every diagnostic the compiler makes
    text = "\n".join(line for lines in golden.values() for line in lines)
    for needle in (
        "KernelNodePlan(",
        "CapturedNodePlan(",
        "MemsetNodePlan(",
        "StampNodePlan(",
        "PublishNodePlan(",
        *(f", {c}, " for c in ("input-unlinked", "input-not-running", "input-faulted", "library-shape")),
        ", kernel-compiling, ",
        *(f", {c}, " for c in ("cross-engine", "unknown-port", "duplicate-link", "cycle", "type-mismatch")),
        "buffer=",
        "groups=[7, 7, 7, 1, 1]",
        "device=['Alpha']",
    ):
        assert needle in text, needle
    for kind in ("buffer", "external", "scalar", "device", "const", "counter", "null"):  # argument kinds
        assert re.search(rf"args=\((.*, )?{kind} ", text), kind


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"recorded {GOLDEN}")
