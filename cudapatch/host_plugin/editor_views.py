"""What the node editor draws, as data: the views ``EditorModel`` builds of a patch (nodes, pins,
parameters, links, region and composite groups) and the results of its actions. Nothing here knows of
imgui or of the engine."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .code_errors import CodeError

__all__ = [
    "ActionResult",
    "GroupView",
    "InsideView",
    "LinkView",
    "NodeView",
    "ParamView",
    "PinView",
    "Rect",
    "groups_of",
    "param_view",
    "shown_state",
]

# Vector parameters drawn as colour pickers: named or described as a colour (ToPoints' Young and Old
# are its particles' colours by age).
_COLOUR = re.compile(r"colou?r|tint|rgb|^young$|^old$", re.I)


@dataclass(frozen=True)
class ActionResult:
    """What an action did: ``ok``, and a ``message`` (the reason when refused)."""

    ok: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class PinView:
    """A port of a node: ``direction`` ``in``/``out``, element type text (``float[]``)."""

    op: str
    name: str
    direction: str
    type: str
    description: str = ""


@dataclass(frozen=True)
class ParamView:
    """A parameter and the widget that edits it.

    Attributes:
        widget: ``slider`` (number with a range), ``drag`` (number without one), ``checkbox`` (0/1
            integer), ``enum`` (``choices``), ``color`` (3 or 4 floats), ``vector``, ``code``
            (``Code``: multi-line), ``text``.
        lanes: Components (1 for scalars).
        integer: Whole numbers only.
    """

    name: str
    widget: str
    value: Any
    minimum: float | None
    maximum: float | None
    lanes: int = 1
    integer: bool = False
    structural: bool = False
    description: str = ""
    choices: tuple[str | int, ...] = ()  # the enum's values (a text or integer parameter's); str() names them


@dataclass
class NodeView:
    """One operator as the editor draws it (state fields follow ``refresh``)."""

    name: str
    type: str
    doc: str
    position: tuple[float, float]
    inputs: tuple[PinView, ...]
    outputs: tuple[PinView, ...]
    params: tuple[ParamView, ...]
    bypassed: bool = False
    block_id: int = -1
    state: str = "OK"
    message: str = ""
    gpu_ms: float | None = None
    append: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Compile errors of the Code parameter, each at its line (and column where the compiler says).
    code_errors: tuple[CodeError, ...] = ()
    #: The diagnostics text ``code_errors`` were read from (``refresh``).
    code_source: str = ""
    #: The block generates its kernel's code (an Expression): ``EditorModel.generated_code`` shows it.
    generates: bool = False
    #: The region operator holding it (None: the top level).
    region: str | None = None
    #: ``if``, ``while`` or ``for`` for a region's own node, else "".
    kind: str = ""
    #: A loop's iterations in the newest completed frame and its limit (``Count``/``Max``), after ``refresh``.
    iterations: tuple[int, int] | None = None
    #: A composite's number of inner blocks (0: not a composite).
    inner: int = 0
    #: Inside a region's body: how often it ran in the frame its GPU time is from (None elsewhere).
    runs: int | None = None
    #: An inner node of an open composite: the path of the composite whose inside holds it (its group).
    composite: str | None = None
    #: An inner node's ports and parameters its composite exposes: inner name -> ``composite.Outer``.
    exposed: dict[str, str] = field(default_factory=dict)
    #: A composite drawn open (its inner blocks shown in a group with it).
    opened: bool = False
    #: A composite: where its inside is defined (its file's name, or its Python class).
    source: str = ""
    #: While one of its kernels compiles: a line saying so for the state's tooltip ("" otherwise).
    compiling: str = ""
    #: The engine's state of the block (``OK``, ``NotCompiled``, ``Warning``, ``Error``), which ``state``
    #: shows as ``Compiling`` while a compile is in flight (``shown_state``).
    block_state: str = "OK"


#: A rectangle in canvas units: ``(x0, y0, x1, y1)``.
Rect = tuple[float, float, float, float]


@dataclass(frozen=True)
class GroupView:
    """A region drawn as a group: its operator, kind, the operators it holds directly (nested regions
    among them), the region around it and how deep it is nested (0: at the top level)."""

    region: str
    kind: str
    members: tuple[str, ...]
    parent: str | None
    depth: int


@dataclass(frozen=True)
class InsideView:
    """What a composite holds, for a read-only look: inner blocks ``(name, type)``, inner links and
    exposed names ``(outer name, kind, "inner.port, ...")``."""

    op: str
    file: str | None
    blocks: tuple[tuple[str, str], ...]
    links: tuple[str, ...]
    exposed: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class LinkView:
    """A wire: its ends, element type, element count and bytes (None until the graph has the buffer)."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    type: str = ""
    count: int | None = None
    nbytes: int | None = None
    shape: str = ""  # "1080x1920" for 2-D/3-D data, "" for flat data or before the graph has it

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.src, self.src_port, self.dst, self.dst_port)

    @property
    def size_text(self) -> str:
        """Shape, element type and bytes, for the wire's tooltip (``float4 1080x1920, 33,177,600 bytes``)."""
        if self.count is None:
            return f"{self.type}  not built yet"
        dims = f" {self.shape}" if self.shape else ""
        return f"{self.type}{dims}  {self.count:,} elements, {self.nbytes:,} bytes"

    def __str__(self) -> str:
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"


#: The tooltip lines of ``shown_state``: a running block's edit, a first compile, a new version behind a
#: warning or an error.
COMPILING_EDIT = "compiling the edited kernel: the previous version runs until it is ready"
COMPILING_FIRST = "compiling its kernel: it runs once the compile is done"
COMPILING_AGAIN = "a new version of its kernel is compiling"


def shown_state(state: str, compiling: bool) -> tuple[str, str]:
    """The state a node shows and the line its state's tooltip adds, from the engine's state of the block
    (``OK``, ``NotCompiled``, ``Warning``, ``Error``) and whether one of its kernels is compiling.

    A compile in flight shows as ``Compiling`` where nothing worse is known: a block waiting for its first
    compile (``NotCompiled``), or a running block whose edited kernel compiles while the previous version
    runs (``OK``). A warning or an error says more and stays (an error's markers stay at their lines until
    the new compile lands); the tooltip line still says a new version is compiling."""
    if not compiling:
        return state, ""
    if state == "OK":
        return "Compiling", COMPILING_EDIT
    if state == "NotCompiled":
        return "Compiling", COMPILING_FIRST
    return state, COMPILING_AGAIN


def groups_of(views: dict[str, NodeView]) -> dict[str, GroupView]:
    """Every region of ``views`` as a group, outer ones first (then in the patch's order)."""
    members: dict[str, list[str]] = {op: [] for op, v in views.items() if v.kind}
    for op, v in views.items():
        if v.region in members:
            members[v.region].append(op)

    def depth(op: str) -> int:
        d, cur, seen = 0, views[op].region, {op}
        while cur is not None and cur in views and cur not in seen:
            seen.add(cur)
            d, cur = d + 1, views[cur].region
        return d

    groups = [GroupView(r, views[r].kind, tuple(m), views[r].region, depth(r)) for r, m in members.items()]
    return {g.region: g for g in sorted(groups, key=lambda g: g.depth)}


def param_view(spec: Any, value: Any) -> ParamView:
    """The view of a parameter: its value and the widget that edits it (picked from its type, range,
    choices and name)."""
    choices = tuple(getattr(spec, "choices", ()) or ())
    if spec.kind == "text":
        widget = "enum" if choices else "code" if spec.name == "Code" else "text"
        return ParamView(spec.name, widget, value, None, None, description=spec.description, choices=choices)
    dtype = spec.dtype
    integer = dtype.base.kind in "iu"
    lanes = dtype.lanes
    if choices:
        widget = "enum"
    elif lanes in (3, 4) and not integer and (_COLOUR.search(spec.name) or _COLOUR.search(spec.description)):
        widget = "color"
    elif lanes > 1:
        widget = "vector"
    elif integer and spec.minimum == 0 and spec.maximum == 1:
        widget = "checkbox"
    elif spec.minimum is not None and spec.maximum is not None:
        widget = "slider"
    else:
        widget = "drag"
    return ParamView(
        spec.name, widget, value, spec.minimum, spec.maximum, lanes, integer, spec.structural, spec.description, choices
    )
