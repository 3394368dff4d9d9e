"""Upload and Download operators of a patch file, fed and read through the host adapter on a real GPU:
the standalone host (``cudapatch run``) builds the patch with the rings attached, and frame after frame
the values read back are the values written times the Scale's factor, a few frames later, with every
synchronizing driver call refused. (Without a GPU: tests/unit/test_adapter_transfer.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch.host_plugin.hosts.standalone import StandaloneHost

from .test_feedback_gpu import _refuse_synchronize

pytestmark = pytest.mark.gpu

N = 4096
FACTOR = np.float32(3.0)

PATCH = f"""\
links = ["mic.Out -> gain.In", "gain.Out -> tap.In"]

[operators.mic]
type = "core.Upload"
Count = {N}

[operators.gain]
type = "core.Scale"
Factor = {float(FACTOR)}

[operators.tap]
type = "core.Download"
Count = {N}
"""


def test_a_patch_files_upload_scale_download_round_trips_through_the_adapter_without_synchronizing(
    tmp_path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mic.toml"
    path.write_text(PATCH)
    with StandaloneHost(path) as host:
        adapter, engine = host.adapter, host.engine
        engine.wait_ready()
        assert not [d for d in engine.diagnostics() if d.severity == "error"]
        engine.update()  # the first frame: nothing written yet, the chain runs on what Out holds
        engine.synchronize()
        before = adapter.download("tap")  # that frame's values: given again until a newer frame completes
        assert before is not None
        _refuse_synchronize(monkeypatch)
        written: list[np.ndarray] = []  # the uploads that were published (a dropped one never is)
        seen: list[int] = []  # for each value read back: which upload it is
        for _ in range(20):
            values = rng.standard_normal(N).astype(np.float32)
            if adapter.upload("mic", values):
                written.append(values)
            engine.update()
            got = adapter.download("tap")  # plain loads: None, or a completed frame's values
            if not np.array_equal(got, before, equal_nan=True):  # (before: whatever Out held)
                match = [i for i, w in enumerate(written) if np.array_equal(got, w * FACTOR)]
                assert match, "a downloaded frame is no upload times the factor"
                seen.append(match[-1])
        monkeypatch.undo()
        engine.synchronize()
        assert seen and seen == sorted(seen)  # read back in order, a few frames after each was written
        assert len(written) >= 2
        last = rng.standard_normal(N).astype(np.float32)
        assert adapter.upload("mic", last)  # the GPU is idle: the slot is free
        engine.update()
        engine.synchronize()
        np.testing.assert_array_equal(adapter.download("tap"), last * FACTOR)
