"""The compiler child: a program of its own that never imports the user's ``__main__``, gets the
parent's ``sys.path``, and says why it died. NVRTC compiles for real on the CPU; crashes are real
(``os._exit``, SIGKILL, a broken ``PYTHONHOME``). The sources below are module-level so that the
child can import them (it imports this module, which has no side effects)."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cudapatch import Block, BlockBuilder, CudaSource, like
from cudapatch.engine import Context
from cudapatch.engine.kernels import KernelTracker
from cudapatch.errors import KernelCompileError, KernelLoadError
from cudapatch.kernels import CubinCache, KernelBuilder, ModuleCache, _child_pipe
from cudapatch.kernels import _compiler_child as ch
from cudapatch.kernels import compiler_process as cp
from cudapatch.kernels._compiler_child import MAX_FRAME, FrameReader, encode_frame
from cudapatch.kernels.compiler_process import CompilerProcess, compiler_python, describe_exit, processes_allowed
from cudapatch.kernels.source import KernelImage

ROOT = Path(__file__).resolve().parents[2]
ELF = b"\x7fELF"
GAIN = """extern "C" __global__ void k(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
"""
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and shell scripts")


@dataclass(frozen=True)
class _SlowSource(CudaSource):
    """Says which process compiles it (in the file ``marker``), then takes two minutes."""

    marker: str = ""

    def compile(self, arch: str) -> KernelImage:
        Path(self.marker).write_text(str(os.getpid()))
        time.sleep(120)
        return super().compile(arch)


class _ExitingSource(CudaSource):
    """A compiler that writes its last words and dies (what a buggy toolchain does to its process)."""

    def compile(self, arch: str) -> KernelImage:
        print("nvrtc: internal error in pass 7", file=sys.stderr, flush=True)
        os._exit(3)


class _ChattySource(CudaSource):
    """A compiler that prints to stdout, the child's protocol pipe before the child moved it."""

    def compile(self, arch: str) -> KernelImage:
        print("x" * 100_000, flush=True)
        return super().compile(arch)


class _UncheckedIncludes(CudaSource):
    """A CudaSource whose includes go to NVRTC unchecked, as every include did before FIFOs were
    refused: NVRTC opens a FIFO include and waits for a writer that never comes."""

    def _includes_of(self, text: str) -> tuple[Path, ...]:
        return ()


class _Loader(ModuleCache):
    """Loads nothing: returns the image's key (a GPU-less stand-in for cuModuleLoadData)."""

    def function(self, image: KernelImage) -> str:
        return f"fn:{image.key}"


def _gain(i: int) -> str:
    return GAIN.replace("gain;", f"gain + {i}.0f;")


def _wait_for(path: Path, timeout: float = 60.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


@pytest.fixture
def proc():
    p = CompilerProcess()
    yield p
    p.close()


def test_a_script_without_a_main_guard_runs_its_body_once(tmp_path: Path) -> None:
    script = tmp_path / "demo.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import os
            from cudapatch import CudaSource
            from cudapatch.kernels import CubinCache, KernelBuilder, ModuleCache
            from cudapatch.kernels.compiler_process import compiler_process

            print("module body runs in", os.getpid(), flush=True)


            class Loader(ModuleCache):
                def function(self, image):
                    return "fn"


            builder = KernelBuilder(
                arch="sm_90", cache=CubinCache(False), modules=Loader(device_key="t"), make_current=lambda: None
            )
            ck = builder.submit(CudaSource(code={GAIN!r})).result(timeout=120)
            child = compiler_process().child_pid
            print("compiled", ck.origin, ck.image.image[:4], "in a child:", child not in (None, os.getpid()))
            builder.close()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDAPATCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    both = out.stdout + out.stderr
    assert out.returncode == 0, both
    assert both.count("module body runs in") == 1, both
    assert out.stdout.count("compiled compiled b'\\x7fELF' in a child: True") == 1, both
    assert "Traceback" not in both and "crashed" not in both


def test_jobs_queue_behind_one_in_the_child_and_stdout_noise_is_harmless(proc: CompilerProcess) -> None:
    assert proc.child_pid is None  # nothing starts before the first job
    jobs = [proc.send(CudaSource(code=_gain(i)), "sm_90") for i in range(3)]
    chatty = proc.send(_ChattySource(code=_gain(9)), "sm_90")
    assert proc.in_flight == 4 and proc.child_pid not in (None, os.getpid())
    for job in [*jobs, chatty]:
        proc.wait(job, timeout=60)
    assert all(j.done and j.error is None and j.image.image.startswith(ELF) for j in [*jobs, chatty])  # type: ignore[union-attr]
    assert proc.in_flight == 0 and proc.crashes == 0


def test_a_crash_fails_only_its_job_says_why_and_the_next_job_restarts_the_child(
    proc: CompilerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    first = proc.send(CudaSource(code=_gain(1)), "sm_90")
    proc.wait(first, timeout=60)
    pid = proc.child_pid
    with caplog.at_level(logging.WARNING, logger="cudapatch.kernels"):
        bad = proc.send(_ExitingSource(code=_gain(2)), "sm_90")
        behind = proc.send(CudaSource(code=_gain(3)), "sm_90")  # waits here while the child dies
        proc.wait(bad, timeout=60)
        proc.wait(behind, timeout=60)
    assert isinstance(bad.error, KernelCompileError)
    text = str(bad.error)
    assert "crashed on this kernel" in text and "exited with code 3" in text and "internal error in pass 7" in text
    assert behind.error is None and behind.image is not None and behind.image.image.startswith(ELF)
    assert proc.child_pid not in (None, pid) and proc.crashes == 1
    assert any("exited with code 3" in r.getMessage() and "pass 7" in r.getMessage() for r in caplog.records)


@posix_only
def test_a_compile_past_the_deadline_ends_the_child_fails_its_job_and_the_next_job_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkfifo(tmp_path / "pipe.cuh")
    kernel = tmp_path / "hangs.cu"
    kernel.write_text('#include "pipe.cuh"\n' + GAIN)
    p = CompilerProcess(job_deadline_s=3.0)  # the product's deadline is JOB_DEADLINE_S; a test waits less
    try:
        with caplog.at_level(logging.WARNING, logger="cudapatch.kernels"):
            hung = p.send(_UncheckedIncludes(path=kernel), "sm_90")  # real NVRTC, blocked on the FIFO
            behind = p.send(CudaSource(code=_gain(11)), "sm_90")
            first = p.child_pid
            p.wait(hung, timeout=120)
            pid = p.child_pid
            p.job_deadline_s = cp.JOB_DEADLINE_S  # the job behind runs under the product's deadline
            p.wait(behind, timeout=120)
        assert isinstance(hung.error, KernelCompileError)
        text = str(hung.error)
        assert "compiling hangs.cu took longer than the compiler's 3 s deadline" in text, text
        assert hung.error.file == str(kernel) and hung.error.kernel == "hangs.cu"
        assert behind.error is None and behind.image is not None and behind.image.image.startswith(ELF)
        assert p.overdue == 1 and p.crashes == 0 and p.child_pid == pid and pid not in (None, first)
        assert any("took longer than 3 s" in r.getMessage() for r in caplog.records)
    finally:
        p.close()


@posix_only
def test_a_compiler_killed_mid_compile_puts_the_signal_on_the_block(tmp_path: Path) -> None:
    marker = tmp_path / "compiling"

    class Slow(Block):
        type_name = "SlowCompile"

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel(_SlowSource(code=GAIN, marker=str(marker)))
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=like("In"))
            b.scalar("Gain", k.in_(2), default=1.0)
            k.auto_grid(like("In"), count_param=3)

    builder = KernelBuilder(
        arch="sm_90", cache=CubinCache(False), modules=_Loader(device_key="t"), make_current=lambda: None
    )
    tracker = KernelTracker(builder, watch_files=False)
    c = Context()
    slow = c.register_block(Slow(name="slow"))
    try:
        tracker.resolve(c.snapshot())
        tracker.flush()
        pid = int(_wait_for(marker))
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        tracker.collect(wait=True, timeout=60)
        (diag,) = tracker.diagnostics()
        assert diag.block_id == slow.id and diag.severity == "error"
        assert "crashed on this kernel" in diag.message and "killed by SIGKILL" in diag.message
        _, status = tracker.resolve(c.snapshot())
        assert "SIGKILL" in status[(slow.id, 0)][2]
        assert builder.build(CudaSource(code=_gain(4))).image.image.startswith(ELF)  # a new child compiles
    finally:
        tracker.close()


def test_a_child_that_dies_at_startup_names_its_stderr(proc: CompilerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHOME", "/nonexistent/python-home")  # the interpreter cannot find its stdlib
    jobs = [proc.send(CudaSource(code=_gain(i)), "sm_90") for i in range(2)]
    for job in jobs:
        proc.wait(job, timeout=60)
    for job in jobs:  # every job fails: none of them was the cause
        text = str(job.error)
        assert "did not start" in text and "exited with code 1" in text and "encodings" in text, text
    monkeypatch.delenv("PYTHONHOME")
    again = proc.send(CudaSource(code=_gain(5)), "sm_90")
    proc.wait(again, timeout=60)
    assert again.error is None


def test_the_child_gets_the_parents_sys_path(proc: CompilerProcess, tmp_path: Path) -> None:
    pkg = tmp_path / "only_the_parent_knows"
    pkg.mkdir()
    (pkg / "mykernels.py").write_text(
        "from cudapatch import CudaSource\n\nclass MySource(CudaSource):\n    pass\n", encoding="utf-8"
    )
    sys.path.insert(0, str(pkg))
    try:
        import mykernels  # type: ignore[import-not-found]

        job = proc.send(mykernels.MySource(code=GAIN), "sm_90")
        proc.wait(job, timeout=60)
        assert job.error is None and job.image is not None
    finally:
        sys.path.remove(str(pkg))
    # A source whose module the child cannot import fails its own job with the reason, not the child.
    proc.close()
    late = CompilerProcess()
    try:
        job = late.send(mykernels.MySource(code=_gain(6)), "sm_90")
        proc_ok = late.send(CudaSource(code=_gain(6)), "sm_90")
        late.wait(job, timeout=60)
        late.wait(proc_ok, timeout=60)
        assert isinstance(job.error, KernelLoadError) and "No module named 'mykernels'" in str(job.error)
        assert proc_ok.error is None and late.crashes == 0
    finally:
        late.close()
        sys.modules.pop("mykernels", None)


def test_the_interpreter_choice_for_embedded_hosts_and_frozen_apps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDAPATCH_COMPILER_PYTHON", raising=False)
    monkeypatch.delenv("CUDAPATCH_COMPILE_PROCESSES", raising=False)
    assert compiler_python() == (sys.executable, "sys.executable") and processes_allowed()
    real = sys.executable
    monkeypatch.setattr(sys, "executable", "/Applications/TouchDesigner.app/Contents/MacOS/TouchDesigner")
    assert compiler_python() is None and not processes_allowed() and cp.compiler_process() is None
    monkeypatch.setenv("CUDAPATCH_COMPILER_PYTHON", real)
    assert compiler_python() == (real, "CUDAPATCH_COMPILER_PYTHON") and processes_allowed()
    monkeypatch.delenv("CUDAPATCH_COMPILER_PYTHON")
    monkeypatch.setattr(sys, "executable", real)
    monkeypatch.setattr(sys, "frozen", True, raising=False)  # PyInstaller: sys.executable is the app
    assert compiler_python() is None
    cp.set_compiler_python(Path(real))
    try:
        assert compiler_python() == (real, "set_compiler_python()")
    finally:
        cp.set_compiler_python(None)
    monkeypatch.setenv("CUDAPATCH_COMPILE_PROCESSES", "0")
    assert not processes_allowed()


def test_an_explicit_interpreter_compiles_and_a_wrong_one_is_a_clear_error(
    proc: CompilerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CUDAPATCH_COMPILER_PYTHON", sys.executable)  # its own paths first, then ours
    job = proc.send(CudaSource(code=_gain(7)), "sm_90")
    proc.wait(job, timeout=60)
    assert job.error is None
    proc.close()
    missing = CompilerProcess()
    monkeypatch.setenv("CUDAPATCH_COMPILER_PYTHON", str(tmp_path / "no-python"))
    try:
        job = missing.send(CudaSource(code=GAIN), "sm_90")
        assert job.done and isinstance(job.error, KernelCompileError)
        text = str(job.error)
        assert "cannot start the compiler process" in text and "no-python" in text
        assert f"Python {sys.version_info[0]}.{sys.version_info[1]}" in text and "CUDAPATCH_COMPILER_PYTHON" in text
    finally:
        missing.close()


@posix_only
def test_an_executable_that_does_not_speak_the_protocol_is_ended(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'Welcome to SomeHost 2025, loading your project'\nsleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDAPATCH_COMPILER_PYTHON", str(fake))
    p = CompilerProcess()
    try:
        job = p.send(CudaSource(code=GAIN), "sm_90")
        p.wait(job, timeout=60)
        text = str(job.error)
        assert "did not start" in text and "not cudapatch's protocol" in text and "killed by SIGKILL" in text, text
    finally:
        p.close()


def test_frames_arrive_in_pieces_and_a_corrupt_header_is_refused() -> None:
    data = encode_frame(("ready", 1, (3, 11), 42)) + encode_frame((7, b"\0" * 70_000))
    reader = FrameReader()
    got = []
    for i in range(0, len(data), 4093):
        got += reader.feed(data[i : i + 4093])
    import pickle

    assert [pickle.loads(p) for p in got] == [("ready", 1, (3, 11), 42), (7, b"\0" * 70_000)]
    with pytest.raises(ValueError, match="corrupt"):
        FrameReader().feed((MAX_FRAME + 1).to_bytes(8, "big"))


def test_exit_statuses_in_words() -> None:
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(-9).startswith("killed by SIGKILL (the system may have run out of memory")
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(None) == "closed its output but is still running"


def test_a_closed_process_fails_its_jobs_and_new_ones(proc: CompilerProcess) -> None:
    pending = proc.send(CudaSource(code=_gain(8)), "sm_90")
    proc.close()
    proc.close()  # idempotent
    assert pending.done and "closed before this kernel compiled" in str(pending.error)
    late = proc.send(CudaSource(code=GAIN), "sm_90")
    assert late.done and isinstance(late.error, KernelCompileError) and proc.is_closed
    assert repr(proc) == "<CompilerProcess pid=None jobs=0 closed=True>"


def test_start_brings_the_child_up_before_any_job(proc: CompilerProcess) -> None:
    pid = proc.start()
    assert pid is not None and pid == proc.child_pid and proc.start() == pid  # once
    job = proc.send(CudaSource(code=_gain(10)), "sm_90")
    proc.wait(job, timeout=60)
    assert job.error is None and proc.child_pid == pid


@posix_only
def test_a_child_that_never_says_ready_is_ended(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nsleep 600\n")  # a host binary that opens its window and waits
    fake.chmod(0o755)
    monkeypatch.setenv("CUDAPATCH_COMPILER_PYTHON", str(fake))
    monkeypatch.setattr(_child_pipe, "READY_TIMEOUT_S", 0.5)
    p = CompilerProcess()
    try:
        job = p.send(CudaSource(code=GAIN), "sm_90")
        p.wait(job, timeout=30)
        assert "did not start" in str(job.error) and "did not answer within 0 s" in str(job.error)
    finally:
        p.close()


def test_threads_share_one_process(proc: CompilerProcess) -> None:
    import threading

    results: dict[int, list[bool]] = {}

    def engine(t: int) -> None:  # each engine's builder thread sends and polls on its own
        jobs = [proc.send(CudaSource(code=_gain(100 + 10 * t + i)), "sm_90") for i in range(3)]
        for job in jobs:
            proc.wait(job, timeout=120)
        results[t] = [j.error is None and j.image is not None and j.image.image.startswith(ELF) for j in jobs]

    threads = [threading.Thread(target=engine, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    assert results == {t: [True] * 3 for t in range(4)} and proc.in_flight == 0 and proc.crashes == 0


class _OtherDescriptor(CudaSource):
    """A source whose compiled image carries another descriptor than ``describe()`` gives."""

    def compile(self, arch: str) -> KernelImage:
        image = super().compile(arch)
        return dataclasses.replace(image, descriptor=dataclasses.replace(image.descriptor, entry_point="other"))


def test_an_image_comes_back_without_its_sources_descriptor_and_the_parent_puts_it_back(proc: CompilerProcess) -> None:
    """Unpickling a fused group's descriptor held the parent's interpreter in one C call: the child
    leaves out a descriptor the parent can take from the source, and only that one."""
    from tests.unit.test_specialize import _bits, _fused_chain

    _, _, _, node = _fused_chain(40)
    special = node.source.specialized(((0, _bits(1.5)),))
    reply = ch._reply(7, *ch._compile(pickle.dumps(special), "sm_90"))
    assert b"KernelParamDescriptor" not in reply and b"KernelDescriptor" not in reply
    other = _OtherDescriptor(code=GAIN)
    assert b"KernelDescriptor" in ch._reply(8, *ch._compile(pickle.dumps(other), "sm_90"))
    jobs = [proc.send(s, "sm_90") for s in (special, other, CudaSource(code=GAIN))]
    for job in jobs:
        proc.wait(job, timeout=60)
    assert all(j.done and j.error is None for j in jobs), [j.error for j in jobs]
    assert jobs[0].image.descriptor == node.descriptor == special.describe()  # type: ignore[union-attr]
    assert jobs[1].image.descriptor.entry_point == "other"  # type: ignore[union-attr]
    assert jobs[2].image.descriptor == CudaSource(code=GAIN).describe()  # type: ignore[union-attr]
