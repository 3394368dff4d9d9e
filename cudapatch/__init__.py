"""cudapatch: CUDA blocks for node-based creative hosts, compiled into one CUDA graph.

``import cudapatch`` never touches the GPU (nor imports glfw, imgui or OpenGL): the first driver
call happens when an ``Engine`` is created.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .blocks import (
    AppendFilter,
    Block,
    BlockBuilder,
    BlockDescription,
    BlockState,
    CallDescriptor,
    CustomKernel,
    Expression,
    Fill,
    KernelFile,
    LibraryScope,
    Scale,
    VectorAdd,
    buffer_in,
    buffer_inout,
    buffer_out,
    computed,
    device_scalar,
    fixed,
    from_param,
    host_scalar,
    like,
)
from .engine import (
    AppendBuffer,
    CompiledGraph,
    Diagnostic,
    DiagnosticCode,
    Engine,
    EngineStats,
    GpuBuffer,
    GraphPlan,
    ProfilingLevel,
    compile_plan,
)
from .errors import (
    BindingError,
    CudaError,
    CudapatchError,
    CudaUnavailableError,
    GraphCompileError,
    KernelLoadError,
    LibraryCallError,
    LinkError,
    ParameterError,
    PtxSignatureError,
    SidecarError,
)
from .kernels import (
    CudaSource,
    DType,
    KernelDescriptor,
    KernelParamDescriptor,
    KernelSource,
    NumbaSource,
    PtxFileSource,
    bundled_kernel,
)

try:
    __version__ = version("cudapatch")
except PackageNotFoundError:  # running from a source checkout that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "CallDescriptor",
    "LibraryCallError",
    "LibraryScope",
    "buffer_in",
    "buffer_inout",
    "buffer_out",
    "computed",
    "device_scalar",
    "host_scalar",
    "AppendBuffer",
    "AppendFilter",
    "BindingError",
    "Block",
    "BlockBuilder",
    "BlockDescription",
    "BlockState",
    "CompiledGraph",
    "CudaError",
    "CudaSource",
    "CudaUnavailableError",
    "CudapatchError",
    "CustomKernel",
    "Expression",
    "DType",
    "Diagnostic",
    "DiagnosticCode",
    "Engine",
    "EngineStats",
    "Fill",
    "GpuBuffer",
    "GraphCompileError",
    "GraphPlan",
    "KernelDescriptor",
    "KernelFile",
    "KernelLoadError",
    "KernelParamDescriptor",
    "KernelSource",
    "NumbaSource",
    "LinkError",
    "ParameterError",
    "ProfilingLevel",
    "PtxFileSource",
    "PtxSignatureError",
    "Scale",
    "SidecarError",
    "VectorAdd",
    "__version__",
    "bundled_kernel",
    "compile_plan",
    "fixed",
    "from_param",
    "like",
]
