"""The seams between layers: the protocols blocks are written against (``BlockHost``, ``LibraryScope``)
and the small public methods that replaced reach-ins into other classes' private fields."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import cudapatch
from cudapatch.blocks import Block, BlockBuilder, BlockHost, LibraryScope, Scale
from cudapatch.blocks.description import BlockDescription, like
from cudapatch.blocks.library.linalg import GEMM
from cudapatch.blocks.parameter import BlockParameter
from cudapatch.engine import BufferPool, Context
from cudapatch.engine.libraries import CallLibraryScope
from cudapatch.errors import CudapatchError, PluginError
from cudapatch.host_plugin import HostAdapter
from cudapatch.host_plugin.registry import BlockTypeRegistry
from cudapatch.kernels import CudaSource, bundled_kernel

from .plan_engine import PlanOnlyEngine


def _protocol_members(proto: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(proto).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


@pytest.mark.parametrize(("proto", "impl"), [(BlockHost, Context), (LibraryScope, CallLibraryScope)])
def test_the_engine_implements_the_protocols_member_by_member(proto: type, impl: type) -> None:
    # Structural typing is checked by no one at run time: compare every member's kind and signature,
    # so a renamed argument or a method the engine lacks fails here rather than inside a plugin.
    members = _protocol_members(proto)
    assert members
    for name, want in members.items():
        have = inspect.getattr_static(impl, name, None)
        assert have is not None, f"{impl.__name__} lacks {name}"
        if isinstance(want, property):
            assert isinstance(have, property), f"{impl.__name__}.{name} must be a property"
            continue
        assert inspect.signature(have) == inspect.signature(want), f"{impl.__name__}.{name}"


def test_the_protocols_are_exported_for_plugin_authors() -> None:
    assert cudapatch.LibraryScope is LibraryScope and "LibraryScope" in cudapatch.__all__
    assert "BlockHost" in cudapatch.blocks.__all__ and "LibraryScope" in cudapatch.blocks.__all__


class RecordingHost:
    """A BlockHost that is not an engine: what a block tells its host, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def param_listener(self, block: Block) -> Any:
        def listener(param: BlockParameter) -> None:
            self.events.append(("param", block.name, param.name, param.value))

        return listener

    def on_description_changed(self, block: Block, old: BlockDescription) -> None:
        self.events.append(("described", block.name, old is not block.description))

    def on_code_changed(self, block: Block, kernel: int, new_source: Any = None) -> None:
        self.events.append(("code", block.name, kernel))

    def on_enabled_changed(self, block: Block) -> None:
        self.events.append(("enabled", block.name, block.enabled))

    def on_snapshot_stale(self, block: Block) -> None:
        self.events.append(("stale", block.name))

    def unregister_block(self, block: Block) -> None:
        self.events.append(("unregister", block.name))
        block.detach(self)


class Labelled(Block):
    """Scale whose text parameter sets Offset's default: editing the text changes the description."""

    type_name = "Labelled"

    def describe(self, b: BlockBuilder) -> None:
        label = b.text("Label", default="")
        k = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Factor", k.in_(2), default=1.0)
        b.scalar("Offset", k.in_(3), default=float(len(label)))
        k.auto_grid(like("In"), count_param=4)


def test_a_block_reports_to_any_host_through_the_protocol() -> None:
    host: BlockHost = RecordingHost()
    s = Labelled(name="s")
    s.set("Factor", 2.0)  # not attached: nobody hears it
    s.attach(host)
    assert s.context is host
    s.attach(host)  # again: nothing changes, no second subscription
    s.set("Factor", 3.0)
    s.set("Label", "abc")  # a text edit re-describes the block
    assert s.description.param("Offset").default == 3.0
    assert s.get("Factor") == 3.0 and s.get("Offset") == 0.0  # the user's values survive the re-description
    s.set("Offset", 4.0)  # the new parameter objects report to the same host
    s.name = "t"  # a rename (the host adapter's): what the host froze of the block is stale
    s.close()
    s.set("Factor", 5.0)  # detached: silent again
    s.name = "u"
    assert host.events == [  # type: ignore[attr-defined]
        ("param", "s", "Factor", 3.0),
        ("stale", "s"),  # the new description, assigned before the host hears why
        ("described", "s", True),
        ("param", "s", "Offset", 4.0),
        ("stale", "t"),
        ("unregister", "t"),
    ]
    assert s.context is None


def test_a_block_belongs_to_one_host_at_a_time() -> None:
    s, first, second = Labelled(name="s"), RecordingHost(), RecordingHost()
    s.attach(first)
    with pytest.raises(CudapatchError, match="another engine"):
        s.attach(second)
    s.detach(second)  # not its host: ignored
    assert s.context is first
    s.detach(first)
    s.attach(second)
    assert s.context is second


def test_context_attaches_and_detaches_blocks() -> None:
    c = Context()
    s = Scale(name="s")
    c.register_block(s)
    c.dirty.clear_structure()
    assert s.context is c
    s.set("Factor", 2.0)
    assert set(c.dirty.params) == {(s.id, "Factor")}
    s.debug.message = "compiled"
    c.unregister_block(s)
    c.dirty.params.clear()
    s.set("Factor", 3.0)
    assert s.context is None and not c.dirty.params and s.debug.message == ""
    with pytest.raises(CudapatchError, match="another engine"):
        other = Context()
        other.register_block(s)
        c.register_block(s)


def test_context_takes_its_code_listener_at_construction() -> None:
    heard: list[tuple[int, int]] = []
    took = True

    def listener(key: tuple[int, int]) -> bool:
        heard.append(key)
        return took

    c = Context(code_listener=listener)
    s = Scale(name="s")
    c.register_block(s)
    c.on_code_changed(s, 0)
    assert heard == [(s.id, 0)] and not c.dirty.code  # taken at the edit: nothing left for the frame
    took = False
    c.on_code_changed(s, 0)
    assert c.dirty.code == {(s.id, 0)}
    assert c.code_listener is listener
    with pytest.raises(AttributeError):
        c.code_listener = listener  # type: ignore[misc]  # wired at construction only


def test_replace_kernel_source_is_the_blocks_own_edit() -> None:
    s = Scale(name="s")
    same = CudaSource(path=bundled_kernel("scale").ptx_path.with_suffix(".cu"))
    old = s.description
    assert s.replace_kernel_source(0, same) is True
    assert s.description.kernels[0].source == same and s.description.inputs == old.inputs
    with pytest.raises(CudapatchError, match="another signature"):
        s.replace_kernel_source(0, CudaSource(path=bundled_kernel("fill").ptx_path.with_suffix(".cu")))
    with pytest.raises(CudapatchError, match="no kernel 2"):
        s.replace_kernel_source(2, same)
    with pytest.raises(CudapatchError, match="captured library call"):
        GEMM(name="g").replace_kernel_source(0, same)


def test_builder_error_names_the_block() -> None:
    err = BlockBuilder("T", "blk").error("Kind must be C2C")
    assert isinstance(err, CudapatchError) and err.block == "blk" and "Kind must be C2C" in str(err)


def test_registering_rolls_back_a_failing_plugin() -> None:
    registry = BlockTypeRegistry()
    with registry.registering("good"):
        good = registry.add(Scale, name="good.Scale")
    with pytest.raises(RuntimeError), registry.registering("bad"):
        registry.add(Labelled, name="bad.Labelled")
        raise RuntimeError("plugin bug")
    assert good.origin == "good" and list(registry) == [good] and registry.current_origin == "?"
    with registry.registering("late"), pytest.raises(PluginError, match="already registered by plugin 'good'"):
        registry.add(Scale, name="good.Scale")


def test_adapter_maps_blocks_to_operators() -> None:
    registry = BlockTypeRegistry()
    registry.add(Scale, name="core.Scale")
    adapter = HostAdapter(PlanOnlyEngine(), registry)
    a = adapter.create("a", "core.Scale")
    b = adapter.create("b", "core.Scale")
    adapter.rename("a", "first")
    assert adapter.operators_by_block() == {a.id: "first", b.id: "b"}


def test_buffer_pool_make_current_calls_the_engines_function() -> None:
    calls: list[int] = []
    BufferPool(lambda: calls.append(1)).make_current()
    BufferPool().make_current()  # without one: nothing to do
    assert calls == [1]


def test_no_module_wires_a_callback_into_another_object_after_construction() -> None:
    """Collaborators and callbacks are passed in constructors: nothing outside a class assigns one of
    its ``on_*`` attributes (``graph.on_generalize = ...`` after the graph was made)."""
    import ast
    from pathlib import Path

    import cudapatch

    root = Path(cudapatch.__file__).parent
    wired = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr.startswith("on_"):
                    if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                        wired.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(t)}")
    assert not wired, wired
