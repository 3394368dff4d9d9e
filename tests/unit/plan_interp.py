"""A NumPy interpreter of a ``GraphPlan`` of elementwise kernels: what the GPU would compute, so a
fused plan can be checked against the unfused one without a GPU.

Generated kernels (an Expression block's, a fused group's) run their program through
``cudapatch.expr.evaluate``; a block that declared its kernel elementwise (``Scale``, ``VectorAdd``)
runs its declared expression with its arguments found through the block's kernel roles.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cudapatch.engine.compiler.fusion import elementwise_member
from cudapatch.engine.context import PatchSnapshot
from cudapatch.engine.plan import Arg, GraphPlan, KernelNodePlan
from cudapatch.expr import ProgramSource, evaluate, single


def _array(a: Arg, buffers: dict[int, np.ndarray], externals: Mapping[tuple[int, str], np.ndarray]) -> np.ndarray:
    if a.kind == "buffer":
        return buffers[a.ref]  # type: ignore[index]
    if a.kind == "external":
        return externals[a.ref]  # type: ignore[index]
    raise AssertionError(f"no array for a {a.kind} argument")


def run_plan(
    plan: GraphPlan, snap: PatchSnapshot, externals: Mapping[tuple[int, str], np.ndarray]
) -> dict[int, np.ndarray]:
    """Run every kernel node of ``plan`` in order; returns the buffers by plan index (a value in a
    buffer it shares is its first ``count`` elements there)."""
    blocks = {b.id: b for b in snap.blocks}
    # poisoned; a buffer several values share (buffer reuse) holds raw bytes: as many floats as fit
    buffers = {b.index: np.full(-(-b.count * b.dtype.itemsize // 4), np.nan, np.float32) for b in plan.buffers}
    for node in plan.nodes:
        if not isinstance(node, KernelNodePlan):
            continue
        src = node.source
        if isinstance(src, ProgramSource):
            program = src.program
            assert program is not None
            ins = [_array(node.args[program.input_param(i)], buffers, externals) for i in range(len(program.inputs))]
            scalars = [node.args[program.scalar_param(s)].value for s in range(len(program.scalars))]
            n = node.args[program.count_param].value
            out = node.args[program.output_param(0)]
        else:
            b = blocks[node.block_id]
            member = elementwise_member(b)
            assert member is not None, f"{b.name} is not elementwise: the interpreter cannot run it"
            program = single(member.expr)
            roles = b.description.kernel_roles[node.kernel]
            by_role = {(role, ref): node.args[i] for i, (role, ref) in enumerate(roles)}
            ins = [_array(by_role[("input", member.inputs[name])], buffers, externals) for name in program.inputs]
            scalars = [by_role[("scalar", member.scalars[name])].value for name in program.scalars]
            out = by_role[("output", member.output)]
            n = next(a.value for (role, _), a in zip(roles, node.args, strict=True) if role == "count")
        result = evaluate(program, ins, scalars, n)["Out"]  # type: ignore[arg-type]
        buffers[out.ref][:n] = result  # type: ignore[index]
    return buffers
