"""Reading kernel signatures out of PTX text and checking them against a sidecar.

Only the parts needed for that are parsed: the ``.version``/``.target`` directives and each
``.entry`` with its ``.param`` list (scalar ``.u64``/``.u32``/``.f32``/... and ``.b8 name[N]`` structs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PtxSignatureError
from .descriptor import KernelDescriptor

__all__ = ["PtxParam", "PtxEntry", "PtxModuleInfo", "parse_ptx", "check_signature"]

_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(", re.MULTILINE)
_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_TARGET_RE = re.compile(r"^\s*\.target\s+([\w, ]+)", re.MULTILINE)
_TYPE_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}
_PARAM_RE = re.compile(
    r"^\.param\s+(?:\.align\s+(\d+)\s+)?\.([busf])(8|16|32|64)\s+(?:\.ptr\s+(?:\.\w+\s+)*?(?:\.align\s+\d+\s+)?)?"
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


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", text)


def parse_ptx(text: str, *, file: str = "<ptx>") -> PtxModuleInfo:
    """Parse the directives and entry signatures of a PTX module.

    Raises:
        PtxSignatureError: an ``.entry`` whose parameter list cannot be parsed (names file and line).
    """
    clean = _strip_comments(text)
    v = _VERSION_RE.search(clean)
    t = _TARGET_RE.search(clean)
    entries: dict[str, PtxEntry] = {}
    for m in _ENTRY_RE.finditer(clean):
        name = m.group(1)
        line = clean.count("\n", 0, m.start()) + 1
        close = clean.find(")", m.end())
        if close < 0:
            raise PtxSignatureError(f"unterminated parameter list of .entry {name}", file=file, line=line, kernel=name)
        body = clean[m.end() : close].strip()
        params: list[PtxParam] = []
        if body:
            for decl in body.split(","):
                decl = " ".join(decl.split())
                pm = _PARAM_RE.match(decl)
                if pm is None:
                    raise PtxSignatureError(
                        f"cannot parse parameter declaration '{decl}' of .entry {name}",
                        file=file,
                        line=line,
                        kernel=name,
                    )
                align_s, kind, bits, pname, count_s = pm.groups()
                elem = _TYPE_SIZES[bits]
                count = int(count_s) if count_s else 1
                params.append(
                    PtxParam(
                        name=pname,
                        ptx_type=f"{kind}{bits}",
                        size=elem * count,
                        align=int(align_s) if align_s else elem,
                        is_array=count_s is not None,
                    )
                )
        entries[name] = PtxEntry(name=name, params=tuple(params), line=line)
    return PtxModuleInfo(
        version=(int(v.group(1)), int(v.group(2))) if v else None,
        target=t.group(1).strip() if t else None,
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
