"""Capture one library call into a CUDA graph that can become a child-graph node.

``capture_call`` runs the call's ``prepare`` step outside capture, then the call itself between
``cuStreamBeginCapture`` (relaxed mode: libraries may query and set host state) and
``cuStreamEndCapture`` on the engine's capture stream, and inspects the result. Whatever happens,
the stream is never left capturing: a call that raises ends the capture and the partial graph is
destroyed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import LibraryCallError
from ..kernels._driver import check, driver
from .libraries import LibraryHandles, library_error
from .plan import CapturedNodePlan

__all__ = ["capture_call", "captured_node_types", "destroy_graph"]

# Node types a child graph cannot hold (cuGraphAddChildGraphNode refuses them).
_REFUSED = {"MEM_ALLOC": "allocates memory", "MEM_FREE": "frees memory"}


def destroy_graph(graph: Any) -> None:
    """Destroy a captured graph, ignoring errors (cleanup on a failure path)."""
    try:
        driver().cuGraphDestroy(graph)
    except Exception:
        pass


def captured_node_types(graph: Any) -> list[str]:
    """Node types of ``graph`` (``KERNEL``, ``MEMSET``, ``MEM_ALLOC`` ...), in the driver's order.

    Raises:
        CudaError: the driver refused the query.
    """
    d = driver()
    _, count = check(d.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
    nodes, _ = check(d.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
    return [check(d.cuGraphNodeGetType(n), "cuGraphNodeGetType").name.replace("CU_GRAPH_NODE_TYPE_", "") for n in nodes]


def capture_call(
    node: CapturedNodePlan,
    pointers: Mapping[str, int],
    scalars: Mapping[str, Any],
    libraries: LibraryHandles,
    block_name: str | None = None,
) -> Any:
    """Capture ``node``'s call into a new ``CUgraph`` (the caller destroys it).

    Args:
        node: The planned call.
        pointers: Device address of each pointer parameter and device scalar, by name.
        scalars: Value of each host scalar and count, by name.
        libraries: The engine's library handles.
        block_name: For error messages.

    Raises:
        LibraryCallError: ``prepare`` or the call raised (with the library's status name), the
            capture was invalidated (a call that synchronizes), or the captured work holds nodes a
            child graph cannot (memory allocation: give the library a workspace).
        CudaError: a capture driver call failed.
    """
    d = driver()
    spec: Any = node.spec
    name = node.entry_point
    scope = libraries.scope((node.block_id, node.kernel))
    stream = libraries.capture_stream
    if spec.prepare is not None:
        try:
            spec.prepare(pointers, scalars, scope)
        except Exception as exc:
            raise library_error(exc, name, block_name) from exc
    check(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
    failure: BaseException | None = None
    libraries.capturing = True
    try:
        spec.call(int(stream), pointers, scalars, scope)
    except BaseException as exc:  # the capture must end whatever the call raised
        failure = exc
    finally:
        libraries.capturing = False
        err, graph = d.cuStreamEndCapture(stream)
    if failure is not None:
        if not err and graph is not None:
            destroy_graph(graph)
        if not isinstance(failure, Exception):
            raise failure
        raise library_error(failure, name, block_name) from failure
    if err:
        raise LibraryCallError(
            f"the capture of '{name}' failed ({err.name}): the call must only enqueue work on the stream it "
            "is given (no synchronization, no default-stream copies)",
            status=err.name,
            block=block_name,
            kernel=name,
        )
    try:
        types = captured_node_types(graph)
    except Exception:
        destroy_graph(graph)
        raise
    refused = [t for t in types if t in _REFUSED]
    if refused:
        destroy_graph(graph)
        what = _REFUSED[refused[0]]
        raise LibraryCallError(
            f"the captured '{name}' {what} inside the graph ({', '.join(types)}), which a child-graph node "
            "cannot hold; fix: reserve memory before capture (libs.workspace(...) in prepare, or a library "
            "workspace such as cublasSetWorkspace, which libs.cublas(stream) sets)",
            status=f"CU_GRAPH_NODE_TYPE_{refused[0]}",
            block=block_name,
            kernel=name,
        )
    return graph
