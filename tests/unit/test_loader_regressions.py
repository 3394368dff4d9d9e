"""Bad input never escapes a loader as a plain Python exception, never hangs, and names its file:
one test per input a fuzzer found escaping (or accepted though invalid). The sizes that once took
quadratic time stay in the inputs; the fuzz tests bound each case's time (test_fuzz_loaders.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cudapatch.blocks.library.custom import CustomKernel, KernelFile
from cudapatch.errors import (
    CudapatchError,
    KernelCompileError,
    KernelLoadError,
    PatchFileError,
    PtxSignatureError,
    SidecarError,
)
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch, parse_patch
from cudapatch.host_plugin.hosts.live_reload import PatchReloader
from cudapatch.kernels import CudaSource, PtxFileSource, parse_ptx
from cudapatch.kernels import source as source_module
from cudapatch.kernels.cache import CubinCache, cache_key
from cudapatch.kernels.descriptor import load_sidecar, parse_sidecar
from cudapatch.kernels.signature import describe_cuda_source

from .conftest import ptx_entry
from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry
ROOT = Path(__file__).resolve().parents[2]
KERNEL = 'extern "C" __global__ void k(const float* in, float* out, unsigned int n) {}\n'
SIDECAR = {
    "entryPoint": "k",
    "parameters": [
        {"name": "a", "type": "float*", "direction": "in"},
        {"name": "n", "type": "uint", "direction": "in"},
    ],
}


def _raised(fn):
    """Run ``fn``; its exception, if any (which type it is, and what it says, is the point)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the point is which type it is
        return exc
    return None


# -- invalid UTF-8 -------------------------------------------------------------------------------------
def test_a_latin1_patch_file_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b'[operators.a]\ntype = "core.Fill"\n# caf\xe9\n')
    with pytest.raises(PatchFileError) as info:
        load_patch(path, REG)
    err = info.value
    assert err.file == str(path) and err.line == 3 and "column 6" in err.message and "UTF-8" in err.message


def test_non_utf8_sidecar_ptx_and_cu_name_their_file(tmp_path: Path) -> None:
    (tmp_path / "k.json").write_bytes(json.dumps(SIDECAR).encode() + b"\n\xff")
    with pytest.raises(SidecarError, match="line 2, column 1") as info:
        load_sidecar(tmp_path / "k.json")
    assert info.value.line == 2
    (tmp_path / "k.json").write_text(json.dumps(SIDECAR))
    (tmp_path / "k.ptx").write_bytes(ptx_entry("k", [".u64", ".u32"]).encode() + b"// \xe9\n")
    with pytest.raises(PtxSignatureError, match="not UTF-8") as info:
        PtxFileSource(tmp_path / "k.ptx").load()
    assert info.value.file.endswith("k.ptx")
    (tmp_path / "k.cu").write_bytes(b"// \xe9t\xe9\n" + KERNEL.encode())
    with pytest.raises(KernelLoadError, match="line 1, column 4"):
        CudaSource(path=tmp_path / "k.cu").describe()


# -- nesting 2,000 deep -------------------------------------------------------------------------------
def test_deep_nesting_in_a_patch_or_sidecar_states_the_limit() -> None:
    deep = "[" * 2000 + "]" * 2000
    err = _raised(lambda: parse_patch(f"a = {deep}\n", path="p.toml"))
    assert isinstance(err, PatchFileError) and "limit is 32" in err.message and err.file == "p.toml"
    err = _raised(lambda: parse_sidecar(deep, file="k.json"))
    assert isinstance(err, SidecarError) and "limit is 32" in err.message and err.file == "k.json"
    # nested less than the parsers' own limit, more than ours
    err = _raised(lambda: parse_patch('[operators.a]\ntype = "core.Fill"\nValue = ' + "[" * 40 + "]" * 40))
    assert isinstance(err, PatchFileError) and "more than 32 deep" in err.message and err.line == 3


# -- integers over 4,300 digits ------------------------------------------------------------------------
def test_huge_integers_are_errors_in_patch_sidecar_and_ptx() -> None:
    digits = "9" * 5000
    assert isinstance(_raised(lambda: parse_patch(f"x = {digits}\n", path="p.toml")), PatchFileError)
    err = _raised(lambda: parse_patch(f"[engine]\ndevice = 0x{'f' * 5000}\n", path="p.toml"))  # hex has no limit
    assert isinstance(err, PatchFileError) and "bits" in err.message and err.line == 2
    err = _raised(lambda: parse_sidecar('{"entryPoint": "k", "blockSize": ' + digits + "}", file="k.json"))
    assert isinstance(err, SidecarError) and "4,300 digits" in err.message and err.line == 1
    # The line of the number, not of digits in a string before it (which int() never sees).
    text = f'{{"entryPoint": "k",\n"description": "{digits}",\n"parameters": [],\n"blockSize":\n  -{digits}}}'
    err = _raised(lambda: parse_sidecar(text, file="k.json"))
    assert isinstance(err, SidecarError) and err.file == "k.json" and err.line == 5, err
    err = _raised(lambda: parse_ptx(f".version {digits}.0\n", file="k.ptx"))
    assert isinstance(err, PtxSignatureError) and err.file == "k.ptx" and err.line == 1
    err = _raised(lambda: parse_ptx(f".version 8.0\n.entry k(.param .b8 p[{digits[:4000]}])\n", file="k.ptx"))
    assert isinstance(err, PtxSignatureError) and "array size" in err.message and err.kernel == "k"


def test_a_huge_integer_in_a_patch_names_its_line() -> None:
    digits = "9_" * 2600 + "9"  # 2,601 digits with underscores: under the limit
    text = f'# {"9" * 5000} in a comment\nname = "{"9" * 5000}"\n[engine]\nx = {digits}\ny = -{"9" * 4400}\n'
    err = _raised(lambda: parse_patch(text, path="p.toml"))
    assert isinstance(err, PatchFileError) and "4,300 digits" in err.message
    assert err.file == "p.toml" and err.line == 5  # not the comment's, the string's or the short number's


def test_a_huge_hex_string_for_an_integer_parameter() -> None:
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    patch = parse_patch(f'[operators.a]\ntype = "core.Fill"\nCount = "0x{"f" * 5000}"\n', path="p.toml")
    err = _raised(lambda: apply_patch(adapter, patch))
    assert isinstance(err, PatchFileError) and "64 bits" in err.message and err.line == 3 and len(str(err)) < 300


# -- paths the OS refuses ------------------------------------------------------------------------------
def test_a_nul_byte_in_a_kernel_path() -> None:
    err = _raised(lambda: parse_patch('[operators.k]\ntype = "core.KernelFile"\nPath = "k\\u0000.cu"\n', path="p.toml"))
    assert isinstance(err, PatchFileError) and err.line == 3 and err.block == "k" and "NUL" in err.message
    with pytest.raises(KernelLoadError, match="NUL"):
        KernelFile(path="k\0.cu", name="k")


def test_an_over_long_kernel_path(tmp_path: Path) -> None:
    long = "a" * 300 + ".cu"
    err = _raised(lambda: parse_patch(f'[operators.k]\ntype = "core.KernelFile"\nPath = "{long}"\n', path="p.toml"))
    assert isinstance(err, PatchFileError) and err.line == 3 and "at most 255" in err.message
    adapter = HostAdapter(PlanOnlyEngine(), REG, search_paths=[tmp_path])
    with pytest.raises(KernelLoadError, match="at most 255") as info:
        adapter.create("k", "core.KernelFile", {"Path": long})
    assert info.value.block == "k"


# -- [engine] device = [0] -----------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["device = [0]", 'device = "0"', "device = -1", "device = true", "name = 3"])
def test_engine_settings_of_the_wrong_type(setting: str) -> None:
    err = _raised(lambda: parse_patch(f"[engine]\n{setting}\n", path="p.toml"))
    assert isinstance(err, PatchFileError) and err.line == 2


def test_cudapatch_run_refuses_a_bad_device_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[engine]\ndevice = [0]\n\n[operators.a]\ntype = "core.Fill"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "cudapatch", "run", str(path), "--headless", "--frames", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{path}:2" in run.stderr and "device" in run.stderr


# -- the cubin cache -----------------------------------------------------------------------------------
def test_corrupt_cache_metadata_is_a_logged_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = CubinCache(tmp_path)
    key = cache_key("k")
    cache.put(key, b"\x7fELF payload", {"symbol": "k"})
    path = tmp_path / f"{key}.cubin"
    raw = bytearray(path.read_bytes())
    raw[48] ^= 0xFF  # inside the metadata: the payload's checksum alone would not see it
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="cudapatch.kernels"):
        fresh = CubinCache(tmp_path)
        assert fresh.get(key) is None and fresh.corrupt == 1 and fresh.misses == 1
    assert "corrupt" in caplog.text and not path.exists()


def test_a_hand_made_entry_with_deep_metadata_is_a_miss(tmp_path: Path) -> None:
    key = cache_key("k")
    meta = b"[" * 100_000 + b"]" * 100_000
    payload = b"\x7fELF"
    digest = hashlib.sha256()
    for part in (key.encode(), meta, payload):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    header = struct.pack("<8s32sI", b"CPCUBIN2", digest.digest(), len(meta))
    (tmp_path / f"{key}.cubin").write_bytes(header + meta + payload)
    cache = CubinCache(tmp_path)
    assert _raised(lambda: cache.get(key)) is None and cache.get(key) is None and cache.corrupt == 1


def test_an_entry_under_another_key_is_a_miss(tmp_path: Path) -> None:
    cache = CubinCache(tmp_path)
    cache.put(cache_key("a"), b"payload a", {})
    os.replace(tmp_path / f"{cache_key('a')}.cubin", tmp_path / f"{cache_key('b')}.cubin")
    assert CubinCache(tmp_path).get(cache_key("b")) is None


def test_size_limits_are_stated(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    path.write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(SidecarError, match="more than the 1 MiB cudapatch reads for one") as info:
        load_sidecar(path)
    assert info.value.file == str(path)


def test_a_deep_restart_state_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudapatch.host_plugin.hosts.standalone import RESTART_ENV, take_restart_state

    monkeypatch.setenv(RESTART_ENV, "[" * 100_000)
    assert take_restart_state() == {}


# -- FIFOs and other non-regular files -------------------------------------------------------------------
def _returns_promptly(fn) -> BaseException | None:
    """Run ``fn`` on a thread; fail the test (instead of hanging it) if it does not return in 5 s."""
    box: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as exc:  # noqa: BLE001
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(5.0)
    assert not thread.is_alive(), "the loader blocked on a non-regular file"
    return box[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_are_refused_without_blocking(tmp_path: Path) -> None:
    for name in ("k.json", "k.ptx", "f.cu", "p.toml"):
        os.mkfifo(tmp_path / name)
    (tmp_path / "s.json").write_text(json.dumps(SIDECAR))
    cases = [
        (lambda: load_sidecar(tmp_path / "k.json"), SidecarError, "k.json"),
        (lambda: PtxFileSource(tmp_path / "k.ptx", tmp_path / "s.json").load(), KernelLoadError, "k.ptx"),
        (lambda: CudaSource(path=tmp_path / "f.cu").describe(), KernelLoadError, "f.cu"),
        (lambda: load_patch(tmp_path / "p.toml", REG), PatchFileError, "p.toml"),
        (lambda: KernelFile(path=tmp_path / "f.cu", name="kf"), KernelLoadError, "f.cu"),
    ]
    for fn, kind, name in cases:
        err = _returns_promptly(fn)
        assert isinstance(err, kind) and "FIFO" in err.message and err.file.endswith(name), err
    err = _returns_promptly(lambda: load_patch(tmp_path, REG))
    assert isinstance(err, PatchFileError) and "directory" in err.message


# -- quadratic comment stripping --------------------------------------------------------------------------
def test_unclosed_comments_are_refused_naming_the_comment() -> None:
    err = _raised(lambda: parse_ptx(".version 8.0\n" + "/*a\n" * 20000, file="k.ptx"))
    assert isinstance(err, PtxSignatureError) and "never closed" in err.message and err.line == 2
    err = _raised(lambda: describe_cuda_source("/* x " * 20000 + KERNEL, file="k.cu"))
    assert isinstance(err, KernelCompileError) and "never closed" in err.message
    err = _raised(lambda: CustomKernel(name="ck", Code="/* x " * 20000 + KERNEL))
    assert isinstance(err, KernelCompileError)


def test_many_closed_comments_parse() -> None:
    assert _raised(lambda: describe_cuda_source("/* x */" * 20000 + "\n" * 20000 + KERNEL)) is None
    text = ".version 8.0\n" + "/* x */ // y\n" * 20000 + ptx_entry("k", [".u32"])
    assert _raised(lambda: parse_ptx(text)) is None


# -- many parameters, many entries -----------------------------------------------------------------------
def test_a_sidecar_with_20000_parameters_is_refused() -> None:
    params = [{"name": f"p{i}", "type": "float*"} for i in range(20000)]
    text = json.dumps({"entryPoint": "k", "parameters": params}, indent=2)
    err = _raised(lambda: parse_sidecar(text, file="k.json"))
    assert isinstance(err, SidecarError) and "at most 1024" in err.message and err.line is not None


def test_a_sidecar_of_1000_parameters_finds_the_line() -> None:
    params = [{"name": f"p{i}", "type": "float*"} for i in range(1000)] + [{"name": "bad", "type": "nope"}]
    err = _raised(lambda: parse_sidecar(json.dumps({"entryPoint": "k", "parameters": params}, indent=2)))
    assert isinstance(err, SidecarError) and err.line == 4 + 1000 * 4 + 1


def test_a_ptx_of_3000_entries_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = "".join(ptx_entry(f"k{i}", [".u64", ".u32"]).split(".address_size 64\n", 1)[1] for i in range(3000))
    (tmp_path / "k.ptx").write_text(".version 8.0\n.target sm_75\n.address_size 64\n" + body)
    (tmp_path / "k.json").write_text(json.dumps({**SIDECAR, "entryPoint": "k2999"}))
    calls = []
    real = source_module.parse_ptx
    monkeypatch.setattr(source_module, "parse_ptx", lambda *a, **k: calls.append(1) or real(*a, **k))
    block = KernelFile(path=tmp_path / "k.ptx", name="kf")
    source = block.description.kernels[0].source
    source.describe()
    source.load()
    assert len(calls) == 1


# -- settings accepted though invalid ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting, words",
    [
        ("blockSize=-5", "1..1024"),
        ("blockSize=2048", "1..1024"),
        ("blockSize=lots", "not an integer"),
        ("sharedMemoryBytes=-1", "0..232448"),
        ("sharedMemoryBytes=1000000", "0..232448"),
        ("sharedMemoryBytes=99999999999", r"is too large: it must be in 0\.\.232448 \(227 KiB"),
        ("sharedMemoryBytes=-99999999999", r"is out of range: it must be in 0\.\.232448"),
        ("blockSize=16x99999999999", r"is too large: it must be in 1\.\.1024 threads"),
        ("sharedMemoryBytes=1e9", "not an integer"),
        ("blocksize=128", "unknown key 'blocksize'"),
    ],
)
def test_cuda_settings_are_checked_as_a_sidecars_are(setting: str, words: str) -> None:
    with pytest.raises(KernelCompileError, match=words) as info:
        describe_cuda_source(f"// description=x\n// cudapatch: {setting}\n{KERNEL}", file="k.cu")
    assert info.value.file == "k.cu" and info.value.line == 2


def test_unbounded_shared_memory_in_a_sidecar_is_refused() -> None:
    with pytest.raises(SidecarError, match="227 KiB"):
        parse_sidecar(json.dumps({**SIDECAR, "sharedMemoryBytes": 1 << 40}))


@pytest.mark.parametrize("name", ["my param", "1st", "a-b", "", "é", "a\u0000"])
def test_sidecar_parameter_names_must_be_identifiers(name: str) -> None:
    sidecar = {**SIDECAR, "parameters": [{"name": name, "type": "float*"}]}
    with pytest.raises(SidecarError, match="identifier|non-empty"):
        parse_sidecar(json.dumps(sidecar), file="k.json")


@pytest.mark.parametrize("size", ["5", '"8x8"', "[-1, 5]", "[512]", "[512.0, 512]", "[true, 4]", "[100000, 5]"])
def test_preview_sizes_are_checked(size: str) -> None:
    text = f'[operators.a]\ntype = "core.Fill"\n[preview]\nimage = "a.Out"\nsize = {size}\n'
    with pytest.raises(PatchFileError, match=r"\[width, height\]") as info:
        parse_patch(text, path="p.toml")
    assert info.value.line == 5


def test_a_name_clash_names_the_kernel_file(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* out, float Count) {}\n')
    with pytest.raises(CudapatchError, match="used twice") as info:
        KernelFile(path=tmp_path / "k.cu", name="kf")
    assert info.value.file == str(tmp_path / "k.cu")
    (tmp_path / "p.toml").write_text('[operators.kf]\ntype = "core.KernelFile"\nPath = "k.cu"\n')
    adapter = HostAdapter(PlanOnlyEngine(), REG, search_paths=[tmp_path])
    with pytest.raises(PatchFileError, match="used twice") as info:
        apply_patch(adapter, load_patch(tmp_path / "p.toml", REG))
    assert info.value.line == 1 and str(tmp_path / "k.cu") in info.value.message


# -- live reload -------------------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _reloader(tmp_path: Path, text: str, *, apply=None) -> tuple[PatchReloader, Path, _Clock, list]:
    path = tmp_path / "p.toml"
    path.write_text(text)
    applied: list = []

    def record(new, old):
        applied.append(new)
        return {"created": len(new.operators)}

    clock = _Clock()
    reloader = PatchReloader(
        path, load_patch(path, REG), load=lambda p: load_patch(p, REG), apply=apply or record, clock=clock
    )
    return reloader, path, clock, applied


PATCH = '[operators.a]\ntype = "core.Fill"\nCount = 16\n'


def _save(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # distinct mtimes even on a coarse file system clock


def test_an_emptied_patch_is_held_until_a_second_save(tmp_path: Path) -> None:
    reloader, path, clock, applied = _reloader(tmp_path, PATCH)
    _save(path, "", 1_000_000_000)
    assert not reloader.poll(force=True) and reloader.held and "holding" in reloader.status
    clock.now += 0.3
    assert not reloader.poll() and reloader.held and not applied  # same file, too soon
    _save(path, "# still empty\n", 2_000_000_000)
    clock.now += 0.3
    assert reloader.poll() and not reloader.held and applied[-1].operators == {}


def test_an_emptied_patch_is_applied_after_a_second(tmp_path: Path) -> None:
    reloader, path, clock, applied = _reloader(tmp_path, PATCH)
    _save(path, "", 1_000_000_000)
    assert not reloader.poll()
    for _ in range(3):
        clock.now += 0.3
        assert not reloader.poll() and not applied
    clock.now += 0.3  # 1.2 s after the edit
    assert reloader.poll() and applied and reloader.patch.operators == {}


def test_a_refilled_patch_ends_the_hold(tmp_path: Path) -> None:
    reloader, path, clock, applied = _reloader(tmp_path, PATCH)
    _save(path, "", 1_000_000_000)
    assert not reloader.poll()
    _save(path, PATCH.replace("16", "32"), 2_000_000_000)
    clock.now += 0.3
    assert reloader.poll() and not reloader.held and reloader.patch.operators["a"].params["Count"] == 32


def test_a_live_edit_that_fails_in_any_way_keeps_the_last_good_patch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(new, old):
        raise RuntimeError("a bug in an apply step")

    reloader, path, clock, _ = _reloader(tmp_path, PATCH, apply=broken)
    good = reloader.patch
    _save(path, PATCH.replace("16", "32"), 1_000_000_000)
    with caplog.at_level(logging.ERROR, logger="cudapatch.host"):
        assert not reloader.poll()
    assert reloader.patch is good and "RuntimeError: a bug in an apply step" in reloader.status
    assert isinstance(reloader.errors[-1], PatchFileError) and "Traceback" in caplog.text
    clock.now += 0.3
    path.write_bytes(b"x = 'caf\xe9'\n")  # Latin-1
    os.utime(path, ns=(2_000_000_000,) * 2)
    assert not reloader.poll() and reloader.patch is good and "UTF-8" in reloader.status
    os.remove(path)
    clock.now += 0.3
    assert not reloader.poll() and "not found" in reloader.status


def test_nesting_that_parses_but_passes_the_limit_states_it_as_a_too_deep_parse_does() -> None:
    # 40 levels parse on every Python (2,000 only raise RecursionError before 3.13): the check after parsing
    # must name the limit as the parser's RecursionError path does.
    deep = "[" * 40 + "]" * 40
    err = _raised(lambda: parse_patch(f"a = {deep}\n", path="p.toml"))
    assert isinstance(err, PatchFileError) and "limit is 32" in err.message
    err = _raised(lambda: parse_sidecar(deep, file="k.json"))
    assert isinstance(err, SidecarError) and "limit is 32" in err.message and err.file == "k.json"
