"""Reading kernel signatures out of PTX text and checking them against a sidecar.

Only the parts needed for that are parsed: the ``.version``/``.target`` directives and each
``.entry`` with its ``.param`` list (scalar ``.u64``/``.u32``/``.f32``/... and ``.b8 name[N]`` structs).

PTX is user input, so parsing is linear in the text whatever it holds: comments are stripped in one
pass (``_text.strip_c_comments``), every anchored pattern starts at a line start without spanning
lines, each ``.entry`` is read once and the search goes on after its parameter list, numbers are
refused past 9 digits instead of reaching ``int()``'s 4,300-digit limit, and an entry may have at
most ``MAX_KERNEL_PARAMETERS`` parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PtxSignatureError
from ._text import MAX_KERNEL_PARAMETERS, LineIndex, strip_c_comments
from .descriptor import KernelDescriptor

__all__ = ["PtxParam", "PtxEntry", "PtxModuleInfo", "parse_ptx", "check_signature"]

_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")
# [ \t]* rather than \s*: \s spans newlines, and "^\s*" retried at every line start of a text of
# blank lines is quadratic.
_VERSION_RE = re.compile(r"^[ \t]*\.version[ \t]+(\d+)\.(\d+)", re.MULTILINE)
_TARGET_RE = re.compile(r"^[ \t]*\.target[ \t]+([\w, \t]+)", re.MULTILINE)
_MAX_DIGITS = 9
_MAX_DECL = 4096  # characters in one .param declaration (mangled names are long; a bound on the pattern's work)
_TYPE_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}
# After .ptr, the state space (.global ...) then an optional .align: "(?!align)" keeps the two apart, so
# a long list of qualifiers is matched once instead of tried at every split.
_PARAM_RE = re.compile(
    r"^\.param\s+(?:\.align\s+(\d+)\s+)?\.([busf])(8|16|32|64)\s+"
    r"(?:\.ptr\s+(?:\.(?!align\b)\w+\s+)*(?:\.align\s+\d+\s+)?)?"
    r"([A-Za-z_$][\w$]*)\s*(?:\[\s*(\d+)\s*\])?$"
)


@dataclass(frozen=True)
class PtxParam:
    """One ``.param`` of an entry: its PTX type, total size in bytes and alignment."""

    name: str
    ptx_type: str
    size: int
    align: int
    is_array: bool


@dataclass(frozen=True)
class PtxEntry:
    """A kernel entry point found in the PTX, with the line its ``.entry`` is on."""

    name: str
    params: tuple[PtxParam, ...]
    line: int


@dataclass(frozen=True)
class PtxModuleInfo:
    """What the PTX says about itself: ISA version, target and entries by name."""

    version: tuple[int, int] | None
    target: str | None
    entries: dict[str, PtxEntry]


def _number(text: str, what: str, *, file: str, line: int | None, kernel: str | None = None) -> int:
    if len(text) > _MAX_DIGITS:
        raise PtxSignatureError(
            f"{what} has {len(text)} digits (at most {_MAX_DIGITS} are read)", file=file, line=line, kernel=kernel
        )
    return int(text)


def parse_ptx(text: str, *, file: str = "<ptx>") -> PtxModuleInfo:
    """Parse the directives and entry signatures of a PTX module, in time linear in ``text``.

    Raises:
        PtxSignatureError: an ``.entry`` whose parameter list cannot be parsed, a comment never closed,
            a number too long, an entry with too many parameters (names file and line).
    """
    clean, unclosed = strip_c_comments(text)
    lines = LineIndex(clean)
    if unclosed is not None:
        raise PtxSignatureError("a /* comment is never closed", file=file, line=LineIndex(text).line(unclosed))
    v = _VERSION_RE.search(clean)
    t = _TARGET_RE.search(clean)
    version = None
    if v is not None:
        vline = lines.line(v.start())
        version = (
            _number(v.group(1), ".version", file=file, line=vline),
            _number(v.group(2), ".version", file=file, line=vline),
        )
    entries: dict[str, PtxEntry] = {}
    pos = 0
    while True:
        m = _ENTRY_RE.search(clean, pos)
        if m is None:
            break
        name = m.group(1)
        line = lines.line(m.start())
        close = clean.find(")", m.end())
        if close < 0:
            raise PtxSignatureError(f"unterminated parameter list of .entry {name}", file=file, line=line, kernel=name)
        pos = close + 1  # the next entry starts after this one's parameters: each character is read once
        body = clean[m.end() : close].strip()
        params: list[PtxParam] = []
        if body:
            decls = body.split(",")
            if len(decls) > MAX_KERNEL_PARAMETERS:
                raise PtxSignatureError(
                    f".entry {name} has {len(decls)} parameters: a kernel may have at most {MAX_KERNEL_PARAMETERS}",
                    file=file,
                    line=line,
                    kernel=name,
                )
            for decl in decls:
                decl = " ".join(decl.split())
                pm = _PARAM_RE.match(decl) if len(decl) <= _MAX_DECL else None
                if pm is None:
                    shown = decl if len(decl) <= 80 else decl[:70] + "…"
                    raise PtxSignatureError(
                        f"cannot parse parameter declaration '{shown}' of .entry {name}",
                        file=file,
                        line=line,
                        kernel=name,
                    )
                align_s, kind, bits, pname, count_s = pm.groups()
                elem = _TYPE_SIZES[bits]
                count = _number(count_s, "an array size", file=file, line=line, kernel=name) if count_s else 1
                align = _number(align_s, "an alignment", file=file, line=line, kernel=name) if align_s else elem
                params.append(
                    PtxParam(
                        name=pname,
                        ptx_type=f"{kind}{bits}",
                        size=elem * count,
                        align=align,
                        is_array=count_s is not None,
                    )
                )
        entries[name] = PtxEntry(name=name, params=tuple(params), line=line)
    return PtxModuleInfo(
        version=version,
        target=" ".join(t.group(1).split()) if t else None,
        entries=entries,
    )


def check_signature(info: PtxModuleInfo, desc: KernelDescriptor, *, file: str = "<ptx>", sidecar: str = "") -> PtxEntry:
    """Check that the PTX has ``desc.entry_point`` with the sidecar's parameter count and sizes.

    Returns:
        The matching entry.

    Raises:
        PtxSignatureError: missing entry, count or size mismatch (names the parameter and both files).
    """
    entry = info.entries.get(desc.entry_point)
    side = f" (sidecar {sidecar})" if sidecar else ""
    if entry is None:
        found = ", ".join(sorted(info.entries)) or "none"
        raise PtxSignatureError(
            f"entry point '{desc.entry_point}' of the sidecar{side} is not in the PTX (entries found: {found})",
            file=file,
            kernel=desc.entry_point,
        )
    slots = desc.slots
    if len(entry.params) != len(slots):
        raise PtxSignatureError(
            f"the PTX entry has {len(entry.params)} parameters but the sidecar{side} declares {len(slots)}",
            file=file,
            line=entry.line,
            kernel=desc.entry_point,
        )
    for i, (pp, slot) in enumerate(zip(entry.params, slots, strict=True)):
        if pp.size != slot.size:
            dp = desc.parameters[slot.param]
            what = dp.type_name if slot.role == "value" else f"{dp.type_name} {slot.role}"
            raise PtxSignatureError(
                f"parameter {i} ('{dp.name}': {what}, {slot.size} bytes) does not match the PTX's "
                f"'{pp.name}' (.{pp.ptx_type}{'[]' if pp.is_array else ''}, {pp.size} bytes){side}",
                file=file,
                line=entry.line,
                kernel=desc.entry_point,
            )
    return entry
