"""Kernels: descriptors and sidecars, PTX signatures, kernel sources, the module cache."""

from .builder import CompiledKernel, KernelBuilder
from .cache import CubinCache, default_cache_dir
from .cuda_source import CudaSource
from .descriptor import AbiSlot, Direction, KernelDescriptor, KernelParamDescriptor, load_sidecar, parse_sidecar
from .module_cache import ModuleCache
from .numba_source import NumbaSource
from .ptx import PtxEntry, PtxModuleInfo, PtxParam, check_signature, parse_ptx
from .signature import describe_cuda_source
from .source import BUNDLED_KERNEL_DIR, KernelImage, KernelSource, PtxFileSource, bundled_kernel
from .types import DType, parse_type_name
from .watch import FileWatcher

__all__ = [
    "AbiSlot",
    "BUNDLED_KERNEL_DIR",
    "CompiledKernel",
    "CubinCache",
    "CudaSource",
    "FileWatcher",
    "KernelBuilder",
    "NumbaSource",
    "default_cache_dir",
    "describe_cuda_source",
    "DType",
    "Direction",
    "KernelDescriptor",
    "KernelImage",
    "KernelParamDescriptor",
    "KernelSource",
    "ModuleCache",
    "PtxEntry",
    "PtxFileSource",
    "PtxModuleInfo",
    "PtxParam",
    "bundled_kernel",
    "check_signature",
    "load_sidecar",
    "parse_ptx",
    "parse_sidecar",
    "parse_type_name",
]
