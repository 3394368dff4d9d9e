"""Plugins, the block type registry, the HostAdapter at plan level, host value coercion and the CLI."""

from __future__ import annotations

import pytest

from cudapatch import Block, BlockBuilder, like
from cudapatch.blocks.library import Scale
from cudapatch.errors import CudapatchError, LinkError, ParameterError, PluginError
from cudapatch.host_plugin import HostAdapter, PluginHost, hookimpl, make_plugin_manager
from cudapatch.host_plugin.coerce import coerce_host_value
from cudapatch.kernels.source import bundled_kernel

from .plan_engine import PlanOnlyEngine


class Doubler(Block):
    """Doubles its input (a third-party block)."""

    type_name = "Doubler"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Factor", k.in_(2), default=2.0)
        b.scalar("Offset", k.in_(3), default=0.0)
        k.auto_grid(like("In"), count_param=4)


class GoodPlugin:
    @hookimpl
    def cudapatch_register_blocks(self, registry):
        registry.add(Doubler, name="thirdparty.Doubler", version="1.2")


class FaultyPlugin:
    @hookimpl
    def cudapatch_register_blocks(self, registry):
        registry.add(Doubler, name="faulty.First")  # registered, then the plugin fails: all skipped
        raise RuntimeError("plugin bug")


class ClashingPlugin:
    @hookimpl
    def cudapatch_register_blocks(self, registry):
        registry.add(Scale, name="core.Scale")


class MisspelledPlugin:
    @hookimpl
    def cudapatch_register_block(self, registry):  # not a hook: refused by check_pending
        pass


def _host(*plugins) -> PluginHost:
    return PluginHost(make_plugin_manager(entry_points=False, disabled=(), plugins=plugins))


def test_builtins_and_a_plugin_register_qualified_types():
    host = _host(("good", GoodPlugin()))
    reg = host.registry
    assert "particles.Emitter" in reg and "core.Scale" in reg
    bt = reg.get("thirdparty.Doubler")
    assert bt.version == "1.2" and bt.origin == "good" and bt.doc.startswith("Doubles")
    assert ("in", "In", "float[]") in bt.ports and ("Factor", "float", 2.0) in bt.params
    assert reg.get("Doubler") is bt  # unqualified when unique
    with pytest.raises(CudapatchError, match="unknown block type 'Nope'"):
        reg.get("Nope")
    assert not host.errors


def test_a_faulty_plugin_is_reported_and_skipped_the_others_load():
    host = _host(("faulty", FaultyPlugin()), ("good", GoodPlugin()))
    reg = host.registry
    assert "thirdparty.Doubler" in reg and "core.Emitter" not in reg
    assert "faulty.First" not in reg  # nothing of the faulty plugin stays
    (err,) = host.errors
    assert isinstance(err, PluginError) and "plugin 'faulty'" in str(err) and "plugin bug" in str(err)


def test_duplicate_type_names_are_refused_naming_both_plugins():
    host = _host(("clash", ClashingPlugin()))
    host.registry  # noqa: B018 - collecting the types is the action under test
    (err,) = host.errors
    assert "core.Scale" in str(err) and "'clash'" in str(err) and "cudapatch.builtins" in str(err)


def test_unknown_hook_names_are_refused():
    with pytest.raises(PluginError, match="misspelled"):
        make_plugin_manager(entry_points=False, disabled=(), plugins=(("misspelled", MisspelledPlugin()),))


def test_blocked_plugins_do_not_load(monkeypatch):
    monkeypatch.setenv("CUDAPATCH_DISABLE_PLUGINS", "good, other")
    pm = make_plugin_manager(entry_points=False, plugins=(("good", GoodPlugin()),))
    host = PluginHost(pm)
    assert "thirdparty.Doubler" not in host.registry and "core.Scale" in host.registry


@pytest.fixture
def adapter():
    return HostAdapter(PlanOnlyEngine(), _host(("good", GoodPlugin())).registry)


def test_adapter_create_link_param_and_cook(adapter):
    adapter.create("fill", "core.Fill", {"Count": "256", "Value": 0.5})
    adapter.create("dbl", "thirdparty.Doubler", {"Factor": "3"})
    adapter.connect("fill", "Out", "dbl", "In")
    eo = adapter.engine_operator
    eo.cook()
    plan = adapter.engine.plan
    assert len(plan.block_order) == 2
    fill, dbl = adapter.block("fill"), adapter.block("dbl")
    assert fill.params["Count"].value == 256 and dbl.params["Factor"].value == 3.0
    assert plan.buffers[plan.outputs[(dbl.id, "Out")]].count == 256
    adapter.set_param("dbl", "Factor", "0.25")  # a TD string field
    assert dbl.params["Factor"].value == 0.25
    assert adapter.operators() == {"fill": "core.Fill", "dbl": "thirdparty.Doubler"}
    assert "dbl" in adapter.tooltip("dbl")


def test_adapter_bad_input_is_precise_and_keeps_the_old_state(adapter):
    adapter.create("a", "core.Fill")
    with pytest.raises(CudapatchError, match="unknown block type 'core.Nope'"):
        adapter.create("b", "core.Nope")
    with pytest.raises(CudapatchError, match="already exists"):
        adapter.create("a", "core.Fill")
    with pytest.raises(ParameterError, match="unknown parameter.*Count, Value") as exc:
        adapter.set_param("a", "Gain", 1.0)
    assert exc.value.block == "a" and exc.value.param == "Gain"
    adapter.set_param("a", "Value", 2.0)
    with pytest.raises(ParameterError):
        adapter.set_param("a", "Value", "not a number")
    with pytest.raises(ParameterError):
        adapter.set_param("a", "Count", -5)  # out of range
    assert adapter.block("a").params["Value"].value == 2.0 and adapter.block("a").params["Count"].value == 1024
    with pytest.raises(CudapatchError, match="unknown operator 'zz'"):
        adapter.set_param("zz", "Value", 1.0)
    adapter.create("s", "core.Scale")
    with pytest.raises(LinkError, match="Nope"):
        adapter.connect("a", "Nope", "s", "In")
    with pytest.raises(LinkError, match="unknown operator 'ghost'"):
        adapter.connect("ghost", "Out", "s", "In")
    adapter.create("s2", "core.Scale")
    adapter.connect("s", "Out", "s2", "In")
    with pytest.raises(LinkError, match="cycle"):
        adapter.connect("s2", "Out", "s", "In")
    assert len(adapter.links()) == 1


def test_adapter_hot_swap_keeps_links_and_values(adapter):
    adapter.create("fill", "core.Fill", {"Count": 64})
    adapter.create("op", "core.Scale", {"Factor": 5.0, "Offset": 1.0})
    adapter.create("sink", "core.Scale")
    adapter.connect("fill", "Out", "op", "In")
    adapter.connect("op", "Out", "sink", "In")
    new = adapter.hot_swap("op", "thirdparty.Doubler")
    assert adapter.operators()["op"] == "thirdparty.Doubler"
    assert new.params["Factor"].value == 5.0 and new.params["Offset"].value == 1.0  # values kept
    both = {"fill.Out -> op.In", "op.Out -> sink.In"}
    assert {str(lk) for lk in adapter.links()} == both  # the port names match: links restored
    adapter.hot_swap("op", "core.Fill")  # no input: that link is dropped, the output link stays
    assert {str(lk) for lk in adapter.links()} == {"op.Out -> sink.In"}
    adapter.hot_swap("op", "core.Scale")
    adapter.connect("fill", "Out", "op", "In")
    code = 'extern "C" __global__ void k(const float* In, float* Out, float gain, unsigned int n) {}'
    custom = adapter.hot_swap("op", code)
    assert adapter.operators()["op"] == "core.CustomKernel" and custom.params["Code"].value == code
    adapter.engine.update()
    assert adapter.engine.plan is not None and not adapter.engine.errors
    adapter.rename("op", "renamed")
    assert all("op" not in (lk.src, lk.dst) for lk in adapter.links())
    adapter.delete("renamed")
    assert "renamed" not in adapter.operators() and all("renamed" not in (lk.src, lk.dst) for lk in adapter.links())


def test_adapter_structure_edits_hold_the_frame_guard_while_they_run(adapter, monkeypatch):
    """A build in flight waits at its checkpoints while the host's edit call runs (``_frame_first``):
    the guard is the calling thread's during the call, once for nested edits (a hot swap deletes
    and links), and free after it, raised or not."""
    import threading

    from cudapatch.kernels.pacing import FRAME_GUARD

    me, seen = threading.get_ident(), []
    engine = adapter.engine
    for name in ("add", "connect", "remove"):
        original = getattr(engine, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            seen.append((_name, FRAME_GUARD.owner == me))
            return _original(*args, **kwargs)

        monkeypatch.setattr(engine, name, spy)
    adapter.create("fill", "core.Fill", {"Count": 64})
    adapter.create("op", "core.Scale")
    adapter.connect("fill", "Out", "op", "In")
    assert FRAME_GUARD.owner == 0
    adapter.hot_swap("op", "thirdparty.Doubler")  # remove, add, connect inside one call
    assert FRAME_GUARD.owner == 0
    adapter.delete("op")
    assert [n for n, _ in seen] == ["add", "add", "connect", "remove", "add", "connect", "remove"]
    assert all(held for _, held in seen)
    with pytest.raises(LinkError):
        adapter.connect("fill", "Out", "nobody", "In")
    assert FRAME_GUARD.owner == 0 and FRAME_GUARD.enter()  # free: a frame takes it
    FRAME_GUARD.leave()


def test_host_value_coercion():
    from cudapatch.blocks.library import Emitter

    d = Emitter().description
    assert coerce_host_value(d.param("Rate"), "1.5e3") == 1500.0
    assert coerce_host_value(d.param("Capacity"), "4096") == 4096
    assert coerce_host_value(d.param("Capacity"), 4096.0) == 4096
    assert coerce_host_value(d.param("Capacity"), "On") == 1
    assert coerce_host_value(d.param("Origin"), "1 2 3") == (1.0, 2.0, 3.0)
    assert coerce_host_value(d.param("Origin"), "(1, 2, 3)") == (1.0, 2.0, 3.0)
    assert coerce_host_value(d.param("Origin"), [0, 1, 0]) == (0, 1, 0)
    assert coerce_host_value(d.param("Rate"), True) == 1.0
    assert coerce_host_value(d.param("Rate"), "fast") == "fast"  # left for the parameter's precise error
    e = Emitter()
    with pytest.raises(ParameterError, match="Rate"):
        e.set("Rate", coerce_host_value(d.param("Rate"), "fast"))


def test_plain_numbers_take_the_fast_path_to_what_the_general_path_gives():
    """Floats and ints for scalar number parameters skip the general checks (a slider's value, every
    frame): the value and its type are what the general path gives (subclasses go the general way)."""
    from cudapatch.blocks.library import Emitter, Fill

    class SlowFloat(float):
        pass

    class SlowInt(int):
        pass

    specs = [
        spec
        for block in (Emitter(), Scale(), Fill())
        for spec in block.description.params
        if spec.kind != "text" and not spec.choices and spec.dtype is not None and spec.dtype.lanes == 1
    ]
    assert {s.dtype.base.kind for s in specs} >= {"f", "u"} or {s.dtype.base.kind for s in specs} >= {"f", "i"}
    for spec in specs:
        for value in (0.0, 2.0, 2.5, -3.0, 1e30):
            fast, slow = coerce_host_value(spec, value), coerce_host_value(spec, SlowFloat(value))
            assert fast == slow and type(fast) is (int if isinstance(slow, int) else float), (spec.name, value)
        for value in (7, -1, 0):
            fast, slow = coerce_host_value(spec, value), coerce_host_value(spec, SlowInt(value))
            assert fast == slow and type(fast) is int, (spec.name, value)


def test_cli_blocks_and_check(capsys):
    from cudapatch.cli import main

    assert main(["blocks"]) == 0
    out = capsys.readouterr().out
    assert "particles.Emitter" in out and "in  Particles: float4[]" in out and "par Rate: float" in out
    main(["check"])
    out = capsys.readouterr().out
    for name in ("python", "cuda-bindings", "driver", "nvrtc", "cupy", "pyopengl", "display"):
        assert name in out
    with pytest.raises(SystemExit):
        main(["run", "--frames", "0"])


def test_cli_run_reports_a_bad_patch_before_touching_the_gpu(tmp_path, capsys):
    from cudapatch.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text('[operators.a]\ntype = "core.Nope"\n')
    assert main(["run", "--headless", "--frames", "1", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "core.Nope" in err
