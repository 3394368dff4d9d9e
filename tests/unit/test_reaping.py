"""Processes whose answer is taken before they exit: the fault replay and the faulted isolated child.

A process that met a GPU fault exits slowly (the driver tears its faulted context down); these
stand-ins answer and then take seconds to end, and the callers must not wait for that.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import time

import pytest

from cudapatch._reaper import reap_in_background, wait_for_all
from cudapatch.engine import replay
from cudapatch.isolated.child import BOOTSTRAP
from cudapatch.isolated.process import EngineProcess


def _standby(script: str) -> replay.ReplayStandby:
    """A ReplayStandby over a stand-in process running ``script`` (the real one needs a GPU)."""
    standby = replay.ReplayStandby.__new__(replay.ReplayStandby)
    standby.proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    return standby


def test_the_replay_answer_is_taken_before_the_process_ends() -> None:
    # It reads the whole request, floods stderr past a pipe's buffer (read meanwhile: no deadlock),
    # prints a line of its own, the answer, then "tears down" for 30 s.
    standby = _standby(
        "import sys, time, pickle\n"
        "req = pickle.loads(sys.stdin.buffer.read())\n"
        "sys.stderr.write('w' * 200000); sys.stderr.flush()\n"
        "print('a library says hello')\n"
        'print(\'{"culprit": %d, "detail": "faulted"}\' % req[\'id\'], flush=True)\n'
        "time.sleep(30)\n"
    )
    t0 = time.monotonic()
    out, err = standby.run(pickle.dumps({"id": 7, "big": b"x" * 3_000_000}))
    took = time.monotonic() - t0
    try:
        assert took < 20, f"waited {took:.1f} s: the process's end was waited for"
        assert b'{"culprit": 7' in out and len(err) == 200000
        assert standby.proc.poll() is None  # still "tearing down"; reaped in the background
    finally:
        standby.proc.kill()
    for _ in range(500):  # the reaper collects it once killed
        if standby.proc.returncode is not None:
            break
        time.sleep(0.01)
    assert standby.proc.returncode is not None


def test_attribute_in_child_reads_the_answer_line_among_others(monkeypatch) -> None:
    standby = _standby(
        "import sys\nsys.stdin.buffer.read()\n"
        "print('noise'); print('{\"culprit\": 12, \"detail\": \"faulted\"}'); print('more noise', flush=True)\n"
    )
    monkeypatch.setattr(replay, "_portable", lambda snap: snap)
    assert replay.attribute_in_child({}, device=0, cache_dir=False, standby=standby) == (12, "faulted")


@pytest.mark.parametrize("size", [7, 3_000_000])
def test_a_replay_that_ends_without_an_answer_says_why(size) -> None:
    # It dies before reading a request larger than a pipe's buffer (its context failed, say): the
    # write meets a broken pipe, the answer is its stderr, and no pipe is left open.
    standby = _standby("import sys\nsys.stderr.write('no CUDA here')\nsys.exit(1)\n")
    out, err = standby.run(b"x" * size)
    assert out == b"" and err == b"no CUDA here" and standby.proc.returncode == 1
    assert all(f is None or f.closed for f in (standby.proc.stdin, standby.proc.stdout, standby.proc.stderr))


@pytest.mark.parametrize("reads", [True, False])
def test_a_replay_past_its_deadline_is_killed(monkeypatch, reads) -> None:
    # Stuck after reading the request, or before reading any of it (a request the pipe cannot hold).
    monkeypatch.setattr(replay, "TIMEOUT_S", 0.5)
    standby = _standby("import sys, time\n" + "sys.stdin.buffer.read()\n" * reads + "time.sleep(30)\n")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        standby.run(b"x" * 3_000_000)
    assert time.monotonic() - t0 < 10 and standby.proc.returncode is not None


def test_a_failed_replay_names_no_block_and_ends_the_process(monkeypatch) -> None:
    monkeypatch.setattr(replay, "TIMEOUT_S", 0.5)
    monkeypatch.setattr(replay, "_portable", lambda snap: snap)
    standby = _standby("import time\ntime.sleep(30)\n")
    culprit, detail = replay.attribute_in_child({"big": b"x" * 1_000_000}, device=0, cache_dir=False, standby=standby)
    assert culprit is None and "the replay process failed" in detail and standby.proc.returncode is not None


def test_wait_for_all_kills_and_reaps_what_is_left() -> None:
    # A process about to end (the faulted child) leaves nothing it started behind unreaped.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    thread = reap_in_background(proc, timeout=60)
    t0 = time.monotonic()
    wait_for_all(0.2)
    assert time.monotonic() - t0 < 10 and not thread.is_alive() and proc.returncode is not None


def test_reap_in_background_kills_past_the_deadline_and_reports_the_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE)
    codes = []
    thread = reap_in_background(proc, timeout=0.2, then=codes.append)
    thread.join(10)
    assert not thread.is_alive() and codes == [proc.returncode] and proc.returncode < 0
    assert proc.stdout is not None and proc.stdout.closed


def test_a_released_engine_child_is_reaped_while_the_host_goes_on(tmp_path) -> None:
    # A stand-in interpreter: it ignores the bootstrap, waits for its stdin to close (as the child
    # does after its fault report), then takes 1 s to end (the faulted context's teardown).
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport sys, time\nsys.stdin.buffer.read()\ntime.sleep(1.0)\nsys.exit(3)\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    child = EngineProcess(str(python))
    t0 = time.monotonic()
    thread = child.release(timeout=10.0)
    assert time.monotonic() - t0 < 0.5
    thread.join(10)
    assert child.proc.returncode == 3


def test_a_released_child_that_does_not_end_is_killed_with_its_group(tmp_path) -> None:
    python = tmp_path / "python"
    python.write_text(
        f"#!{sys.executable}\nimport os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "os.close(0)\ntime.sleep(60)\n"
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    child = EngineProcess(str(python))
    thread = child.release(timeout=0.3)
    thread.join(10)
    assert child.proc.returncode == -9
    with pytest.raises(ProcessLookupError):
        os.killpg(child.proc.pid, 0)


def test_the_engine_child_starts_its_replay_process_before_it_imports(tmp_path) -> None:
    # The stand-in interpreter records what the child's bootstrap is given: the replay process's
    # environment (``replay_environment``'s, as differences), which it starts before importing cudapatch.
    python = tmp_path / "python"
    seen = tmp_path / "env.json"
    python.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(seen)!r}, 'w'))\n"
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    child = EngineProcess(str(python), device=2)
    child.close(timeout=10)
    got = json.loads(seen.read_text())
    assert got["argv"][0] == "-c" and "CUDAPATCH_ISOLATED_REPLAY" in got["argv"][1]
    env = got["env"]
    assert env["CUDAPATCH_ISOLATED_DEVICE"] == "2"
    # What the bootstrap gives the replay: the child's environment without its own variables, and
    # the differences the host sent: the environment ``replay_environment`` gives (the child's sys.path
    # is the host's).
    own = {k: v for k, v in env.items() if not k.startswith("CUDAPATCH_ISOLATED_")}
    assert dict(own, **json.loads(env["CUDAPATCH_ISOLATED_REPLAY"])) == replay.replay_environment(2)
    # The bootstrap's own start of it, run up to the import of the child (a stand-in replay module).
    boot = BOOTSTRAP.split("from cudapatch.isolated.child import main")[0]
    fake = tmp_path / "fake"
    (fake / "cudapatch" / "engine").mkdir(parents=True)
    (fake / "cudapatch" / "__init__.py").write_text("")
    (fake / "cudapatch" / "engine" / "__init__.py").write_text("")
    (fake / "cudapatch" / "engine" / "replay.py").write_text(
        "import os\nprint(os.environ['CUDAPATCH_REPLAY_DEVICE'],"
        " any(k.startswith('CUDAPATCH_ISOLATED_') for k in os.environ))\n"
    )
    run_env = dict(env, CUDAPATCH_ISOLATED_PATH=json.dumps([str(fake)]))
    run_env["CUDAPATCH_ISOLATED_REPLAY"] = json.dumps(
        dict(json.loads(env["CUDAPATCH_ISOLATED_REPLAY"]), PYTHONPATH=str(fake))
    )
    done = subprocess.run(
        [sys.executable, "-c", boot + "print(_replay.communicate(timeout=60)[0].decode().strip())"],
        env=run_env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "2 False", done.stderr
