"""The engine: device, context, registry, connections, dirty tracking, compiler, realize, buffers."""

from .buffers import AppendBuffer, BufferPool, GpuBuffer, size_class
from .compiler import compile_plan
from .connections import ConnectionGraph, Link
from .context import BlockSnapshot, Context, ExternalBinding, PatchSnapshot
from .device import DeviceContext
from .diagnostics import Diagnostic, DiagnosticCode
from .dirty import DirtyTracker
from .engine import Engine, EngineCounters
from .plan import Arg, BufferPlan, GraphPlan, KernelNodePlan, MemsetNodePlan, ProbeNodePlan, StampNodePlan, TimingPair
from .probes import Probe, ProbeSet, ProbeStats
from .profiling import AppendStats, BlockStats, EngineStats, KernelStats, ProfilingLevel
from .readback import ReadbackRing
from .realize import CompiledGraph, realize
from .registry import BlockRegistry
from .transfer import DownloadRing, UploadRing

__all__ = [
    "DownloadRing",
    "UploadRing",
    "AppendBuffer",
    "AppendStats",
    "BlockStats",
    "EngineStats",
    "StampNodePlan",
    "KernelStats",
    "ProfilingLevel",
    "TimingPair",
    "Arg",
    "BlockRegistry",
    "BlockSnapshot",
    "BufferPlan",
    "BufferPool",
    "CompiledGraph",
    "ConnectionGraph",
    "Context",
    "DeviceContext",
    "Diagnostic",
    "DiagnosticCode",
    "DirtyTracker",
    "Engine",
    "EngineCounters",
    "ExternalBinding",
    "GpuBuffer",
    "GraphPlan",
    "KernelNodePlan",
    "Link",
    "MemsetNodePlan",
    "PatchSnapshot",
    "Probe",
    "ProbeNodePlan",
    "ProbeSet",
    "ProbeStats",
    "ReadbackRing",
    "compile_plan",
    "realize",
    "size_class",
]
