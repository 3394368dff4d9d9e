"""DType names and the VL.CudaGraph JSON sidecar format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudapatch.errors import SidecarError
from cudapatch.kernels import DType, KernelDescriptor, load_sidecar, parse_sidecar, parse_type_name
from cudapatch.kernels.descriptor import descriptor_to_json

VL_SIDECAR = """{
  "entryPoint": "particles_emit",
  "blockSize": 128,
  "sharedMemoryBytes": 0,
  "parameters": [
    { "name": "positions", "type": "float3*", "direction": "Out", "isPointer": true },
    { "name": "counter", "type": "uint*", "direction": "InOut", "isPointer": true },
    { "name": "origin", "type": "float3", "direction": "In", "isPointer": false },
    { "name": "speed", "type": "float", "direction": "In", "isPointer": false },
    { "name": "seed", "type": "uint", "direction": "In", "isPointer": false },
    { "name": "mass", "type": "double", "direction": "In", "isPointer": false }
  ]
}
"""


def test_type_names() -> None:
    assert parse_type_name("float*") == (DType.FLOAT32, True)
    assert parse_type_name("const unsigned int *") == (DType.UINT32, True)
    assert parse_type_name("uint") == (DType.UINT32, False)
    assert parse_type_name("float4") == (DType.FLOAT4, False)
    assert DType.FLOAT3.itemsize == 12 and DType.FLOAT3.alignment == 4
    assert DType.FLOAT4.alignment == 16 and DType.FLOAT2.alignment == 8 and DType.FLOAT64.itemsize == 8
    assert DType.from_numpy("float32") is DType.FLOAT32
    with pytest.raises(KeyError):
        parse_type_name("quaternion*")


def test_vl_cudagraph_sidecar_loads_unchanged() -> None:
    desc = parse_sidecar(VL_SIDECAR, file="emit.json")
    assert desc.entry_point == "particles_emit" and desc.block_size == 128
    names = [p.name for p in desc.parameters]
    assert names == ["positions", "counter", "origin", "speed", "seed", "mass"]
    pos, ctr, origin = desc.parameters[:3]
    assert (pos.dtype, pos.is_pointer, pos.direction) == (DType.FLOAT3, True, "out")
    assert ctr.direction == "inout" and origin.size == 12 and origin.alignment == 4
    assert [p.size for p in desc.parameters] == [8, 8, 12, 4, 4, 8]
    assert desc.param_index("speed") == 3


def test_sidecar_round_trip() -> None:
    desc = parse_sidecar(VL_SIDECAR)
    again = parse_sidecar(descriptor_to_json(desc))
    assert again == desc and isinstance(again, KernelDescriptor)


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ('{"entryPoint": "k",\n "parameters": [\n {"name": "a", "type": "float*",}\n]}', "malformed JSON", 3),
        ('{"entryPoint": "k", "parameters": [], "blockSiz": 3}', "unknown key 'blockSiz'", 1),
        (
            '{\n"entryPoint": "k",\n"blockSize": 4096,\n"parameters": []}',
            "'blockSize' must be an integer in 1..1024",
            3,
        ),
        ('{"entryPoint": "2bad", "parameters": []}', "'entryPoint' must be", 1),
        ('{"entryPoint": "k"}', "'parameters' must be a list", None),
        ('{"entryPoint": "k", "parameters": [\n\n{"name": "a", "type": "vec9*"}]}', "unknown type 'vec9*'", 3),
        (
            '{"entryPoint": "k", "parameters": [{"name": "a", "type": "float*", "isPointer": false}]}',
            "'isPointer' is false",
            1,
        ),
        ('{"entryPoint": "k", "parameters": [{"name": "a", "type": "float", "direction": "out"}]}', "by-value", 1),
        (
            '{"entryPoint": "k", "parameters": [{"name": "a", "type": "float*", "direction": "sideways"}]}',
            "direction",
            1,
        ),
        (
            '{"entryPoint": "k", "parameters": [{"name": "a", "type": "int"},\n{"name": "a", "type": "int"}]}',
            "duplicate",
            2,
        ),
        ('{"entryPoint": "k", "parameters": [{"type": "int"}]}', "needs a non-empty 'name'", 1),
        ("[1, 2]", "must be a JSON object", 1),
    ],
)
def test_sidecar_errors_name_file_and_line(text: str, message: str, line: int | None) -> None:
    with pytest.raises(SidecarError) as info:
        parse_sidecar(text, file="k.json")
    err = info.value
    assert message in err.message
    assert err.file == "k.json" and err.line == line
    assert str(err).startswith("k.json" + (f":{line}" if line else ""))


def test_missing_sidecar_file(tmp_path: Path) -> None:
    with pytest.raises(SidecarError, match="not found") as info:
        load_sidecar(tmp_path / "nope.json")
    assert info.value.file.endswith("nope.json")


def test_sidecar_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "emit.json"
    path.write_text(VL_SIDECAR)
    assert load_sidecar(path).entry_point == "particles_emit"
    path.write_text(json.dumps({"entryPoint": "x", "parameters": [{"name": "n", "type": "uint"}]}))
    assert load_sidecar(path).parameters[0].direction == "in"
