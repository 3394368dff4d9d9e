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

Our own optional keys: ``description`` (text for tooltips and ``cudapatch blocks``); ``blockSize``
may also be given per axis, ``[16, 16]`` or ``[8, 8, 8]`` (x first), for 2-D and 3-D launches.

A sidecar is user input: it is read through ``_files`` (regular files of at most 1 MiB, UTF-8), and
every way it can be wrong is a ``SidecarError`` naming the file and line, found in time linear in
its size (at most ``MAX_KERNEL_PARAMETERS`` parameters, nesting and integers bounded).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from ..errors import SidecarError
from ._files import MAX_SIDECAR_BYTES, read_user_text
from ._text import INT_DIGITS_LIMIT, MAX_KERNEL_PARAMETERS, MAX_NESTING, LineIndex, data_problem, short_repr
from .types import DType, parse_type_name

__all__ = [
    "AbiSlot",
    "Direction",
    "KernelParamDescriptor",
    "KernelDescriptor",
    "NUMBA_ARRAY_ROLES",
    "MAX_BLOCK_SIZE",
    "DEFAULT_BLOCK_DIMS",
    "MAX_SHARED_MEMORY_BYTES",
    "check_launch_settings",
    "is_identifier",
    "load_sidecar",
    "parse_sidecar",
]

Direction = Literal["in", "out", "inout"]
_DIRECTIONS: dict[str, Direction] = {"in": "in", "out": "out", "inout": "inout", "in_out": "inout", "in/out": "inout"}
_KNOWN_KEYS = {"entryPoint", "blockSize", "sharedMemoryBytes", "parameters", "description"}
_KNOWN_PARAM_KEYS = {"name", "type", "direction", "isPointer", "description"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENTRY_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")  # PTX allows $ in entry names

#: Threads per block: CUDA's limit on every architecture cudapatch supports.
MAX_BLOCK_SIZE = 1024
#: Threads per block of 2-D and 3-D launches whose kernel gives no per-axis ``blockSize``.
DEFAULT_BLOCK_DIMS: dict[int, tuple[int, ...]] = {2: (16, 16), 3: (8, 8, 8)}
#: Dynamic shared memory per block: 227 KiB, the most any GPU grants (H100's opt-in maximum).
MAX_SHARED_MEMORY_BYTES = 227 * 1024


def is_identifier(name: object) -> bool:
    """Whether ``name`` is a C identifier (ASCII letters, digits, ``_``; not starting with a digit)."""
    return isinstance(name, str) and _IDENTIFIER.fullmatch(name) is not None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_launch_settings(block_size: object, shared: object) -> tuple[str, str] | None:
    """What is wrong with a kernel's ``blockSize`` and ``sharedMemoryBytes``: the key and a message
    (None: nothing). The same rules hold for sidecars and for ``// cudapatch:`` lines in CUDA C++.

    ``blockSize`` is a number of threads, or one per axis (``[16, 16]``, ``[8, 8, 8]``: x first,
    like CUDA's ``dim3``) whose product is the number of threads."""
    if isinstance(block_size, (list, tuple)):
        if not 1 <= len(block_size) <= 3 or not all(_is_int(v) and v >= 1 for v in block_size):
            return "blockSize", (
                f"'blockSize' per axis must be 1 to 3 integers of at least 1 (x, y, z), got {short_repr(block_size)}"
            )
        threads = 1
        for v in block_size:
            threads *= v
        if threads > MAX_BLOCK_SIZE:
            return "blockSize", (
                f"'blockSize' {short_repr(list(block_size))} is {threads} threads: a block has at most {MAX_BLOCK_SIZE}"
            )
    elif not _is_int(block_size) or not 1 <= block_size <= MAX_BLOCK_SIZE:  # type: ignore[operator]
        return "blockSize", f"'blockSize' must be an integer in 1..{MAX_BLOCK_SIZE}, got {short_repr(block_size)}"
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared <= MAX_SHARED_MEMORY_BYTES:
        return "sharedMemoryBytes", (
            f"'sharedMemoryBytes' must be an integer in 0..{MAX_SHARED_MEMORY_BYTES} (227 KiB, the most a GPU "
            f"grants a block), got {short_repr(shared)}"
        )
    return None


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
        block_size: Threads per block used for auto grids (the product of ``block_dims`` when set).
        shared_memory_bytes: Dynamic shared memory per block.
        description: Optional text for tooltips.
        block_dims: Threads per block along each axis (x first), when the sidecar gave them per axis;
            empty for a single number. 2-D/3-D launches without it use ``DEFAULT_BLOCK_DIMS``.
    """

    entry_point: str
    parameters: tuple[KernelParamDescriptor, ...]
    block_size: int = 256
    shared_memory_bytes: int = 0
    description: str = ""
    abi: tuple[AbiSlot, ...] = ()  # empty: one "value" slot per parameter
    block_dims: tuple[int, ...] = ()

    def launch_block(self, dims: int) -> tuple[int, int, int]:
        """Threads per block ``(x, y, z)`` for a launch over ``dims`` axes: the per-axis
        ``blockSize`` when given (padded with 1s), else ``block_size`` for 1-D and
        ``DEFAULT_BLOCK_DIMS`` (16x16, 8x8x8) for 2-D and 3-D."""
        if self.block_dims:
            bd = self.block_dims
        elif dims == 1:
            bd = (self.block_size,)
        else:
            bd = DEFAULT_BLOCK_DIMS[dims]
        return (bd[0], bd[1] if len(bd) > 1 else 1, bd[2] if len(bd) > 2 else 1)

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


def load_sidecar(path: str | Path) -> KernelDescriptor:
    """Read and validate a JSON sidecar file.

    Raises:
        SidecarError: missing, unreadable, not a regular file, larger than 1 MiB, not UTF-8, malformed
            JSON or an invalid field (names file and line).
    """
    p = Path(path)
    text = read_user_text(p, what="kernel sidecar JSON", limit=MAX_SIDECAR_BYTES, error=SidecarError)
    return parse_sidecar(text, file=str(p))


_DIGITS = re.compile(r"\d+")


def _huge_integer_line(text: str) -> int | None:
    """The line of the first JSON integer of more than 4,300 digits in ``text`` (None if none is found).

    ``json`` says only that ``int()`` refused one, not where. A JSON number starts after ``:``, ``[``,
    ``,`` or a ``-`` (spaces between), and an integer has no ``.`` or exponent after its digits;
    digits inside a string do not follow those. One pass over the text, on the error path only.
    """
    for m in _DIGITS.finditer(text):
        if m.end() - m.start() <= INT_DIGITS_LIMIT or text[m.end() : m.end() + 1] in (".", "e", "E"):
            continue
        i = m.start() - 1
        while i >= 0 and text[i] in " \t\r\n-":  # back over the gap since the last non-space (linear in all)
            i -= 1
        if i < 0 or text[i] in ":[,":
            return LineIndex(text).line(m.start())
    return None


def _load_json(text: str, file: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SidecarError(f"malformed JSON: {exc.msg} (column {exc.colno})", file=file, line=exc.lineno) from None
    except RecursionError:
        raise SidecarError(
            f"values are nested too deep to read (the limit is {MAX_NESTING} levels)", file=file
        ) from None
    except ValueError:  # the only other ValueError: an integer of more than 4,300 digits, which int() refuses
        raise SidecarError(
            "malformed JSON: a number has more than 4,300 digits", file=file, line=_huge_integer_line(text)
        ) from None
    problem = data_problem(data)
    if problem is not None:
        message, path = problem
        key = next((k for k in reversed(path) if not k.startswith("[")), None)
        pos = text.find(f'"{key}"') if key is not None else -1
        raise SidecarError(message, file=file, line=LineIndex(text).line(pos) if pos >= 0 else None)
    return data


def parse_sidecar(text: str, *, file: str = "<sidecar>") -> KernelDescriptor:
    """Validate sidecar JSON text into a ``KernelDescriptor``.

    Raises:
        SidecarError: malformed JSON or an invalid field, naming ``file`` and the line.
    """
    data = _load_json(text, file)
    if not isinstance(data, dict):
        raise SidecarError("the sidecar must be a JSON object", file=file, line=1)
    lines = LineIndex(text)

    def fail(msg: str, key: str | None = None) -> SidecarError:
        pos = text.find(f'"{key}"') if key else -1
        return SidecarError(msg, file=file, line=lines.line(pos) if pos >= 0 else None)

    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise fail(f"unknown key {short_repr(unknown[0])} (expected one of {sorted(_KNOWN_KEYS)})", unknown[0])
    entry = data.get("entryPoint")
    if not isinstance(entry, str) or not _ENTRY_NAME.fullmatch(entry):
        raise fail(
            "'entryPoint' must be the kernel's name (a C identifier)", "entryPoint" if "entryPoint" in data else None
        )
    block_size = data.get("blockSize", 256)
    shared = data.get("sharedMemoryBytes", 0)
    launch = check_launch_settings(block_size, shared)
    if launch is not None:
        raise fail(launch[1], launch[0])
    params_raw = data.get("parameters")
    if not isinstance(params_raw, list):
        raise fail("'parameters' must be a list", "parameters" if "parameters" in data else None)
    if len(params_raw) > MAX_KERNEL_PARAMETERS:
        raise fail(f"{len(params_raw)} parameters: a kernel may have at most {MAX_KERNEL_PARAMETERS}", "parameters")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("'description' must be a string", "description")

    # Each parameter's line: its name's first occurrence after the previous parameter's. The cursor
    # only moves forward, so finding every line costs one pass over the text.
    cursor = text.find('"parameters"')
    params: list[KernelParamDescriptor] = []
    seen: set[str] = set()
    for i, raw in enumerate(params_raw):
        where = f"parameter {i}"
        brace = text.find("{", cursor + 1)
        if not isinstance(raw, dict):
            raise SidecarError(f"{where} must be an object", file=file, line=lines.line(brace) if brace >= 0 else None)
        name = raw.get("name")
        name_pos = text.find(f'"{name}"', cursor + 1) if isinstance(name, str) else -1
        pos = name_pos if name_pos >= 0 else brace
        line = lines.line(pos) if pos >= 0 else None
        if pos >= 0:
            cursor = pos
        if not isinstance(name, str) or not name:
            raise SidecarError(f"{where} needs a non-empty 'name'", file=file, line=line)
        if not is_identifier(name):
            raise SidecarError(
                f"{where}: the name {short_repr(name)} is not an identifier (letters, digits and _, "
                "not starting with a digit)",
                file=file,
                line=line,
            )
        where = f"parameter {i} ('{name}')"
        bad = sorted(set(raw) - _KNOWN_PARAM_KEYS)
        if bad:
            raise SidecarError(f"{where}: unknown key {short_repr(bad[0])}", file=file, line=line)
        if name in seen:
            raise SidecarError(f"{where}: duplicate parameter name", file=file, line=line)
        seen.add(name)
        type_name = raw.get("type")
        if not isinstance(type_name, str):
            raise SidecarError(f'{where} needs a \'type\' such as "float*" or "uint"', file=file, line=line)
        try:
            dtype, ptr_from_type = parse_type_name(type_name)
        except KeyError:
            raise SidecarError(f"{where}: unknown type {short_repr(type_name)}", file=file, line=line) from None
        is_pointer: Any = raw.get("isPointer", ptr_from_type)
        if dtype is DType.BFLOAT16 and not ptr_from_type:
            raise SidecarError(
                f"{where}: bfloat16 is a buffer type ('bfloat16*'); pass a by-value scalar as float",
                file=file,
                line=line,
            )
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
        direction = _DIRECTIONS.get(direction_raw.lower()) if isinstance(direction_raw, str) else None
        if direction is None:
            raise SidecarError(
                f"{where}: 'direction' must be in, out or inout, got {short_repr(direction_raw)}", file=file, line=line
            )
        if direction != "in" and not is_pointer:
            raise SidecarError(
                f"{where}: a by-value parameter cannot have direction '{direction}'", file=file, line=line
            )
        if "description" in raw and not isinstance(raw["description"], str):
            raise SidecarError(f"{where}: 'description' must be a string", file=file, line=line)
        params.append(KernelParamDescriptor(name=name, dtype=dtype, is_pointer=is_pointer, direction=direction))
    return KernelDescriptor(
        entry_point=entry,
        parameters=tuple(params),
        block_size=_threads(block_size),
        shared_memory_bytes=shared,
        description=description,
        block_dims=tuple(block_size) if isinstance(block_size, list) else (),
    )


def _threads(block_size: int | list[int] | tuple[int, ...]) -> int:
    """Threads per block of a checked ``blockSize`` (a number, or one per axis)."""
    if isinstance(block_size, int):
        return block_size
    n = 1
    for v in block_size:
        n *= v
    return n


def descriptor_to_json(desc: KernelDescriptor) -> str:
    """Write a descriptor back as sidecar JSON (used by the kernel build script)."""
    out: dict[str, Any] = {
        "entryPoint": desc.entry_point,
        "blockSize": list(desc.block_dims) if desc.block_dims else desc.block_size,
        "sharedMemoryBytes": desc.shared_memory_bytes,
    }
    if desc.description:
        out["description"] = desc.description
    out["parameters"] = [
        {"name": p.name, "type": p.type_name, "direction": p.direction, "isPointer": p.is_pointer}
        for p in desc.parameters
    ]
    return json.dumps(out, indent=2) + "\n"
