"""Blocks whose ports follow their kernel's signature: ``CustomKernel`` (CUDA C++ text, as a host
operator's text field holds it) and ``KernelFile`` (a ``.cu`` or ``.ptx`` + ``.json`` file)."""

from __future__ import annotations

from pathlib import Path

from ...errors import CudapatchError, KernelLoadError
from ...kernels.cuda_source import CudaSource
from ...kernels.source import KernelSource, PtxFileSource
from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder, KernelHandle
from ..description import from_param, like

__all__ = ["CustomKernel", "KernelFile", "DEFAULT_CUSTOM_CODE", "ports_from_signature"]

DEFAULT_CUSTOM_CODE = """\
// One thread per element of the first input. Edit me while the patch runs.
extern "C" __global__ void custom(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
"""

_COUNT_NAMES = ("n", "count", "num", "size")


def ports_from_signature(b: BlockBuilder, source: KernelSource) -> None:
    """Add ``source`` and make one port or scalar per kernel parameter.

    ``const T*`` parameters become inputs, ``T*`` outputs (as many elements as the first input, else
    the first inout pointer, or ``Count`` when there is neither), an integer parameter called
    ``n``/``count`` receives the element count, and every other by-value parameter becomes a scalar
    (floats default to 1).

    An ``inout`` pointer (``/*inout*/ T*``, or ``"direction": "inout"`` in a sidecar) is an in-place
    port: a required input the user binds or links, passed on as an output of the same name
    (``BlockBuilder.through``) that later blocks read after this kernel wrote it. The engine never
    allocates or zeroes it: a counter an appending kernel adds to keeps what the user put there, so
    the user decides when it starts again (rather than the kernel running past its output from the
    second frame on, as a counter made a plain, never-zeroed output would).
    """
    k = b.add_kernel(source)
    try:
        _ports(b, k)
    except CudapatchError as exc:
        if exc.file is None:  # a kernel name that clashes with the block's (e.g. "Count"): name the kernel's file
            exc.file = str(getattr(source, "path", None) or getattr(source, "ptx_path", None) or source.debug_name)
        raise


def _ports(b: BlockBuilder, k: KernelHandle) -> None:
    params = k.descriptor.parameters
    # The launch follows the first input; a kernel that only reads and writes in place (``/*inout*/``)
    # follows its first inout pointer, so ``n`` is the length of the memory it writes, never ``Count``.
    first_input = next((p.name for p in params if p.is_pointer and p.direction == "in"), None) or next(
        (p.name for p in params if p.is_pointer and p.direction == "inout"), None
    )
    if first_input is None:
        b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 2**31 - 1))
        size = from_param("Count")
    else:
        size = like(first_input)
    for i, p in enumerate(params):
        if p.is_pointer and p.direction == "in":
            b.input(p.name, k.in_(i))
        elif p.is_pointer and p.direction == "inout":
            b.input(p.name, k.in_(i), description=f"read and written in place by '{k.entry_point}': bind or link it")
            b.through(p.name)
        elif p.is_pointer:
            b.output(p.name, k.out(i), size=size)
        elif p.name.lower() in _COUNT_NAMES and p.dtype in (DType.UINT32, DType.INT32):
            k.set_count(i, size)
        else:
            default = 1.0 if p.dtype.base.kind == "f" else 0
            b.scalar(p.name, k.in_(i), default=(default,) * p.dtype.lanes if p.dtype.lanes > 1 else default)
    k.auto_grid(size)


class CustomKernel(Block):
    """A kernel written as CUDA C++ in the ``Code`` text parameter; its signature makes the ports
    (see ``ports_from_signature``).

    Editing ``Code`` compiles in the background; with the same signature the new kernel is swapped
    into the running graph (Code tier), otherwise the ports change and the graph is rebuilt. A
    compile error shows the compiler's log on the block while the previous kernel keeps running.
    """

    type_name = "CustomKernel"

    def describe(self, b: BlockBuilder) -> None:
        code = b.text("Code", default=DEFAULT_CUSTOM_CODE, description="CUDA C++ with one __global__ kernel")
        ports_from_signature(b, self._source(code))

    def _source(self, code: str) -> CudaSource:
        return CudaSource(code=code, name=f"{self.name}.cu")

    def text_source(self, name: str, text: str) -> tuple[int, KernelSource] | None:
        return (0, self._source(text)) if name == "Code" else None


class KernelFile(Block):
    """A kernel from a file named by the ``Path`` text parameter: a ``.cu`` file (NVRTC) or a
    ``.ptx`` with its ``.json`` sidecar. Its signature makes the ports (see ``ports_from_signature``).

    The engine watches the file (and a ``.cu``'s ``#include``s): an edit with the same signature is
    swapped in place, a signature change re-describes the block and rebuilds the graph.
    """

    type_name = "KernelFile"

    def describe(self, b: BlockBuilder) -> None:
        text = b.text("Path", default="", description="a .cu file, or a .ptx with its .json sidecar")
        if not text:
            raise KernelLoadError("set Path to a .cu or .ptx kernel file", block=self.name)
        path = Path(text)
        if not path.is_absolute() and self.kernel_dir is not None:
            path = self.kernel_dir / path
        source: KernelSource = PtxFileSource(path) if path.suffix == ".ptx" else CudaSource(path=path)
        ports_from_signature(b, source)

    def __init__(self, path: str | Path | None = None, **kwargs: object) -> None:
        if path is not None:
            kwargs["Path"] = str(path)
        super().__init__(**kwargs)  # type: ignore[arg-type]
