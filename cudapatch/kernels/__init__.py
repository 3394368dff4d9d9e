"""Kernels: descriptors and sidecars, PTX signatures, kernel sources, the module cache."""

from .descriptor import Direction, KernelDescriptor, KernelParamDescriptor, load_sidecar, parse_sidecar
from .module_cache import ModuleCache
from .ptx import PtxEntry, PtxModuleInfo, PtxParam, check_signature, parse_ptx
from .source import BUNDLED_KERNEL_DIR, KernelImage, KernelSource, PtxFileSource, bundled_kernel
from .types import DType, parse_type_name

__all__ = [
    "BUNDLED_KERNEL_DIR",
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
