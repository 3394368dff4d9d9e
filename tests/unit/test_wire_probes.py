"""The editor's probes on wires, driven without a mouse: a probe is placed on the output a wire leaves
(so the engine plans a probe node there), it is not an edit of the file, it follows a rename and goes
with a deleted operator, and its statistics are taken once per refresh."""

from __future__ import annotations

from types import SimpleNamespace

from cudapatch.engine.plan import ProbeNodePlan
from cudapatch.host_plugin.wire_probes import WireProbes

from .test_editor_model import _open


def _probe_nodes(adapter) -> list[tuple[int, str]]:
    adapter.engine.update()
    plan = adapter.engine.plan
    return [plan.probes[n.probe] for n in plan.nodes if isinstance(n, ProbeNodePlan)]


def test_probing_a_wire_plans_a_probe_node_on_its_output_and_writes_nothing(tmp_path):
    path, adapter, _, model = _open(tmp_path)
    before = path.read_text()
    assert model.probe("fill", "Out")
    assert ("fill", "Out") in model.probes and model.probes.latest[("fill", "Out")] is None
    assert _probe_nodes(adapter) == [(adapter.block("fill").id, "Out")]
    assert path.read_text() == before and not model.can_undo
    assert model.probe("fill", "Out")  # again: the same probe
    assert len(model.probes) == 1
    assert model.unprobe("fill", "Out") and not model.unprobe("fill", "Out")
    assert _probe_nodes(adapter) == []


def test_probing_refuses_unknown_operators_and_ports_with_the_reason(tmp_path):
    _, _, _, model = _open(tmp_path)
    assert not model.probe("nobody", "Out")
    result = model.probe("fill", "Nope")
    assert not result and "unknown port" in result.message
    assert len(model.probes) == 0


def test_a_probe_follows_a_rename_and_goes_with_a_deleted_operator(tmp_path):
    _, adapter, _, model = _open(tmp_path)
    model.probe("scale", "Out")
    assert model.rename("scale", "gain")
    assert ("gain", "Out") in model.probes and ("scale", "Out") not in model.probes
    assert _probe_nodes(adapter) == [(adapter.block("gain").id, "Out")]  # the same block, renamed
    assert model.delete("gain")
    model.nodes()
    assert len(model.probes) == 0


def test_refresh_takes_each_probes_newest_statistics_and_marks_bad_wires():
    stats = {"fill": SimpleNamespace(bad=False), "scale": SimpleNamespace(bad=True)}

    class Engine:
        def probe(self, block, port):
            return SimpleNamespace(stats=stats[block], close=lambda: None)

    adapter = SimpleNamespace(engine=Engine(), block=lambda op: op)
    probes = WireProbes(adapter)
    assert probes.add("fill", "Out") is None and probes.add("scale", "Out") is None
    assert not probes.bad("scale", "Out")  # nothing taken yet
    probes.refresh()
    assert probes.bad("scale", "Out") and not probes.bad("fill", "Out") and not probes.bad("add", "Out")
    probes.close()
    assert len(probes) == 0 and probes.latest == {}


def test_an_engine_without_probes_says_so():
    probes = WireProbes(SimpleNamespace(engine=object(), block=lambda op: op))
    assert not probes.available
    assert probes.add("fill", "Out") == "this engine has no probes"
