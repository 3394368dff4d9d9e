"""Kernel parameter storage: the pinned bytes a kernel node's launch reads its arguments from.

A kernel node's ``CUDA_KERNEL_NODE_PARAMS`` points at a ``void**`` array, and each entry of that
array at one argument's bytes. ``ParamStorage`` keeps all three alive together (a byte buffer holding
every argument, the pointer array into it, the struct) plus one ctypes *slot* object over each
argument, so a Hot or Warm update is a slot write followed by ``cuGraphExecKernelNodeSetParams``
with the same struct: no allocation, no packing, no rebuild, no re-instantiation.

A build makes one storage per kernel node (10,000 at 10,000 blocks), so making one is kept cheap: the
values are packed in one ``struct.pack_into`` by a layout made once per kernel descriptor, and the
ctypes slot objects are made only for the slots something patches later (``ParamSlots``). A Cold
rebuild on the frame thread also reuses the running graph's storage for the same kernel of the same
block and rewrites every slot (``load``); ``backup``/``restore`` give it back untouched if that
build fails. A closed graph's storages are kept for the next builds (``give_back``, then
``new_storage``): a storage loaded again costs less than half of a new one.

A kernel with many arguments (``BUFFER_FROM_ARGS``, a fused group's kernel) hands the driver the
byte buffer itself (the ``extra`` launch option) instead of the pointer array: the driver copies one
block at each ``cuGraphExecKernelNodeSetParams`` instead of each argument by itself.

``PackedLaunch`` is the same idea for the engine's own fixed-signature kernels (timestamp and
readback publish nodes), whose arguments never change after the build.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..kernels._driver import driver
from ..kernels.pacing import checkpoint
from .plan import KernelNodePlan

__all__ = [
    "BUFFER_FROM_ARGS",
    "argument_offsets",
    "PackedLaunch",
    "ParamSlots",
    "ParamStorage",
    "StoreLoans",
    "clear_spares",
    "give_back",
    "new_storage",
    "pack_arguments",
    "read_slot",
    "stock_spares",
    "write_slot",
]

#: What ``ParamStorage.backup`` returns: the argument bytes, function address, grid, block and shared memory.
Backup = tuple[bytes, int, int, int, int, tuple[int, int, int, int]]


def write_slot(slot: Any, value: Any) -> None:
    """Store ``value`` in a parameter slot: a tuple fills a vector slot, anything else sets ``.value``."""
    if type(value) is tuple:
        slot[:] = value
    else:
        slot.value = value


def read_slot(slot: Any) -> Any:
    """The value in a parameter slot, in the form ``write_slot`` takes (a tuple for vector slots)."""
    return tuple(slot) if isinstance(slot, ctypes.Array) else slot.value


#: struct format character of one lane, by NumPy base type (standard sizes, no alignment: ``<``).
_LANE_FORMAT = {
    "float32": "f",
    "float64": "d",
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "uint64": "Q",
    "uint8": "B",
    "int8": "b",
    "int16": "h",
    "uint16": "H",
    "float16": "e",
}


#: Kernels with this many arguments or more hand the driver their storage as one buffer (``extra``:
#: ``CU_LAUNCH_PARAM_BUFFER_POINTER`` and ``_SIZE``) instead of a pointer per argument (``kernelParams``),
#: where every argument is a 4- or 8-byte scalar or pointer at its natural alignment, so the storage's
#: layout is the one the kernel's ABI has (no tail padding: the driver refuses a size past the last
#: argument). With ``kernelParams`` the driver copies each argument by itself, at every
#: ``cuGraphExecKernelNodeSetParams``: a fused chain of 100 Scale blocks has 204 of them, and its Hot edit
#: cost 3.7 µs more than the same edit of an unfused Scale (H100 host, bench_fusion.py).
BUFFER_FROM_ARGS = 16

#: ``extra`` keys (cuda.h's ``CU_LAUNCH_PARAM_*``).
_END, _BUFFER_POINTER, _BUFFER_SIZE = 0, 1, 2
_addressof = ctypes.addressof


def _node_params() -> Any:
    """A new ``CUDA_KERNEL_NODE_PARAMS`` (the struct's class looked up once per driver module)."""
    global _node_params_of
    d = driver()
    of, cls = _node_params_of
    if of is not d:
        cls = d.CUDA_KERNEL_NODE_PARAMS
        _node_params_of = (d, cls)
    return cls()


_node_params_of: tuple[Any, Any] = (None, None)


class _Layout:
    """How one kernel descriptor's arguments lie in a storage: byte offsets and size, the ctypes type
    of each slot, the ``struct`` that writes them all at once (None where a lane type has no struct
    format), and whether the driver takes them as one buffer (``BUFFER_FROM_ARGS``). Made once per
    descriptor (``_layout``)."""

    __slots__ = (
        "descriptor",
        "offsets",
        "size",
        "types",
        "packer",
        "vectors",
        "buffer",
        "block_type",
        "pointers_at",
        "pointers_packer",
        "size_at",
        "spares",
    )

    def __init__(self, desc: Any) -> None:
        self.descriptor = desc
        self.offsets, self.size = desc.offsets
        self.types: list[Any] = []
        fmt, pos, self.vectors = ["<"], 0, False
        for abi, o in zip(desc.slots, self.offsets, strict=True):
            p = desc.parameters[abi.param]
            if abi.role != "value":  # a slot of an ABI expansion: 8-byte pointers and counts
                t, lane = ctypes.c_int64, "q"
            elif p.is_pointer:
                t, lane = ctypes.c_uint64, "Q"
            else:
                dt = p.dtype
                t = dt.ctype if dt.lanes == 1 else dt.ctype * dt.lanes
                code = _LANE_FORMAT.get(dt.base.name)
                lane = None if code is None else code * dt.lanes
                self.vectors |= dt.lanes > 1
            self.types.append(t)
            if lane is None or o < pos:
                fmt = None
            if fmt is not None:
                fmt.append(f"{o - pos}x{lane}" if o > pos else lane)
                pos = o + struct.calcsize("<" + lane)
        self.packer = struct.Struct("".join(fmt)) if fmt is not None else None
        self.buffer = len(self.offsets) >= max(1, BUFFER_FROM_ARGS) and all(
            s.size in (4, 8) and s.align == s.size for s in desc.slots
        )
        # One ctypes object per storage holds the arguments (at 0), the pointer array after them and,
        # in buffer mode, the size the ``extra`` array points at: its type is made once here, and a
        # storage is then one allocation and one ``pack_into`` of its pointers (a build makes thousands:
        # three ctypes objects each cost 7 µs a storage on the H100 host).
        self.pointers_at = (max(self.size, 8) + 7) // 8 * 8
        n_pointers = 5 if self.buffer else len(self.offsets)
        fields: list[tuple[str, Any]] = [("args", ctypes.c_uint8 * self.pointers_at)]
        fields.append(("pointers", ctypes.c_uint64 * max(n_pointers, 1)))
        self.size_at = self.pointers_at + 8 * max(n_pointers, 1)
        if self.buffer:
            fields.append(("size", ctypes.c_size_t))
        self.block_type = type("ParamBlock", (ctypes.Structure,), {"_fields_": fields})
        self.pointers_packer = struct.Struct(f"<{n_pointers}Q")
        #: Storages of this layout that closed graphs gave back (``give_back``), for ``new_storage``.
        #: ``list.append`` and ``list.pop`` are atomic: a graph closed on one thread gives back while a
        #: build on another takes.
        self.spares: list[ParamStorage] = []


_layouts: dict[int, _Layout] = {}


def _layout(desc: Any) -> _Layout:
    """The layout of ``desc``'s arguments (cached by identity: a plan's nodes share descriptors)."""
    lay = _layouts.get(id(desc))
    if lay is None or lay.descriptor is not desc:
        if len(_layouts) > 4096:  # descriptors of edited kernels come and go
            _layouts.clear()
        lay = _layouts[id(desc)] = _Layout(desc)
    return lay


def _known_layout(desc: Any) -> _Layout | None:
    """The cached layout of ``desc``, or None where none is (spares are kept only on cached layouts)."""
    lay = _layouts.get(id(desc))
    return lay if lay is not None and lay.descriptor is desc else None


def argument_offsets(desc: Any) -> Sequence[int]:
    """The byte offset of each argument slot of ``desc`` in a ``ParamStorage``'s ``storage``."""
    return _layout(desc).offsets


def _pack_into(storage: Any, lay: _Layout, values: Sequence[Any], slots: Sequence[Any] | None = None) -> None:
    """Write one value per slot of ``lay`` into ``storage`` (a writable buffer of ``lay.size`` bytes
    or more): one ``struct.pack_into`` where the layout has a format, else through ctypes slots."""
    packer = lay.packer
    try:
        if packer is None:
            raise TypeError
        if lay.vectors:
            flat: list[Any] = []
            for v in values:
                if type(v) is tuple:
                    flat.extend(v)
                else:
                    flat.append(v)
            packer.pack_into(storage, 0, *flat)
        else:
            packer.pack_into(storage, 0, *values)
    except (struct.error, TypeError, OverflowError):
        # What struct refuses (a value out of its type's range, a float16 over 65504), the ctypes
        # slots take as a C cast does, as they always did.
        if slots is None:
            slots = [t.from_buffer(storage, o) for t, o in zip(lay.types, lay.offsets, strict=True)]
        for slot, v in zip(slots, values, strict=True):
            write_slot(slot, v)


def pack_arguments(node: KernelNodePlan, values: Sequence[Any]) -> bytes:
    """The bytes a ``ParamStorage`` of ``node`` holds after ``load(node, ..., values)``: what a Warm
    patch prepared on the build thread copies into the running node's storage at the swap
    (``CompiledGraph.prepare_patch``).

    Raises:
        ValueError: not one value per slot.
    """
    lay = _layout(node.descriptor)
    if len(values) != len(lay.types):
        raise ValueError(f"{len(values)} values for {len(lay.types)} parameter slots")
    raw = (ctypes.c_uint8 * lay.pointers_at)()  # as long as a storage's ``storage``
    _pack_into(raw, lay, values)
    return bytes(raw)


class ParamSlots(Sequence):
    """The ctypes slot objects over one storage's arguments, each made on first use: a build makes
    thousands of storages, and only the slots of Hot, Warm and bypass targets are ever written again."""

    __slots__ = ("_storage", "_types", "_offsets", "_made")

    def __init__(self, storage: Any, layout: _Layout) -> None:
        self._storage = storage
        self._types = layout.types
        self._offsets = layout.offsets
        self._made: list[Any] = [None] * len(layout.types)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._made)))]
        slot = self._made[i]
        if slot is None:
            slot = self._made[i] = self._types[i].from_buffer(self._storage, self._offsets[i])
        return slot

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self._made)))


class ParamStorage:
    """Pinned parameter storage of one kernel launch: a byte buffer holding every parameter, a
    ``void**`` array pointing into it (both in one ctypes block), ctypes slot objects over each
    parameter (``slots``, a ``ParamSlots`` made at its first use, as is each of its slots), and the
    reusable ``CUDA_KERNEL_NODE_PARAMS`` struct (``params``) pointing at the array.

    Slots follow the descriptor's ABI slots one to one (a Numba array expands to several), as do the
    plan's ``args``.
    """

    __slots__ = ("descriptor", "storage", "slots", "params", "owner")

    def __init__(self, node: KernelNodePlan, function: Any, values: Sequence[Any], owner: int = 0) -> None:
        """Lay out the storage for ``node``'s descriptor and ``load`` it.

        Args:
            node: The planned launch (descriptor, grid, block size, shared memory).
            function: The loaded ``CUfunction``.
            values: One value per ABI slot (pointers as ints, scalars, tuples for vectors).
            owner: The token of the graph whose node uses it (``GraphParts.token``; 0: none), which gives
                it back when it closes (``give_back``).
        """
        lay = _layout(node.descriptor)
        self._lay_out(lay, owner)
        self._load(lay, node, function, values)

    @classmethod
    def blank(cls, layout: _Layout) -> ParamStorage:
        """A storage of ``layout`` holding nothing yet: a spare, loaded by ``new_storage`` before use."""
        store = cls.__new__(cls)
        store._lay_out(layout, 0)
        return store

    def _lay_out(self, lay: _Layout, owner: int) -> None:
        self.descriptor = lay.descriptor
        #: Which graph's node uses this storage (``GraphParts.token``): only that graph gives it back.
        self.owner = owner
        # One block holds the arguments at offset 0, then the pointer array (``_Layout.block_type``);
        # ``storage`` is its argument bytes (a view that keeps the block alive).
        block = lay.block_type()
        self.storage = block.args
        base = _addressof(block)
        kp = _node_params()
        at = base + lay.pointers_at
        if lay.buffer:  # the whole argument block in one: the pointer array is the ``extra`` array
            block.size = lay.size
            lay.pointers_packer.pack_into(
                block, lay.pointers_at, _BUFFER_POINTER, base, _BUFFER_SIZE, base + lay.size_at, _END
            )
            kp.kernelParams = 0
            kp.extra = at
        else:
            offsets = lay.offsets
            if offsets:
                lay.pointers_packer.pack_into(block, lay.pointers_at, *[base + o for o in offsets])
            kp.kernelParams = at if offsets else 0
            kp.extra = 0
        self.params = kp

    def __getattr__(self, name: str) -> Any:
        # ``slots`` is made on first use: most storages of a build are never patched, and making it
        # for each cost the build a microsecond a node.
        if name == "slots":
            self.slots = slots = ParamSlots(self.storage, _layout(self.descriptor))
            return slots
        raise AttributeError(name)

    def fits(self, node: KernelNodePlan) -> bool:
        """Whether this storage's layout serves ``node`` (same descriptor, so the same slots)."""
        return self.descriptor is node.descriptor or self.descriptor == node.descriptor

    def load(self, node: KernelNodePlan, function: Any, values: Sequence[Any]) -> None:
        """Write every slot and the launch configuration (a Cold rebuild reusing this storage).

        Raises:
            ValueError: not one value per slot.
        """
        self._load(_layout(self.descriptor), node, function, values)

    def _load(self, lay: _Layout, node: KernelNodePlan, function: Any, values: Sequence[Any]) -> None:
        if len(values) != len(lay.types):
            raise ValueError(f"{len(values)} values for {len(lay.types)} parameter slots")
        _pack_into(self.storage, lay, values)
        kp = self.params
        kp.func = function
        kp.gridDimX = node.grid
        kp.blockDimX = node.block
        kp.gridDimY, kp.gridDimZ, kp.blockDimY, kp.blockDimZ = node.yz
        kp.sharedMemBytes = node.shared_bytes

    def backup(self) -> Backup:
        """A copy of everything ``load`` writes, for ``restore``."""
        kp = self.params
        # int(): the struct's ``func`` getter returns a view of the field, which the next load rewrites.
        yz = (kp.gridDimY, kp.gridDimZ, kp.blockDimY, kp.blockDimZ)
        return bytes(self.storage), int(kp.func), kp.gridDimX, kp.blockDimX, kp.sharedMemBytes, yz

    def restore(self, saved: Backup) -> None:
        """Put back what ``backup`` returned (a failed rebuild leaves the running graph's values intact)."""
        raw, func, grid, block, shared, yz = saved
        ctypes.memmove(_addressof(self.storage), raw, len(raw))
        kp = self.params
        kp.func, kp.gridDimX, kp.blockDimX, kp.sharedMemBytes = func, grid, block, shared
        kp.gridDimY, kp.gridDimZ, kp.blockDimY, kp.blockDimZ = yz

    def launch_alone(self, stream: Any) -> Any:
        """Launch this kernel by itself on ``stream`` (fault replay); returns the driver's error code."""
        kp = self.params
        return driver().cuLaunchKernel(
            kp.func,
            kp.gridDimX,
            kp.gridDimY,
            kp.gridDimZ,
            kp.blockDimX,
            kp.blockDimY,
            kp.blockDimZ,
            kp.sharedMemBytes,
            stream,
            kp.kernelParams,
            kp.extra,
        )[0]


class StoreLoans:
    """The running graph's parameter storages, lent to the Cold rebuild that replaces it.

    A rebuild takes the storage of the same kernel of the same block when its layout fits and loads
    the new values into it (the running graph keeps reading the same bytes until the new graph
    replaces it, and the values it reads are the ones the new plan would write anyway, except when
    the build fails: ``restore`` then puts every borrowed storage back as it was).
    """

    def __init__(self, stores: Mapping[tuple[int, int], ParamStorage], owner: int = 0) -> None:
        """Offer the running graph's storages to one rebuild.

        Args:
            stores: ``(block_id, kernel index)`` -> storage of the running graph (nothing is touched yet).
            owner: The token of the graph being built (``GraphParts.token``): every storage it takes is its own.
        """
        self._stores = dict(stores)
        self._owner = owner
        self._saved: list[tuple[ParamStorage, Backup, int]] = []

    def storage(self, node: KernelNodePlan, function: Any, values: Sequence[Any]) -> ParamStorage:
        """A loaded storage for ``node``: the borrowed one of its kernel if it fits, else a spare or a
        new one (``new_storage``)."""
        store = self._stores.pop((node.block_id, node.kernel), None)
        if store is not None and store.fits(node):
            self._saved.append((store, store.backup(), store.owner))
            store.load(node, function, values)
            store.owner = self._owner  # the graph that closes first must not give it back
            return store
        return new_storage(node, function, values, self._owner)

    def restore(self) -> None:
        """Give back every borrowed storage as it was (the build failed; the running graph goes on)."""
        for store, saved, owner in self._saved:
            store.restore(saved)
            store.owner = owner
        self._saved.clear()


#: The most storages one layout keeps for later builds (``give_back``): a 10,000-node patch's worth.
SPARES_PER_LAYOUT = 16_384


def new_storage(node: KernelNodePlan, function: Any, values: Sequence[Any], owner: int = 0) -> ParamStorage:
    """A storage for ``node`` loaded with ``function`` and ``values``: one a closed graph gave back
    (``give_back``) where its layout has one, else a new ``ParamStorage``. Loading a spare writes
    everything a new one holds (every argument, the function, the launch configuration), so the two
    are the same to the graph; in a 1,000-node build's realize it cost 5.7 µs a node against 13.3 µs
    for a new one (CPU machine).

    Raises:
        ValueError: not one value per slot.
    """
    lay = _layout(node.descriptor)
    try:
        store = lay.spares.pop()  # (its ``descriptor`` is the layout's: spares are kept by identity)
    except IndexError:
        return ParamStorage(node, function, values, owner)
    try:
        store._load(lay, node, function, values)
    except BaseException:
        lay.spares.append(store)
        raise
    store.owner = owner
    return store


def stock_spares(
    stores: Iterable[ParamStorage],
    stop: Callable[[], bool] | None = None,
    give_up: Callable[[], bool] | None = None,
) -> Callable[[], Any] | None:
    """Make spare storages ahead of the next build (``new_storage``): of each layout among ``stores``
    (a running graph's), as many as ``stores`` hold, less the spares it has. The first edit of a patch
    then loads spares too, as every later one does with the storages of the graph it replaced
    (``give_back``). ``checkpoint()`` between pieces; when ``stop()`` says True (a build waits for the
    thread), returns a callable that makes the rest, else None; when ``give_up()`` says True (the
    engine closes), makes no more."""
    wanted: dict[int, list[Any]] = {}
    for i, store in enumerate(stores):
        if i % STOCK_PIECE == STOCK_PIECE - 1:
            checkpoint()
        lay = _known_layout(store.descriptor)
        if lay is not None:
            wanted.setdefault(id(lay), [lay, 0])[1] += 1
    work = [(lay, min(n, SPARES_PER_LAYOUT)) for lay, n in wanted.values()]
    return _stock(work, stop, give_up)


def _stock(
    work: list[tuple[_Layout, int]], stop: Callable[[], bool] | None, give_up: Callable[[], bool] | None
) -> Callable[[], Any] | None:
    while work:
        lay, n = work[-1]
        short = n - len(lay.spares)
        if short <= 0 or (give_up is not None and give_up()):
            work.pop()
            continue
        if stop is not None and stop():
            return lambda: _stock(work, stop, give_up)
        for _ in range(min(short, STOCK_PIECE)):
            lay.spares.append(ParamStorage.blank(lay))
        checkpoint()
    return None


def clear_spares() -> None:
    """Let go of every spare storage (an engine closed: the next builds make new ones, as at the start)."""
    for lay in list(_layouts.values()):
        lay.spares.clear()


#: Spare storages made between two checkpoints (``stock_spares``): about 0.5 ms on the CPU machine.
STOCK_PIECE = 64


def give_back(stores: Iterable[ParamStorage], owner: int) -> None:
    """Keep the storages of ``stores`` that ``owner`` (a closed graph's ``GraphParts.token``) owns for
    later builds (``new_storage``). Only once nothing reads them again: the graph's executable is
    destroyed (the driver copied their bytes when the nodes were added), and neither a newer graph
    (a storage lent to one is its own: ``StoreLoans``) nor anything else patches them."""
    for store in stores:
        if store.owner != owner or not owner:
            continue
        store.owner = 0
        lay = _known_layout(store.descriptor)
        if lay is not None and len(lay.spares) < SPARES_PER_LAYOUT:
            lay.spares.append(store)


class PackedLaunch:
    """The arguments of a fixed-signature kernel launch (the engine's timestamp and publish kernels),
    packed once: one ctypes value per argument, the ``void**`` array pointing at them, and the
    ``CUDA_KERNEL_NODE_PARAMS`` struct (``params``). The driver copies them when the node is added;
    the object is kept with the graph all the same, like every other parameter storage."""

    __slots__ = ("values", "pointers", "params")

    def __init__(self, function: Any, values: Sequence[Any], *, threads: int = 1, grid: int = 1) -> None:
        """Pack the arguments of a launch of ``function`` (one block unless ``grid`` says more).

        Args:
            function: The loaded ``CUfunction``.
            values: ctypes values (``c_uint64(...)``, ``c_uint32(...)``), one per kernel parameter.
            threads: Threads per block.
            grid: Blocks (a probe's reduction).
        """
        d = driver()
        self.values = tuple(values)
        self.pointers = (ctypes.c_void_p * max(len(self.values), 1))(*[ctypes.addressof(v) for v in self.values])
        kp = d.CUDA_KERNEL_NODE_PARAMS()
        kp.func = function
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = grid, 1, 1
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = threads, 1, 1
        kp.sharedMemBytes = 0
        kp.kernelParams = ctypes.addressof(self.pointers)
        kp.extra = 0
        self.params = kp
