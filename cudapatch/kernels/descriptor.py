"""Kernel descriptors and the JSON sidecar format.

The sidecar format is VL.CudaGraph's, so kernels written for it load unchanged::

    {
      "entryPoint": "vector_add",
      "blockSize": 256,
      "sharedMemoryBytes": 0,
      "parameters": [
        {"name": "a", "type": "float*", "direction": "in", "isPointer": true},
        {"name": "n", "type": "uint", "direction": "in", "isPointer": false}
      ]
    }

Our own optional keys: ``description`` (text for tooltips and ``cudapatch blocks``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from ..errors import SidecarError
from .types import DType, parse_type_name

__all__ = [
    "AbiSlot",
    "Direction",
    "KernelParamDescriptor",
    "KernelDescriptor",
    "NUMBA_ARRAY_ROLES",
    "load_sidecar",
    "parse_sidecar",
]

Direction = Literal["in", "out", "inout"]
_DIRECTIONS: dict[str, Direction] = {"in": "in", "out": "out", "inout": "inout", "in_out": "inout", "in/out": "inout"}
_KNOWN_KEYS = {"entryPoint", "blockSize", "sharedMemoryBytes", "parameters", "description"}
_KNOWN_PARAM_KEYS = {"name", "type", "direction", "isPointer", "description"}


@dataclass(frozen=True)
class KernelParamDescriptor:
    """One kernel parameter as the sidecar declares it.

    Attributes:
        name: Parameter name (for messages and pins).
        dtype: Element type (of the pointee for pointers).
        is_pointer: True for device pointers (buffers), False for by-value scalars/structs.
        direction: ``in``, ``out`` or ``inout`` (what the kernel does with the pointee).
    """

    name: str
    dtype: DType
    is_pointer: bool
    direction: Direction = "in"
    #: Bytes this parameter takes in the kernel's parameter buffer (derived).
    size: int = field(init=False, compare=False, repr=False)
    #: Alignment of the parameter in the kernel's parameter buffer (derived).
    alignment: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", 8 if self.is_pointer else self.dtype.itemsize)
        object.__setattr__(self, "alignment", 8 if self.is_pointer else self.dtype.alignment)

    @property
    def type_name(self) -> str:
        """The sidecar spelling: ``float*``, ``uint``."""
        return self.dtype.c_name + ("*" if self.is_pointer else "")


#: Roles of the machine-level slots an array argument expands to in Numba's ABI, in order, for 1-D arrays.
NUMBA_ARRAY_ROLES = ("meminfo", "parent", "nitems", "itemsize", "data", "shape0", "stride0")


@dataclass(frozen=True)
class AbiSlot:
    """One machine-level kernel parameter: part ``role`` of user parameter ``param``.

    Plain kernels have one ``value`` slot per parameter. A Numba array argument expands to
    ``NUMBA_ARRAY_ROLES`` (8 bytes each): the engine fills ``data`` with the buffer pointer,
    ``nitems``/``shape0`` with its element count, ``itemsize``/``stride0`` with the element size.
    """

    param: int
    role: str
    size: int
    align: int


@dataclass(frozen=True)
class KernelDescriptor:
    """What the engine needs to know to launch a kernel.

    Attributes:
        entry_point: Name of the ``.entry`` in the module.
        parameters: The parameters in order.
        block_size: Threads per block (1-D) used for auto grids.
        shared_memory_bytes: Dynamic shared memory per block.
        description: Optional text for tooltips.
    """

    entry_point: str
    parameters: tuple[KernelParamDescriptor, ...]
    block_size: int = 256
    shared_memory_bytes: int = 0
    description: str = ""
    abi: tuple[AbiSlot, ...] = ()  # empty: one "value" slot per parameter

    @cached_property
    def slots(self) -> tuple[AbiSlot, ...]:
        """The machine-level parameters, in order (the ABI expansion, or one per parameter)."""
        if self.abi:
            return self.abi
        return tuple(AbiSlot(i, "value", p.size, p.alignment) for i, p in enumerate(self.parameters))

    @cached_property
    def groups(self) -> tuple[tuple[str, ...], ...]:
        """For each user parameter, the roles of its slots (``("value",)`` for plain parameters)."""
        out: list[list[str]] = [[] for _ in self.parameters]
        for s in self.slots:
            out[s.param].append(s.role)
        return tuple(tuple(g) for g in out)

    def layout(self) -> tuple[tuple[int, int], ...]:
        """The parameter layout ``((size, alignment), ...)``: equal layouts can swap kernels in place."""
        return tuple((s.size, s.align) for s in self.slots)

    @cached_property
    def offsets(self) -> tuple[tuple[int, ...], int]:
        """Byte offset of each parameter in a packed parameter buffer, and the buffer's size."""
        offsets = []
        off = 0
        for s in self.slots:
            off = -(-off // s.align) * s.align
            offsets.append(off)
            off += s.size
        return tuple(offsets), off

    def param_index(self, name: str) -> int:
        """Index of the parameter called ``name``.

        Raises:
            KeyError: no such parameter.
        """
        for i, p in enumerate(self.parameters):
            if p.name == name:
                return i
        raise KeyError(name)


def _line_of(text: str, needle: str, start: int = 0) -> int | None:
    pos = text.find(needle, start)
    return None if pos < 0 else text.count("\n", 0, pos) + 1


def load_sidecar(path: str | Path) -> KernelDescriptor:
    """Read and validate a JSON sidecar file.

    Raises:
        SidecarError: missing/unreadable file, malformed JSON or an invalid field (names file and line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SidecarError("kernel sidecar JSON not found", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SidecarError(f"cannot read kernel sidecar: {exc}", file=str(p)) from None
    return parse_sidecar(text, file=str(p))


def parse_sidecar(text: str, *, file: str = "<sidecar>") -> KernelDescriptor:
    """Validate sidecar JSON text into a ``KernelDescriptor``.

    Raises:
        SidecarError: malformed JSON or an invalid field, naming ``file`` and the line.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SidecarError(f"malformed JSON: {exc.msg} (column {exc.colno})", file=file, line=exc.lineno) from None
    if not isinstance(data, dict):
        raise SidecarError("the sidecar must be a JSON object", file=file, line=1)

    def fail(msg: str, key: str | None = None, start: int = 0) -> SidecarError:
        line = _line_of(text, f'"{key}"', start) if key else None
        return SidecarError(msg, file=file, line=line)

    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise fail(f"unknown key '{unknown[0]}' (expected one of {sorted(_KNOWN_KEYS)})", unknown[0])
    entry = data.get("entryPoint")
    if not isinstance(entry, str) or not re.fullmatch(r"[A-Za-z_$][\w$]*", entry or ""):
        raise fail(
            "'entryPoint' must be the kernel's name (a C identifier)", "entryPoint" if "entryPoint" in data else None
        )
    block_size = data.get("blockSize", 256)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= 1024:
        raise fail(f"'blockSize' must be an integer in 1..1024, got {block_size!r}", "blockSize")
    shared = data.get("sharedMemoryBytes", 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise fail(f"'sharedMemoryBytes' must be a non-negative integer, got {shared!r}", "sharedMemoryBytes")
    params_raw = data.get("parameters")
    if not isinstance(params_raw, list):
        raise fail("'parameters' must be a list", "parameters" if "parameters" in data else None)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("'description' must be a string", "description")

    params_start = text.find('"parameters"')
    params: list[KernelParamDescriptor] = []
    seen: set[str] = set()
    cursor = params_start
    for i, raw in enumerate(params_raw):
        where = f"parameter {i}"
        if not isinstance(raw, dict):
            raise SidecarError(f"{where} must be an object", file=file, line=_line_of(text, "{", cursor + 1))
        name = raw.get("name")
        name_pos = text.find(f'"{name}"', cursor + 1) if isinstance(name, str) else -1
        line = text.count("\n", 0, name_pos) + 1 if name_pos >= 0 else _line_of(text, "{", cursor + 1)
        if name_pos >= 0:
            cursor = name_pos
        if not isinstance(name, str) or not name:
            raise SidecarError(f"{where} needs a non-empty 'name'", file=file, line=line)
        where = f"parameter {i} ('{name}')"
        bad = sorted(set(raw) - _KNOWN_PARAM_KEYS)
        if bad:
            raise SidecarError(f"{where}: unknown key '{bad[0]}'", file=file, line=line)
        if name in seen:
            raise SidecarError(f"{where}: duplicate parameter name", file=file, line=line)
        seen.add(name)
        type_name = raw.get("type")
        if not isinstance(type_name, str):
            raise SidecarError(f'{where} needs a \'type\' such as "float*" or "uint"', file=file, line=line)
        try:
            dtype, ptr_from_type = parse_type_name(type_name)
        except KeyError:
            raise SidecarError(f"{where}: unknown type '{type_name}'", file=file, line=line) from None
        is_pointer: Any = raw.get("isPointer", ptr_from_type)
        if not isinstance(is_pointer, bool):
            raise SidecarError(f"{where}: 'isPointer' must be true or false", file=file, line=line)
        if is_pointer != ptr_from_type:
            raise SidecarError(
                f"{where}: 'isPointer' is {str(is_pointer).lower()} but type '{type_name}' "
                f"{'is' if ptr_from_type else 'is not'} a pointer",
                file=file,
                line=line,
            )
        direction_raw = raw.get("direction", "in")
        direction = _DIRECTIONS.get(str(direction_raw).lower()) if isinstance(direction_raw, str) else None
        if direction is None:
            raise SidecarError(
                f"{where}: 'direction' must be in, out or inout, got {direction_raw!r}", file=file, line=line
            )
        if direction != "in" and not is_pointer:
            raise SidecarError(
                f"{where}: a by-value parameter cannot have direction '{direction}'", file=file, line=line
            )
        params.append(KernelParamDescriptor(name=name, dtype=dtype, is_pointer=is_pointer, direction=direction))
    return KernelDescriptor(
        entry_point=entry,
        parameters=tuple(params),
        block_size=block_size,
        shared_memory_bytes=shared,
        description=description,
    )


def descriptor_to_json(desc: KernelDescriptor) -> str:
    """Write a descriptor back as sidecar JSON (used by the kernel build script)."""
    out: dict[str, Any] = {
        "entryPoint": desc.entry_point,
        "blockSize": desc.block_size,
        "sharedMemoryBytes": desc.shared_memory_bytes,
    }
    if desc.description:
        out["description"] = desc.description
    out["parameters"] = [
        {"name": p.name, "type": p.type_name, "direction": p.direction, "isPointer": p.is_pointer}
        for p in desc.parameters
    ]
    return json.dumps(out, indent=2) + "\n"
