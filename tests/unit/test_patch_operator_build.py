"""``build_operator``: one way a patch file and a composite file build an operator (texts to the
constructor, the other values set), so both point at the line of a parameter the block lacks."""

from __future__ import annotations

import pytest

from cudapatch.errors import PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry

WILD_CODE = (
    'extern "C" __global__ void wild(const float* In, float* Out, float Arm, unsigned int n)\n'
    "{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) Out[i] = In[i] * Arm; }\n"
)


def test_a_kernel_file_found_on_the_search_paths_reports_an_unknown_parameter_at_its_line(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "wild.cu").write_text(WILD_CODE)
    # not next to the patch: parsing cannot describe the block, applying finds it on the search paths
    text = '[operators.w]\ntype = "core.KernelFile"\nPath = "wild.cu"\nArm = 2.0\nNope = 1\n'
    patch = parse_patch(text, path=tmp_path / "p.toml", registry=REG)
    adapter = HostAdapter(PlanOnlyEngine(), REG, search_paths=[lib])
    with pytest.raises(PatchFileError, match="has no parameter 'Nope'") as exc:
        apply_patch(adapter, patch)
    assert exc.value.line == 5 and exc.value.param == "Nope"
    assert "w" not in adapter.operators()  # validated before anything changed
    apply_patch(adapter, parse_patch(text.replace("Nope = 1\n", ""), path=tmp_path / "p.toml", registry=REG))
    assert adapter.block("w").params["Arm"].value == 2.0
