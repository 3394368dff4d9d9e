"""The ``Expression`` block: a line of math as a kernel, live while the patch runs.

``Expression(Code="a * sin(x * Freq) + b")``: lower-case names are input ports, capitalised names
Hot scalars (``Freq``), unless the ``Inputs`` and ``Scalars`` parameters declare them otherwise. Once
``Inputs`` (or ``Scalars``) declares names, the inputs (or scalars) are those: an undeclared name of
that kind is an "unknown name" error at its column, listing the known names. The
output ``Out`` is as long as the first input. The kernel is generated
(PTX, see ``cudapatch.expr``), so an edit that keeps the names goes live through the Code tier in
about a millisecond plus the driver's JIT; an edit that changes them re-describes the block (new
ports, a rebuild). An edit that does not compile becomes a compile error on the block, with its
column, and the previous kernel keeps running. ``Inputs="c: float4, mask"`` declares a vector input:
the expression then computes lane by lane and ``Out`` is a ``float4`` (``cudapatch.expr.vectors``).
See docs/expressions.md.
"""

from __future__ import annotations

from ...expr import BACKENDS, ExpressionError, ProgramSource, compile_expression, single
from ...expr.check import Checked, NameKind, declare
from ...expr.vectors import parse_declarations, vector_dtype
from ...kernels.source import KernelSource
from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..description import KernelSpec, from_param, like
from .basic import Fusable

__all__ = ["Expression", "DEFAULT_EXPRESSION"]

DEFAULT_EXPRESSION = "x * Gain"
_INPUT_NOTE = "floats; one element is broadcast"
_RESERVED = {
    "Out": "the output port",
    "Code": "the Code parameter",
    "Compiler": "the Compiler parameter",
    "Inputs": "the Inputs parameter",
    "Scalars": "the Scalars parameter",
    "Count": "the Count parameter (the element count when there is no input)",
}


class Expression(Fusable, Block):
    """``Out`` = the expression in ``Code``, element by element (float).

    Names starting with a lower-case letter are inputs (buffers of floats), names starting with an
    upper-case letter Hot scalars (default 1.0). ``Inputs`` and ``Scalars`` (comma-separated names,
    ``Inputs="x, y", Scalars="gain"``) declare names whatever their case: declared inputs come first,
    in that order, and a declared name the code does not use still makes its port or scalar (a
    warning on the block says so). Declaring closes the kind: with ``Inputs`` given, a name the case
    rule would make a new input is an unknown name (an error at its column listing the known names,
    the closest first), and likewise for ``Scalars``; a kind with nothing declared keeps the case rule.
    With no input, ``Count`` (default 1024) sets the element count. An input of one element is
    broadcast. An input declared with a vector type (``Inputs="c: float4, mask"``; ``float2``,
    ``float3``, ``float4``) makes the expression compute lane by lane, ``Out`` of that type,
    ``float`` inputs and Hot scalars broadcast across the lanes;
    see docs/expressions.md for the language, its types and its floating-point
    rules. ``Compiler`` is ``ptx`` (generated PTX, the fast path)
    or ``nvrtc`` (the same kernel as CUDA C++ through NVRTC). ``fuse=False`` keeps it out of fused
    groups (see ``engine/compiler/fusion.py``).
    """

    type_name = "Expression"

    def describe(self, b: BlockBuilder) -> None:
        code = b.text("Code", default=DEFAULT_EXPRESSION, description="the expression, e.g. a * sin(x * Freq) + b")
        backend = b.text(
            "Compiler", default="ptx", description="ptx (fast edits) or nvrtc (CUDA C++ reference)", choices=BACKENDS
        )
        inputs = b.text(
            "Inputs", description="input ports whatever their case, comma-separated, in order ('c: float4': a vector)"
        )
        scalars = b.text("Scalars", description="Hot scalars whatever their case, comma-separated")
        checked = self._check(code, *self._declare(inputs, scalars))
        program = single(checked, output="Out", label=self.name)
        # quick: an edit runs at once, the optimised build follows (ProgramSource.upgrade)
        k = b.add_kernel(ProgramSource.of(program, backend=backend, name=self.name, jit="quick"))  # type: ignore[arg-type]
        for i, name in enumerate(program.inputs):
            # needs=None: the expression's own broadcasting rule checks lengths (input-size), not the launch's
            lanes = program.lanes_of(i)
            what = _INPUT_NOTE if lanes == 1 else f"{vector_dtype(lanes).c_name}: computed lane by lane"
            b.input(name, k.in_(program.input_param(i)), description=what, needs=None)
            k.set_count(program.input_param(i) + 1, like(name))
        if program.inputs:
            size = like(program.inputs[0])
        else:
            b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 2**31 - 1))
            size = from_param("Count")
        b.output("Out", k.out(program.output_param(0)), size=size, description=code.strip())
        for s, name in enumerate(program.scalars):
            b.scalar(name, k.in_(program.scalar_param(s)), default=1.0)
        k.auto_grid(size, count_param=program.count_param)
        if self.fuse and program.lanes == 1:  # vector expressions run unfused (fusion fuses floats)
            k.elementwise(code)

    def _declare(self, inputs: str, scalars: str) -> tuple[dict[str, NameKind], dict[str, int]]:
        """The names ``Inputs`` and ``Scalars`` declare (comma-separated, an input may give its type:
        ``c: float4``), checked, and the vector inputs' lanes; an error names the parameter
        (``Scalars`` for a name in both) and, for a type, its column there."""
        try:
            ins = parse_declarations(inputs, what="input")
        except ExpressionError as exc:
            exc.block, exc.param = self.name, "Inputs"
            raise
        try:
            scs = parse_declarations(scalars, what="scalar", vectors=False)
        except ExpressionError as exc:
            exc.block, exc.param = self.name, "Scalars"
            raise
        names_in, names_sc = [d.name for d in ins], [d.name for d in scs]
        for param, args in (("Inputs", (names_in, ())), ("Scalars", ((), names_sc)), ("Scalars", (names_in, names_sc))):
            try:
                declared = declare(*args, reserved=_RESERVED)
            except ExpressionError as exc:
                exc.block, exc.param = self.name, param
                raise
        return declared, {d.name: d.lanes for d in ins if d.lanes > 1}

    def _check(self, code: str, declared: dict[str, NameKind], lanes: dict[str, int]) -> Checked:
        try:
            # closed: once Inputs (or Scalars) are declared, a typo is an unknown name, not a new port
            return compile_expression(code, reserved=_RESERVED, declared=declared, lanes=lanes, closed=True)
        except ExpressionError as exc:
            exc.block, exc.param = self.name, "Code"
            raise

    def text_source(self, name: str, text: str) -> tuple[int, KernelSource] | None:
        # Only Code edits are kernel-only: a new Compiler re-describes the block.
        if name != "Code":
            return None
        spec = self.description.kernels[0]
        assert isinstance(spec, KernelSpec) and isinstance(spec.source, ProgramSource)
        declared, lanes = self._declare(self.get("Inputs"), self.get("Scalars"))
        try:
            checked = self._check(text, declared, lanes)
        except ExpressionError as exc:
            # Compiles to this error on the engine's builder: shown on the block, the old kernel runs on.
            return 0, ProgramSource.failing(exc, spec.descriptor, name=self.name)
        before = spec.source.program
        if declared and (before is None or before.stages[0].expr.unused != checked.unused):
            # The warning on declared names the code does not use comes from a build: an edit that starts
            # or stops using one re-describes the block (same ports and links) so a rebuild gives it anew.
            return None
        program = single(checked, output="Out", label=self.name)
        return 0, ProgramSource.of(program, backend=spec.source.backend, name=self.name, jit="quick")

    # -- display ----------------------------------------------------------------------------------
    @property
    def source(self) -> ProgramSource:
        """The kernel source of the running expression (``generated_code`` shows its code)."""
        src = self.description.kernels[0].source
        assert isinstance(src, ProgramSource)
        return src

    @property
    def generated_code(self) -> str:
        """The code generated for the current expression: PTX (``Compiler=ptx``, for sm_90) or CUDA C++.

        Raises:
            ExpressionError: the current ``Code`` does not compile.
        """
        return self.source.code()

    def tooltip(self) -> str:
        src = self.source
        if src.program is None:  # a broken live edit: the error is among the block's diagnostics
            return super().tooltip()
        lines = len(src.code().splitlines())  # generated once per source (``ProgramSource.code``)
        code = self.get("Code").strip()
        out = "Out" if src.program.lanes == 1 else f"Out ({vector_dtype(src.program.lanes).c_name}, lane by lane)"
        return f"{super().tooltip()}\n  {out} = {code}  (generated {src.backend.upper()}: {lines} lines)"
