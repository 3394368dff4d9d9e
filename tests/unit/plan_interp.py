"""The tests' one NumPy interpreter of a ``GraphPlan``: elementwise kernels (an Expression block's or
a fused group's generated program, a block's declared elementwise expression), and regions:
conditional nodes, their set-condition kernels, iteration counters, FrameDelay init, copy and sync
kernels. What the GPU would compute frame after frame, so a fused plan can be checked against the
unfused one, shared buffers against separate ones, and the plans of unrolled loops (ping-pong
delays, blocks made once per condition check) against N sequential iterations, without a GPU.

Body timers (``body_tick``/``body_tock``, profiling at PerBlock and up) run on a clock that ticks once per
kernel launched, so a block's timed duration is the launches from its start up to its tock.

The set-condition and delay kernels are mirrored here from their CUDA source
(``engine/region_kernels.py``, ``engine/delay_copy.py``) one expression each; the GPU tests check the
kernels themselves. Custom kernels a test uses are given as Python functions by entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cudapatch.engine.compiler.fusion import elementwise_member
from cudapatch.engine.context import PatchSnapshot
from cudapatch.engine.plan import (
    Arg,
    ConditionalNodePlan,
    GraphPlan,
    KernelNodePlan,
    MemsetNodePlan,
    ProbeNodePlan,
    PublishNodePlan,
    StampNodePlan,
)
from cudapatch.expr import ProgramSource, evaluate, single

Custom = Callable[["PlanInterpreter", KernelNodePlan, list], None]


def _region(entry: str, c: int, limit: int, u: int, cond: bool) -> tuple[int | None, bool]:
    """A set-condition kernel: ``(counter c, limit, unroll u, condition)`` -> (the counter it writes,
    or None, and the value it gives the handle), as ``engine/region_kernels.py`` computes them."""
    base = entry[:-1] if entry[-1] in "41" else entry  # the condition's element size does not matter here
    if base == "region_if":
        return None, cond
    if base == "region_begin":
        return 0, limit != 0
    if base == "region_begin_n":
        return 0, limit >= u
    if base == "region_for_step":
        return c + 1, c + 1 < limit
    if base == "region_while_step":
        return c + 1, cond and c + 1 < limit
    if base == "region_for_step_n":
        n = c + u
        return n, n <= limit and limit - n >= u
    if base == "region_while_step_n":
        n = c + u
        return n, cond and n <= limit and limit - n >= u
    if base == "region_for_tail":
        return None, c < limit
    if base == "region_while_tail":
        return None, c < limit and (c == 0 or cond)
    if base == "region_for_tail_n":
        return None, c <= limit and limit - c >= u
    if base == "region_while_tail_n":
        return None, c <= limit and limit - c >= u and (c == 0 or cond)
    raise AssertionError(f"no interpretation of {entry}")


class PlanInterpreter:
    """Runs ``plan`` frame by frame on NumPy buffers (raw bytes, poisoned with NaN floats).

    Args:
        plan: The plan.
        snap: The snapshot it was compiled from (the blocks' elementwise expressions).
        externals: ``(block_id, port)`` -> host array of each external binding.
        custom: Entry point -> a function ``(interp, node, views)`` running that kernel, for kernels
            that are not elementwise (``views``: the node's arguments, buffers as NumPy views).
    """

    def __init__(
        self,
        plan: GraphPlan,
        snap: PatchSnapshot,
        externals: Mapping[tuple[int, str], np.ndarray] | None = None,
        custom: Mapping[str, Custom] | None = None,
    ) -> None:
        self.plan, self.externals, self.custom = plan, dict(externals or {}), dict(custom or {})
        self.blocks = {b.id: b for b in snap.blocks}
        self.buffers = {
            b.index: np.full(-(-b.count * b.dtype.itemsize // 4), np.nan, np.float32).view(np.uint8)
            for b in plan.buffers
        }
        self.counters = np.zeros(max(1, len(plan.counters)), np.uint32)
        self.handles: dict[int, bool] = {}
        self.scalars: dict[object, object] = {}  # Hot edits: (block_id, param) -> value
        self.frames = 0
        self.body: dict[int, list[int]] = {}
        for i, p in sorted(plan.scopes.items()):
            self.body.setdefault(p, []).append(i)
        self.top = [n.index for n in plan.nodes if n.index not in plan.scopes]
        self.inits = {dp.node for dp in plan.delays if dp.node is not None}
        self.kernels_run: dict[tuple[int, int], int] = {}  # (block, kernel) -> launches (all frames)
        self.clock = 0  # the body timers' clock: one tick per kernel launched

    def buffer(self, index: int, dtype=np.float32) -> np.ndarray:
        return self.buffers[index].view(dtype)

    def output(self, block_id: int, port: str, dtype=np.float32) -> np.ndarray:
        """The value of output ``port`` of a block after the last frame (its count of elements)."""
        bi = self.plan.outputs[(block_id, port)]
        b = self.plan.buffers[bi]
        return self.buffer(bi, dtype)[: b.count * b.dtype.lanes].copy()

    def frame(self) -> None:
        """One launch: the delays' init kernels run on the first frame only (as after ``reset()``)."""
        self._run(self.top)
        self.frames += 1

    # -- nodes -------------------------------------------------------------------------------------

    def _run(self, indices: list[int]) -> None:
        for i in indices:
            n = self.plan.nodes[i]
            if isinstance(n, ConditionalNodePlan):
                body = self.body.get(i, [])
                if n.kind == "if":
                    if self.handles.get(i, False):
                        self._run(body)
                else:
                    while self.handles.get(i, False):
                        self._run(body)
            elif isinstance(n, MemsetNodePlan):
                if n.buffer is None:
                    self.counters[: n.count] = 0
                else:
                    self.buffers[n.buffer][:] = 0
            elif isinstance(n, KernelNodePlan):
                if i in self.inits and self.frames:
                    continue
                self.kernels_run[(n.block_id, n.kernel)] = self.kernels_run.get((n.block_id, n.kernel), 0) + 1
                self._kernel(n)
            elif isinstance(n, ProbeNodePlan | PublishNodePlan | StampNodePlan):
                continue
            else:
                raise AssertionError(f"the interpreter does not run {type(n).__name__}")

    def _value(self, a: Arg) -> object:
        if a.kind == "scalar":
            return self.scalars.get(a.ref, a.value)
        return a.value

    def _array(self, a: Arg, dtype=np.float32) -> np.ndarray | None:
        if a.kind == "buffer":
            return self.buffer(a.ref, dtype)  # type: ignore[arg-type]
        if a.kind == "external":
            return self.externals[a.ref].view(dtype)  # type: ignore[index]
        if a.kind == "null":
            return None
        raise AssertionError(f"no array for a {a.kind} argument")

    def word64(self, counter: int) -> np.ndarray:
        """The 64-bit word at counter index ``counter`` (a body timer's slot or record field), as a view."""
        return self.counters[counter : counter + 2].view(np.uint64)

    def _kernel(self, n: KernelNodePlan) -> None:
        entry = n.entry_point
        args = n.args
        self.clock += 1
        if entry == "body_tick":
            self.word64(args[0].ref)[0] = self.clock  # type: ignore[arg-type]
        elif entry == "body_tock":  # as region_kernels.TIMER_SOURCE: sum, max, ~min, count
            start = int(self.word64(args[0].ref)[0])  # type: ignore[arg-type]
            self.word64(args[1].ref)[0] = self.clock  # type: ignore[arg-type]
            d = max(0, self.clock - start)
            r = args[2].ref
            self.word64(r)[0] += np.uint64(d)  # type: ignore[arg-type]
            self.word64(r + 2)[0] = max(int(self.word64(r + 2)[0]), d)  # type: ignore[operator]
            self.word64(r + 4)[0] = max(int(self.word64(r + 4)[0]), ~d & (2**64 - 1))  # type: ignore[operator]
            self.counters[r + 6] += 1  # type: ignore[operator]
        elif entry.startswith("region_"):
            self._set_condition(n)
        elif entry.startswith(("delay_copy", "delay_sync")):
            word = np.uint32 if entry.endswith("4") else np.uint8
            prev_or_src, cur_or_dst = self._array(args[0], word), self._array(args[1], word)
            count = int(args[2].value)  # type: ignore[arg-type]
            if entry.startswith("delay_copy"):
                cur_or_dst[:count] = prev_or_src[:count]  # type: ignore[index]
            else:
                k = int(self.counters[args[3].ref])  # type: ignore[index]
                if k:
                    src, dst = (cur_or_dst, prev_or_src) if k & 1 else (prev_or_src, cur_or_dst)
                    dst[:count] = src[:count]  # type: ignore[index]
        elif entry == "frame_delay_init":
            out = self._array(args[1])
            init = self._array(args[0])
            count = int(args[3].value)  # type: ignore[arg-type]
            out[:count] = init[:count] if init is not None else np.float32(self._value(args[2]))  # type: ignore[index]
        elif entry in self.custom:
            self.custom[entry](self, n, [self._array(a) if a.is_pointer and a.kind != "counter" else a for a in args])
        else:
            self._elementwise(n)

    def _set_condition(self, n: KernelNodePlan) -> None:
        args = {p.name: a for p, a in zip(n.descriptor.parameters, n.args, strict=True)}
        handle = args["handle"].ref
        cond = False
        if "condition" in args:
            dt = np.uint8 if n.entry_point.endswith("1") else np.uint32
            cond = bool(self._array(args["condition"], dt)[0])  # type: ignore[index]
        counter = args.get("counter")
        c = int(self.counters[counter.ref]) if counter is not None else 0  # type: ignore[index]
        limit_arg = args.get("limit", args.get("count", args.get("max")))
        limit = int(self._value(limit_arg)) if limit_arg is not None else 0  # type: ignore[arg-type]
        u = int(args["unroll"].value) if "unroll" in args else 1  # type: ignore[arg-type]
        new, go = _region(n.entry_point, c, limit, u, cond)
        if new is not None:
            self.counters[counter.ref] = new  # type: ignore[union-attr,index]
        self.handles[handle] = go  # type: ignore[index]

    def _elementwise(self, n: KernelNodePlan) -> None:
        if isinstance(n.source, ProgramSource):  # generated: an Expression block's, a fused group's
            program = n.source.program
            assert program is not None
            ins = [self._array(n.args[program.input_param(i)]) for i in range(len(program.inputs))]
            scalars = [self._value(n.args[program.scalar_param(s)]) for s in range(len(program.scalars))]
            count = n.args[program.count_param].value
            out = n.args[program.output_param(0)]
        else:
            b = self.blocks[n.block_id]
            member = elementwise_member(b)
            assert member is not None, f"{b.name} ({n.entry_point}) is not elementwise: give the interpreter a function"
            program = single(member.expr)
            roles = b.description.kernel_roles[n.kernel]
            by_role = {(role, ref): n.args[i] for i, (role, ref) in enumerate(roles)}
            ins = [self._array(by_role[("input", member.inputs[name])]) for name in program.inputs]
            scalars = [self._value(by_role[("scalar", member.scalars[name])]) for name in program.scalars]
            out = by_role[("output", member.output)]
            count = next(a.value for (role, _), a in zip(roles, n.args, strict=True) if role == "count")
        result = evaluate(program, ins, scalars, count)["Out"]  # type: ignore[arg-type]
        self.buffer(out.ref)[: count * program.lanes] = result.reshape(-1)  # type: ignore[index]


def run_plan(
    plan: GraphPlan, snap: PatchSnapshot, externals: Mapping[tuple[int, str], np.ndarray]
) -> dict[int, np.ndarray]:
    """Run one frame of ``plan``; returns the buffers by plan index as floats (a value in a buffer it
    shares is its first ``count`` elements there)."""
    interp = PlanInterpreter(plan, snap, externals)
    interp.frame()
    return {i: interp.buffer(i) for i in interp.buffers}
