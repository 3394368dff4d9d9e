"""A seeded mutation fuzzer over cudapatch's file loaders: sidecar JSON, PTX, patch TOML, ``.cu``
files (and CustomKernel Code), and cubin cache entries.

Each case starts from a valid file of its loader, applies one to four mutations (byte flips,
truncation, deletion, duplication of a slice, splicing, insertion of inputs known to break parsers:
invalid UTF-8, NUL bytes, deep nesting, huge integers, unclosed comments, loader keywords ...) and
runs the loader the way cudapatch runs it. One case in ``SPECIAL_RATE`` also puts a non-regular
file where the loader (or a ``.cu``'s ``#include``) expects a file: a FIFO, a symlink to one or to
``/dev/zero``, a directory. A case fails when anything but a ``CudapatchError`` escapes, when a
``CudapatchError`` does not name one of the case's files, or when it takes longer than the time
bound (a read blocked on a FIFO never returns: the bound is what a hang looks like, so run the
fuzzer under a timeout). Case ``i`` of loader ``L`` under seed ``S`` is generated from
``random.Random(f"{S}:{L}:{i}")`` alone, so any case can be replayed by itself.

Used by ``tests/unit/test_fuzz_loaders.py`` (1,000 cases per loader in CI) and by
``tools/fuzz_loaders.py`` (as many as asked, nightly).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cudapatch.blocks.library.custom import CustomKernel, KernelFile
from cudapatch.errors import CudapatchError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch
from cudapatch.host_plugin.hosts.standalone import demo_patch_text
from cudapatch.kernels import BUNDLED_KERNEL_DIR, CudaSource, PtxFileSource
from cudapatch.kernels.cache import CubinCache, cache_key
from cudapatch.kernels.descriptor import load_sidecar

from .plan_engine import PlanOnlyEngine

__all__ = ["LOADERS", "Case", "FuzzReport", "fuzz", "make_case", "run_case"]

REGISTRY = PluginHost().registry

# Inputs that broke (or could break) a parser: each is inserted whole somewhere in a file.
BAD_INPUTS: tuple[bytes, ...] = (
    b"\xe9",  # Latin-1 e-acute
    b"\xff\xfe",
    b"\xc3",  # a cut UTF-8 sequence
    b"\xed\xa0\x80",  # an encoded surrogate
    b"\x00",
    b"\\u0000",
    b"\r",
    b"\n" * 2000,
    b" " * 5000,
    b"[" * 2000,
    b"{" * 2000,
    b'{"a":' * 1000,
    b"a = [" * 300,
    b"9" * 5000,
    b"-" + b"9" * 4400,
    b"0x" + b"f" * 3000,
    b"1e" + b"9" * 400,
    b"/*",
    b"*/",
    b"//",
    b"/*a\n" * 2000,
    b"/* x " * 2000,
    b"/* x */" * 2000,
    b"(" * 2000,
    b")",
    b'"',
    b"'''",
    b'"""',
    b"\\",
    b",",
    b"inf",
    b"nan",
    b"true",
    b"-1",
    b"1979-05-27T07:32:00Z",
    b"a" * 300,
)

# Words of each format, inserted to reach deeper into its checks.
KEYWORDS: dict[str, tuple[bytes, ...]] = {
    "sidecar": (
        b'"entryPoint"',
        b'"blockSize": -5',
        b'"sharedMemoryBytes": 99999999',
        b'"parameters": []',
        b'{"name": "x", "type": "float*"}, ',
        b'{"name": "1 x", "type": "uint"}, ',
        b'"isPointer": false',
        b'"direction": "inout"',
        b'"type": "float3"',
        b'"type": "double*"',
        b"null",
        b"[]",
        b"{}",
    ),
    "ptx": (
        b".entry ",
        b".visible .entry k(",
        b".param .u64 p,",
        b".param .align 8 .b8 s[12]",
        b".param .u64 .ptr .global .align 4 p",
        b".version 9.0\n",
        b".version 99999999999.0\n",
        b".target sm_90\n",
        b"{ ret; }",
    ),
    "patch": (
        b"[operators.x]\n",
        b'type = "core.Fill"\n',
        b'type = "core.CustomKernel"\n',
        b'type = "core.KernelFile"\nPath = "k.cu"\n',
        b'Path = "k\\u0000.cu"\n',
        b"[engine]\ndevice = [0]\n",
        b'[engine]\nprofiling = "DeepSync"\n',
        b"[preview]\nsize = [-1, 5]\n",
        b'links = ["a.Out -> b.In"]\n',
        b'Code = """extern "C" __global__ void f(float* o) {}"""\n',
        b"Count = 99999999999\n",
        b"Value = [1, 2, 3, 4, 5]\n",
        b"Value = {a = 1}\n",
        b'Count = "0x' + b"f" * 40 + b'"\n',
        b"Count = 1979-05-27\n",
        b"Gravity = [[1], [2], [3]]\n",
        b'Path = "/dev/zero"\n',
        b'Path = "."\n',
        b'Path = "' + b"a/" * 2100 + b'k.cu"\n',
        b'[operators.""]\n',
        b"[[operators]]\n",
        b"=",
        b"\n[",
    ),
    "cu": (
        b'extern "C" __global__ void k2(float* o, unsigned n) {}\n',
        b"__global__ void ",
        b"__launch_bounds__(256) ",
        b"// cudapatch: blockSize=-5\n",
        b"// cudapatch: sharedMemoryBytes=-1\n",
        b"// cudapatch: blockSize=" + b"9" * 5000 + b"\n",
        b"// cudapatch: description=" + b" " * 3000 + b"x\n",
        b"/*inout*/ ",
        b'#include "k.cuh"\n',
        b'#include "/dev/null"\n',
        b'#include "/dev/zero"\n',
        b'#include "fifo.cuh"\n',  # a FIFO in every case's directory (see _run_cu)
        b'#include "."\n',
        b"const float* ",
        b"unsigned long long ",
        b"float Count",
        b"float3 v, ",
    ),
    "cache": (b"CPCUBIN1", b"CPCUBIN2", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"[" * 500, b"{}"),
}

_CU_SEED = b"""// A kernel to fuzz.
// cudapatch: description=Scales with a gain.
// cudapatch: blockSize=128
#include "k.cuh"
extern "C" __global__ void gain(const float* in, /*inout*/ float* acc, float* out, float g, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; /* one thread per element */
    if (i < n) out[i] = in[i] * g + acc[i];
}
"""

_PATCH_SEED = b"""links = ["fill.Out -> scale.In", "scale.Out -> ck.in"]

[engine]
profiling = "PerBlock"
device = 0
name = "Fuzz"

[operators.fill]
type = "core.Fill"
Count = 128
Value = 0.5

[operators.scale]
type = "core.Scale"
Factor = 2.0

[operators.ck]
type = "core.CustomKernel"
gain = 1.5
Code = '''
extern "C" __global__ void custom(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
'''

[operators.kf]
type = "core.KernelFile"
Path = "k.cu"

[preview]
image = "scale.Out"
size = [64, 32]
"""


def _seeds() -> dict[str, list[bytes]]:
    bundled = sorted(BUNDLED_KERNEL_DIR.glob("*.ptx"))
    return {
        "sidecar": [p.with_suffix(".json").read_bytes() for p in bundled],
        "ptx": [p.read_bytes() for p in bundled],
        "patch": [_PATCH_SEED, demo_patch_text().encode()],
        "cu": [_CU_SEED, *(p.read_bytes() for p in sorted(BUNDLED_KERNEL_DIR.glob("*.cu")))],
        "cache": [b""],  # made per case: a valid entry, then mutated
    }


SEEDS = _seeds()
_SIDECAR_OF = {p.read_bytes(): p.with_suffix(".json").read_bytes() for p in sorted(BUNDLED_KERNEL_DIR.glob("*.ptx"))}
_CACHE_PAYLOAD = b"\x7fELF" + bytes(range(256)) * 4
_CACHE_META = {"symbol": "_Z4gainPKfPfS1_fj", "name": "k.cu", "sha": "ab" * 32}


# Values put in place of a real one (keeping the file's syntax, so the checks after parsing are reached).
VALUES: dict[str, tuple[bytes, ...]] = {
    "toml": (
        b"-1",
        b"0",
        b"1e308",
        b"inf",
        b"nan",
        b'"x"',
        b'""',
        b"[1, 2]",
        b"[]",
        b"{}",
        b"true",
        b"1979-05-27",
        b'"0x' + b"f" * 40 + b'"',
        b'"k\\u0000.cu"',
        b'"/dev/zero"',
        b"[[1]]",
        b'"8x8"',
        b"[-1, 5]",
        b"18446744073709551616",
        b"[0]",
        b'"PerBlock"',
        b'"core.Fill"',
        b'"a.Out"',
        b"[1.5, 2, 3]",
    ),
    "json": (
        b"-1",
        b"0",
        b"null",
        b"[]",
        b"{}",
        b'"x"',
        b"true",
        b"1e999",
        b'"float*"',
        b'"in"',
        b'"out"',
        b"0.5",
        b"1024",
        b"1025",
        b"232448",
        b"232449",
        b'"1st"',
        b'"uint4"',
        b'[{"name": "a", "type": "int"}]',
    ),
}


def _replace_value(rng: random.Random, data: bytes, loader: str) -> bytes:
    """``data`` with the value of one ``key = value`` (TOML) or ``"key": value`` (JSON) line replaced."""
    sep, values = (b": ", VALUES["json"]) if loader == "sidecar" else (b" = ", VALUES["toml"])
    lines = data.split(b"\n")
    candidates = [i for i, line in enumerate(lines) if sep in line]
    if not candidates:
        return data
    i = rng.choice(candidates)
    key, _, rest = lines[i].partition(sep)
    comma = b"," if rest.rstrip().endswith(b",") else b""
    lines[i] = key + sep + rng.choice(values) + comma
    return b"\n".join(lines)


# -- mutations ------------------------------------------------------------------------------------------
def _pos(rng: random.Random, data: bytes) -> int:
    return rng.randrange(len(data) + 1)


def mutate(rng: random.Random, data: bytes, loader: str) -> bytes:
    """``data`` with one to four random mutations."""
    words = KEYWORDS[loader]
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.2 and data:  # flip bits of a few bytes
            buf = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(buf))
                buf[i] ^= 1 << rng.randrange(8)
            data = bytes(buf)
        elif kind < 0.3:  # truncate
            data = data[: _pos(rng, data)]
        elif kind < 0.4 and data:  # delete a slice
            i = _pos(rng, data)
            data = data[:i] + data[i + rng.randint(1, 64) :]
        elif kind < 0.5 and data:  # repeat a slice (finds work that grows faster than the input)
            i = _pos(rng, data)
            piece = data[i : i + rng.randint(1, 32)]
            data = data[:i] + piece * rng.choice((2, 10, 200, 2000)) + data[i:]
        elif kind < 0.6:  # splice in a slice of another seed of this loader
            other = rng.choice(SEEDS[loader]) or data
            j = _pos(rng, other)
            i = _pos(rng, data)
            data = data[:i] + other[j : j + rng.randint(1, 200)] + data[i:]
        elif kind < 0.7 and loader in ("sidecar", "patch"):  # a wrong value, in valid syntax
            data = _replace_value(rng, data, loader)
        elif kind < 0.8:  # insert a known bad input
            i = _pos(rng, data)
            data = data[:i] + rng.choice(BAD_INPUTS) + data[i:]
        elif kind < 0.95:  # insert a word of the format
            i = _pos(rng, data)
            data = data[:i] + rng.choice(words) + data[i:]
        else:  # replace a number by an extreme one
            digits = [i for i, c in enumerate(data) if 48 <= c <= 57]
            if digits:
                i = rng.choice(digits)
                data = data[:i] + rng.choice((b"-1", b"0", b"9" * 20, b"9" * 4400, b"4294967296")) + data[i + 1 :]
    return data


# -- non-regular files ------------------------------------------------------------------------------------
#: One case in this many puts a non-regular file in place of one of its files (``SPECIAL_TARGETS``).
SPECIAL_RATE = 12
_HAS_FIFOS = hasattr(os, "mkfifo")
#: What may stand where a file is expected. FIFOs and symlinks are POSIX; Windows gets directories.
SPECIAL_KINDS: tuple[str, ...] = ("fifo", "fifo-link", "dev-zero-link", "directory") if _HAS_FIFOS else ("directory",)
#: Which of a loader's files a special case replaces: the file it is given, and the files that file
#: names (a PTX's sidecar, a ``.cu``'s ``#include``, a patch's KernelFile). "entry": the cache entry.
SPECIAL_TARGETS: dict[str, tuple[str, ...]] = {
    "sidecar": ("k.json",),
    "ptx": ("k.ptx", "k.json"),
    "cu": ("k.cu", "k.cuh"),
    "patch": ("p.toml", "k.cu"),
    "cache": ("entry",),
}
#: The files a case's cudapatch errors may name (``ck.cu``: the CustomKernel's Code, named after its block).
CASE_FILES: dict[str, tuple[str, ...]] = {
    "sidecar": ("k.json",),
    "ptx": ("k.ptx", "k.json"),
    "cu": ("k.cu", "k.cuh", "ck.cu"),
    "patch": ("p.toml", "base.toml"),  # base.toml: the running patch a live edit starts from
    "cache": (),
}


def _clear(path: Path) -> None:
    """Remove whatever non-regular file a special case left at ``path`` (writing to a FIFO would block)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _write(path: Path, data: bytes) -> None:
    _clear(path)
    path.write_bytes(data)


def make_special(kind: str, path: Path) -> None:
    """Put a non-regular file of ``kind`` (one of ``SPECIAL_KINDS``) at ``path``, replacing what is there."""
    _clear(path)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "fifo-link":
        fifo = path.with_name(path.name + ".fifo")
        _clear(fifo)
        os.mkfifo(fifo)
        path.symlink_to(fifo)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        raise ValueError(f"unknown special file kind {kind!r}")


@dataclass(frozen=True)
class Case:
    """One generated input: which loader, its index, and the bytes (for the cache: the entry file)."""

    loader: str
    index: int
    data: bytes
    #: For PTX: the sidecar beside it (its seed's own, or now and then another kernel's).
    sidecar: bytes = b""
    #: ``(kind, file)``: a non-regular file put in place of one of the case's files (see ``SPECIAL_TARGETS``).
    special: tuple[str, str] | None = None


def make_case(loader: str, index: int, seed: int) -> Case:
    """Case ``index`` of ``loader`` under ``seed`` (deterministic)."""
    rng = random.Random(f"{seed}:{loader}:{index}")
    # Drawn from a generator of its own, so the bytes of a case stay what they were before specials existed.
    special_rng = random.Random(f"{seed}:{loader}:{index}:special")
    special = None
    if special_rng.randrange(SPECIAL_RATE) == 0:
        special = (special_rng.choice(SPECIAL_KINDS), special_rng.choice(SPECIAL_TARGETS[loader]))
    if loader == "cache":
        return Case(loader, index, b"", special=special)  # the entry is made and mutated in run_case
    seed_data = rng.choice(SEEDS[loader])
    sidecar = b""
    if loader == "ptx":
        sidecar = _SIDECAR_OF[seed_data] if rng.random() < 0.8 else rng.choice(list(_SIDECAR_OF.values()))
    return Case(loader, index, mutate(rng, seed_data, loader), sidecar, special)


def _special(case: Case, tmp: Path, name: str) -> None:
    """Put the case's non-regular file in place of ``name`` (in ``tmp``), if the case has one there."""
    if case.special is not None and case.special[1] == name:
        make_special(case.special[0], tmp / name)


# -- running the loaders ----------------------------------------------------------------------------------
def _run_sidecar(case: Case, tmp: Path, seed: int) -> None:
    path = tmp / "k.json"
    _write(path, case.data)
    _special(case, tmp, "k.json")
    load_sidecar(path)


def _run_ptx(case: Case, tmp: Path, seed: int) -> None:
    ptx = tmp / "k.ptx"
    _write(ptx, case.data)
    _write(tmp / "k.json", case.sidecar or _SIDECAR_OF[case.data])
    _special(case, tmp, "k.ptx")
    _special(case, tmp, "k.json")
    PtxFileSource(ptx).load()
    KernelFile(path=ptx, name="kf")


def _run_cu(case: Case, tmp: Path, seed: int) -> None:
    cu = tmp / "k.cu"
    _write(cu, case.data)
    _write(tmp / "k.cuh", case.data[: len(case.data) // 3])  # an include target: fuzzed bytes too
    if _HAS_FIFOS and not (tmp / "fifo.cuh").exists():
        os.mkfifo(tmp / "fifo.cuh")  # for the '#include "fifo.cuh"' keyword
    _special(case, tmp, "k.cu")
    _special(case, tmp, "k.cuh")
    source = CudaSource(path=cu)
    source.watched_files()
    try:
        source.includes()  # what the build does before NVRTC (cache key, compile): where an include is refused
        if _reaches_a_blocking_include(case):
            raise AssertionError("an #include of a FIFO or device was accepted: NVRTC would block reading it")
        source.describe()
        KernelFile(path=cu, name="kf")
    finally:
        try:
            text = case.data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            CustomKernel(name="ck", Code=text)


_FIFO_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"fifo\.cuh"', re.MULTILINE)
_K_CUH_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"k\.cuh"', re.MULTILINE)


def _reaches_a_blocking_include(case: Case) -> bool:
    """Whether the ``.cu`` of ``case`` includes, on a line of its own, a file NVRTC would block on (a
    directory is not one: NVRTC searches on past it)."""
    if _HAS_FIFOS and _FIFO_INCLUDE.search(case.data):
        return True
    special = case.special is not None and case.special[1] == "k.cuh" and case.special[0] != "directory"
    return special and _K_CUH_INCLUDE.search(case.data) is not None


def _run_patch(case: Case, tmp: Path, seed: int) -> None:
    _write(tmp / "k.cu", _CU_SEED.replace(b'#include "k.cuh"\n', b""))
    path = tmp / "p.toml"
    _write(path, case.data)
    _special(case, tmp, "p.toml")
    _special(case, tmp, "k.cu")
    new = load_patch(path, REGISTRY)
    adapter = HostAdapter(PlanOnlyEngine(), REGISTRY, search_paths=[tmp])
    if case.index % 2:  # a live edit over the seed patch
        base = tmp / "base.toml"
        _write(base, _PATCH_SEED)
        old = load_patch(base, REGISTRY)
        apply_patch(adapter, old)
        apply_patch(adapter, new, old)
    else:  # a patch loaded at start
        apply_patch(adapter, new)


def _run_cache(case: Case, tmp: Path, seed: int) -> None:
    rng = random.Random(f"{seed}:cache:{case.index}")
    directory = tmp / "cache"
    shutil.rmtree(directory, ignore_errors=True)
    key = cache_key("fuzz", str(case.index))
    CubinCache(directory).put(key, _CACHE_PAYLOAD, _CACHE_META)
    path = directory / f"{key}.cubin"
    mutated = mutate(rng, path.read_bytes(), "cache")
    path.write_bytes(mutated)
    if case.special is not None:
        make_special(case.special[0], path)
    hit = CubinCache(directory).get(key)  # must not raise, whatever the file holds
    if hit is not None and (hit.payload, hit.meta) != (_CACHE_PAYLOAD, _CACHE_META):
        raise AssertionError("a damaged cache entry was returned as a hit")


LOADERS: dict[str, Callable[[Case, Path, int], None]] = {
    "sidecar": _run_sidecar,
    "ptx": _run_ptx,
    "patch": _run_patch,
    "cu": _run_cu,
    "cache": _run_cache,
}


@dataclass
class Failure:
    case: Case
    error: str
    seconds: float

    def __str__(self) -> str:
        shown = self.case.data[:120]
        more = f" (+{len(self.case.data) - 120} bytes)" if len(self.case.data) > 120 else ""
        special = f", {self.case.special[1]} is a {self.case.special[0]}" if self.case.special else ""
        return (
            f"{self.case.loader} case {self.case.index}{special} ({self.seconds:.3f} s): {self.error}; "
            f"input {shown!r}{more}"
        )


@dataclass
class FuzzReport:
    """What a run found: escapes (non-cudapatch exceptions) and slow cases."""

    loader: str
    cases: int = 0
    refused: int = 0  # cases that ended in a CudapatchError (the expected outcome for most)
    worst: float = 0.0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)


def run_case(case: Case, tmp: Path, seed: int, *, bound: float) -> tuple[Failure | None, float, bool]:
    """Run one case. Returns the failure (None if fine), its time, and whether it was refused."""
    t0 = time.perf_counter()
    refused = False
    error = None
    try:
        LOADERS[case.loader](case, tmp, seed)
    except CudapatchError as exc:
        refused = True
        if exc.file is None or Path(exc.file).name not in CASE_FILES[case.loader]:
            error = f"{type(exc).__name__} names no file of the case (file={exc.file!r}): {str(exc)[:200]}"
    except Exception as exc:  # noqa: BLE001 - any other type is what the fuzzer looks for
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    took = time.perf_counter() - t0
    if error is None and took > bound:
        error = f"took {took:.3f} s (bound {bound} s)"
    return (Failure(case, error, took) if error else None), took, refused


def fuzz(loader: str, cases: int, seed: int, tmp: Path, *, bound: float = 0.5, start: int = 0) -> FuzzReport:
    """Run cases ``start .. start + cases`` of ``loader`` in directory ``tmp``."""
    report = FuzzReport(loader)
    t0 = time.perf_counter()
    for i in range(start, start + cases):
        case = make_case(loader, i, seed)
        failure, took, refused = run_case(case, tmp, seed, bound=bound)
        report.cases += 1
        report.refused += refused
        report.worst = max(report.worst, took)
        if failure is not None:
            report.failures.append(failure)
    report.seconds = time.perf_counter() - t0
    return report


def corpus_summary() -> str:
    """The seeds' sizes, for a report header."""
    return ", ".join(f"{k}: {len(v)} seeds" for k, v in SEEDS.items()) + f"; {len(BAD_INPUTS)} bad inputs"
