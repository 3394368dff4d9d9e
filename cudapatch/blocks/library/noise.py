"""Random block: uniform or normal numbers from cuRAND, new ones every frame, captured into the graph.

Measured on the H100: a captured ``curandGenerate*`` call advances the generator on the device,
so every launch of the graph yields fresh numbers without a re-capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..captured import CallDescriptor, buffer_out, host_scalar
from ..description import from_param
from ..libraries import LibraryScope, nvmath_module

__all__ = ["Random"]

_GENERATOR = "PSEUDO_PHILOX4_32_10"  # fast, and statistically sound for visuals and simulation


def _prepare(p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    libs.generator(_GENERATOR, int(s["Seed"]))  # created and seeded outside capture


def _call(stream: int, p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    rand = nvmath_module("curand")
    gen = libs.generator(_GENERATOR, int(s["Seed"]), stream)
    n = int(s["Count"])
    if int(s["Normal"]):
        normal = rand.generate_normal_double if s["double"] else rand.generate_normal
        normal(gen, p["Out"], n, float(s["Mean"]), float(s["StdDev"]))
    else:
        (rand.generate_uniform_double if s["double"] else rand.generate_uniform)(gen, p["Out"], n)


def _validate(counts: Mapping[str, int], v: Mapping[str, Any]) -> str | None:
    if int(v["Normal"]) and int(v["Count"]) % 2:
        return f"cuRAND makes normal numbers in pairs: Count must be even (it is {int(v['Count'])})"
    return None


class Random(Block):
    """``Count`` random numbers, new every frame (cuRAND Philox). ``Normal`` 0: uniform in (0, 1];
    1: normal with ``Mean`` and ``StdDev`` (Count even). ``Seed`` picks the sequence. Changing
    Normal, Mean, StdDev or Seed re-captures the call; Count rebuilds. ``Precision``: float or double."""

    type_name = "Random"

    def describe(self, b: BlockBuilder) -> None:
        text = b.text("Precision", default="float", description="float or double", choices=("float", "double"))
        double = text == "double"
        dt = DType.FLOAT64 if double else DType.FLOAT32
        desc = CallDescriptor.of(
            "curand_generate",
            buffer_out("Out", dt),
            host_scalar("Count", "uint"),
            host_scalar("Normal", "int"),
            host_scalar("Mean", "double"),
            host_scalar("StdDev", "double"),
            host_scalar("Seed", "uint"),
            description="uniform or normal random numbers (cuRAND)",
            double=double,
        )
        c = b.add_captured(_call, desc, prepare=_prepare, validate=_validate, shape_params=("Normal",))
        b.scalar("Count", c.in_("Count"), default=1 << 16, range=(1, 1 << 30), description="how many numbers")
        b.scalar("Normal", c.in_("Normal"), default=0, range=(0, 1), description="0: uniform, 1: normal")
        b.scalar("Mean", c.in_("Mean"), default=0.0, description="of the normal distribution")
        b.scalar("StdDev", c.in_("StdDev"), default=1.0, range=(0.0, None), description="of the normal distribution")
        b.scalar("Seed", c.in_("Seed"), default=1234, description="picks the sequence")
        b.output("Out", c.out("Out"), size=from_param("Count"))
