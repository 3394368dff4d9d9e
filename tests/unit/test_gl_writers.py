"""The blocks GlBridge adds to copy outputs into GL inside the graph: ports, Hot scalars for the
mapped addresses, kernels that compile for the element type, and clear errors for bad settings."""

from __future__ import annotations

import pytest

from cudapatch.errors import CudapatchError
from cudapatch.interop.gl_writers import REQUESTS, GlBufferWriter, GlRingWriter, GlSurfaceWriter
from cudapatch.kernels.types import DType


@pytest.mark.parametrize(
    ("cls", "settings", "scalars"),
    [
        (GlBufferWriter, {"Type": "float4"}, ["Capacity", "Dst"]),
        (GlSurfaceWriter, {"Type": "uint", "Texel": "4"}, ["Surface", "Width", "Height"]),
        (GlSurfaceWriter, {"Type": "float", "Texel": "16"}, ["Surface", "Width", "Height"]),
        (GlRingWriter, {"Type": "uchar"}, ["Capacity", "Dst0", "Dst1", "Dst2", "State", "Requests", "HostDone"]),
    ],
)
def test_writers_take_one_input_and_their_addresses_as_hot_scalars(cls, settings, scalars) -> None:
    w = cls(name="w", **settings)
    (port,) = w.description.inputs
    assert port.name == "In" and port.dtype == DType.from_c_name(settings["Type"]) and not w.description.outputs
    assert [p.name for p in w.description.params if p.kind == "scalar"] == scalars
    assert all(w.description.param(n).dtype in (DType.UINT64, DType.UINT32) for n in scalars)
    for kernel in w.description.kernels:  # NVRTC: the generated code compiles
        assert kernel.source.compile("sm_90").image


def test_ring_writer_reads_the_request_table_size_the_host_writes() -> None:
    code = GlRingWriter(name="r", Type="float").description.kernels[0].source.text()
    assert f"% {REQUESTS}]" in code


def test_bad_writer_settings_name_the_block() -> None:
    with pytest.raises(CudapatchError, match="parameter 'Type': 'quux' is not one of its choices") as err:
        GlBufferWriter(name="w", Type="quux")
    assert "'w'" in str(err.value)
    with pytest.raises(CudapatchError, match="parameter 'Texel': '8' is not one of its choices: 4, 16"):
        GlSurfaceWriter(name="w", Type="float", Texel="8")
