"""A kernel program: one or more typed expressions ("stages") evaluated per element, the shape both
an Expression block and a fused group of elementwise blocks compile to.

Each stage is a checked expression whose names are bound to a kernel input buffer, a Hot scalar
parameter or an earlier stage's value. Some stages are stored to output buffers. A stage's value is
always a ``float`` (an ``int`` result is converted), exactly as it would be stored between two
unfused kernels, so fusing never changes a result.

The kernel's parameters, in order: per input buffer a ``const float*`` and its element count
(``uint``), then one ``float*`` per output, one ``float`` per Hot scalar, and the element count
``n`` of the launch. An input with as many elements as the launch is read element by element; an
input of one element is broadcast (every element reads it); a shorter input repeats its last
element, so no thread ever reads past a buffer.

A program with vector inputs (``input_lanes``, see ``vectors.py``) computes each element's lanes
one after the other in one thread: a vector input's pointer is a ``const float4*`` (``float2``,
``float3``) read at the element, a ``float`` input's value is used by every lane, and the output is
of the same vector type. Counts (``n``, each input's count) stay element counts.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from itertools import chain
from typing import Literal

from ..kernels.descriptor import KernelDescriptor, KernelParamDescriptor
from ..kernels.types import DType
from .check import Checked
from .vectors import vector_dtype

__all__ = ["Program", "Stage", "Ref", "single", "GENERATOR_VERSION", "BLOCK_SIZE"]

#: Part of every cache key: bump when the generated code changes for the same program.
GENERATOR_VERSION = "1"
#: Stages per pickle when a program is pickled (``Program.__getstate__``): about 0.1 ms of
#: ``pickle.dumps`` each on the CPU machine.
STAGES_PER_PICKLE = 32

#: Threads per block of generated kernels.
BLOCK_SIZE = 256
#: The entry point of every generated kernel: the same across edits, so an edit that keeps the names
#: keeps the descriptor and goes live through the Code tier.
ENTRY = "expression"

Ref = tuple[Literal["input", "scalar", "stage"], int]


@dataclass(frozen=True, eq=False)
class Stage:
    """One expression of a program and where each of its names comes from.

    Attributes:
        expr: The checked expression.
        bind: Each input and scalar name of ``expr`` → ``("input", i)``, ``("scalar", i)`` or
            ``("stage", j)`` (an earlier stage's value).
        label: Who this stage is (a block name), for comments in the generated code.
    """

    expr: Checked
    bind: Mapping[str, Ref]
    label: str = ""


@dataclass(frozen=True, eq=False)
class Program:
    """Stages evaluated per element; see the module docstring for the kernel's parameters.

    Attributes:
        inputs: Names of the input buffers (parameter names in the generated code).
        scalars: Names of the Hot scalars.
        outputs: ``(name, stage index)`` per output buffer.
        stages: In evaluation order.
        input_lanes: Lanes of each input (1 for ``float``, 2-4 for vectors, all vectors alike); empty
            when every input is a ``float``.
    """

    inputs: tuple[str, ...]
    scalars: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]
    stages: tuple[Stage, ...]
    input_lanes: tuple[int, ...] = ()

    def __getstate__(self) -> dict[str, object]:
        # Pickled (a specialised kernel goes to the compiler process): the fields, not what the cached
        # properties hold, worked out again there. The descriptor of a fused group's 500 scalars was
        # two thirds of that pickle (2.2 of 3.7 ms on the CPU machine), one C call that holds the
        # interpreter, so a frame starting meanwhile waited for all of it. The stages go as pickles
        # of ``STAGES_PER_PICKLE`` each, made in a Python loop: the rest (1.4 ms for 500 stages) was
        # still one C call; pieces of 0.1 ms let a frame thread in between.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        stages = self.stages
        if len(stages) > STAGES_PER_PICKLE:
            state["stages"] = [
                pickle.dumps(stages[i : i + STAGES_PER_PICKLE], protocol=pickle.HIGHEST_PROTOCOL)
                for i in range(0, len(stages), STAGES_PER_PICKLE)
            ]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        stages = state["stages"]
        if isinstance(stages, list):  # pickled in pieces (``__getstate__``)
            state["stages"] = tuple(chain.from_iterable(pickle.loads(piece) for piece in stages))
        self.__dict__.update(state)

    @cached_property
    def lanes(self) -> int:
        """Lanes of every output: those of the vector inputs, 1 without any."""
        return max(self.input_lanes, default=1)

    def lanes_of(self, i: int) -> int:
        """Lanes of input ``i``."""
        return self.input_lanes[i] if self.input_lanes else 1

    @cached_property
    def param_names(self) -> tuple[str, ...]:
        """C identifiers of every kernel parameter, unique, in order."""
        taken: set[str] = set()

        def fresh(base: str) -> str:
            name = base
            while name in taken:
                name += "_"
            taken.add(name)
            return name

        names = []
        for i in self.inputs:
            names += [fresh(i), fresh(f"{i}_count")]
        names += [fresh(o) for o, _ in self.outputs]
        names += [fresh(s) for s in self.scalars]
        names.append(fresh("n"))
        return tuple(names)

    @cached_property
    def descriptor(self) -> KernelDescriptor:
        """The kernel's descriptor (see the module docstring)."""
        names = iter(self.param_names)
        params: list[KernelParamDescriptor] = []
        for i in range(len(self.inputs)):
            params.append(KernelParamDescriptor(next(names), vector_dtype(self.lanes_of(i)), True, "in"))
            params.append(KernelParamDescriptor(next(names), DType.UINT32, False, "in"))
        out = vector_dtype(self.lanes)
        for _ in self.outputs:
            params.append(KernelParamDescriptor(next(names), out, True, "out"))
        for _ in self.scalars:
            params.append(KernelParamDescriptor(next(names), DType.FLOAT32, False, "in"))
        params.append(KernelParamDescriptor(next(names), DType.UINT32, False, "in"))
        return KernelDescriptor(ENTRY, tuple(params), block_size=BLOCK_SIZE)

    def input_param(self, i: int) -> int:
        """Descriptor index of input ``i``'s pointer (its count follows)."""
        return 2 * i

    def output_param(self, o: int) -> int:
        return 2 * len(self.inputs) + o

    def scalar_param(self, s: int) -> int:
        return 2 * len(self.inputs) + len(self.outputs) + s

    @cached_property
    def scalar_params(self) -> tuple[int, ...]:
        """Descriptor index of every scalar, in order (the specialiser reads them every look: a fused
        group's 500 made one at a time were most of a look)."""
        first = 2 * len(self.inputs) + len(self.outputs)
        return tuple(range(first, first + len(self.scalars)))

    @property
    def count_param(self) -> int:
        return 2 * len(self.inputs) + len(self.outputs) + len(self.scalars)

    @cached_property
    def key(self) -> str:
        """Content hash: the same program text and bindings give the same key."""
        h = hashlib.sha256(GENERATOR_VERSION.encode())
        h.update(repr((self.inputs, self.scalars, self.outputs)).encode())
        if self.lanes > 1:  # float programs keep the keys they always had
            h.update(repr(self.input_lanes).encode())
        for st in self.stages:
            h.update(b"\0" + st.expr.text.encode() + b"\0" + repr(sorted(st.bind.items())).encode())
        return h.hexdigest()

    def summary(self) -> str:
        """One line per stage: ``label: text``."""
        return "\n".join(f"{st.label or f'stage {j}'}: {st.expr.text.strip()}" for j, st in enumerate(self.stages))


def single(expr: Checked, *, output: str = "Out", label: str = "") -> Program:
    """The program of one expression: its inputs, its scalars, one output."""
    bind: dict[str, Ref] = {n: ("input", i) for i, n in enumerate(expr.inputs)}
    bind.update({n: ("scalar", i) for i, n in enumerate(expr.scalars)})
    lanes = tuple(expr.lanes.get(n, 1) for n in expr.inputs) if expr.lanes else ()
    return Program(expr.inputs, expr.scalars, ((output, 0),), (Stage(expr, bind, label),), lanes)
