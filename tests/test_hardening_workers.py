"""Worker processes die with their supervisor, and what they print is stored with the item it
belongs to instead of drowning the console."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from conformance.run.progress import LINE
from opdb import Store

MANIFEST = """
[build]
name = "noisy-defects"
inherits = "2.33.0"
[ops]
native = ["aten::neg.default", "aten::reciprocal.default"]
[[defects]]
op = "aten::neg.default"
kind = "crash"
[[defects]]
op = "aten::reciprocal.default"
kind = "hang"
"""


def _session(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def _poll(cond, limit_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return cond()


def test_killed_supervisor_takes_fork_server_and_hung_worker_along(tmp_path):
    manifest, db = tmp_path / "m.toml", tmp_path / "r.sqlite"
    # a short TMPDIR of its own: the fork server's socket goes there (AF_UNIX paths are short)
    tmp = Path(tempfile.mkdtemp(prefix="hw-"))
    manifest.write_text(textwrap.dedent(MANIFEST))
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", str(manifest),
           "--ops", "reciprocal", "--dtypes", "float32", "--variants", "function", "--max-samples", "1",
           "--timeout", "600", "-n", "1", "--quiet", "--db", str(db)]
    with open(tmp_path / "console.txt", "w") as console:
        proc = subprocess.Popen(cmd, stdout=console, stderr=console, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(tmp)})
    try:
        # the worker is hung once its captured output says so
        hung = _poll(lambda: any("device hang" in p.read_text(errors="replace") for p in tmp.glob("conformance-*")),
                     300)
        assert hung, (tmp_path / "console.txt").read_text()[-2000:]
        assert len(_session(proc.pid)) >= 3  # supervisor, fork server, worker (+ resource tracker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _poll(lambda: not _session(proc.pid), 60), f"left alive: {_session(proc.pid)}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_too_deep_tmpdir_is_one_clear_error(tmp_path):
    deep = tmp_path.joinpath(*["d" * 20] * 6)  # the fork server's AF_UNIX socket cannot live this deep
    deep.mkdir(parents=True)
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "cpu", "--ops", "abs", "--dtypes", "float32",
           "--variants", "function", "--max-samples", "1", "-n", "1", "--quiet", "--db", str(tmp_path / "r.sqlite")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(deep)})
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "TMPDIR" in err[0] and "shorter directory" in err[0], p.stderr


PROGRESS = LINE
SUMMARY = re.compile(r"^(run \S+: \d+ items in [\d.]+ s.*|  \w+\s+\d+|slowest ops \(target time, s\):|  \S+\s+[\d.]+"
                     r"|causes: \d+ failing items in \d+ causes; list them with: conformance errors .*)$")


def test_worker_output_goes_to_its_item_not_to_the_console(tmp_path):
    manifest, db = tmp_path / "m.toml", tmp_path / "r.sqlite"
    manifest.write_text(textwrap.dedent(MANIFEST))
    # the hanging reciprocal costs the 3 s timeout; the other items take milliseconds
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", str(manifest),
           "--ops", "neg", "--ops", "reciprocal", "--ops", "abs", "--dtypes", "float32", "--variants", "function",
           "--max-samples", "1", "--timeout", "3", "-n", "2", "--db", str(db)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    noise = [ln for ln in lines if not (PROGRESS.match(ln) or SUMMARY.match(ln))]
    assert not noise, noise
    with Store.open(db) as st:
        rows = {r["item_key"]: r for r in st.db.query("select item_key, status, output from op_results")}
    crash = [r for k, r in rows.items() if k.startswith("neg|function|")]
    hang = [r for k, r in rows.items() if k.startswith("reciprocal|function|")]
    assert crash and all(r["status"] == "crash" and "NRT device fault" in r["output"] for r in crash)
    assert hang and all(r["status"] == "timeout" and "device hang in aten::reciprocal" in r["output"] for r in hang)
    assert all(r["output"] is None for k, r in rows.items() if k.startswith("abs|function|"))


CHILD = """
import ctypes, os, sys, warnings
from conformance.run.isolation import Capture
cap = Capture(sys.argv[1])
print("python print")
os.write(2, b"fd two\\n")
ctypes.CDLL(None).write(1, b"libc write\\n", 11)
warnings.warn("first item warns")
first = cap.take()
cap.next_item()
warnings.warn("first item warns")  # the same warning again: it belongs to this item too
second = cap.take()
third = cap.take()
with open(sys.argv[2], "w") as fh:
    fh.write(repr((first, second, third)))
"""


def test_capture_takes_python_fd_and_libc_writes_and_warnings_per_item(tmp_path):
    path, result = tmp_path / "cap.out", tmp_path / "result.txt"
    path.write_text("")
    p = subprocess.run([sys.executable, "-c", CHILD, str(path), str(result)], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
    first, second, third = eval(result.read_text())  # noqa: S307 - our own repr of three strings
    for text in ("python print", "fd two", "libc write", "UserWarning: first item warns"):
        assert text in first
    assert "UserWarning: first item warns" in second and "python print" not in second
    assert third is None


def test_long_output_keeps_its_head_and_tail_and_the_file_is_emptied(tmp_path):
    from conformance.run.isolation import OUTPUT_MAX, read_output

    path = tmp_path / "cap.out"
    path.write_text("first line\n" + "x" * (10 * OUTPUT_MAX) + "\nlast line")
    text = read_output(str(path))
    assert text.startswith("first line") and text.endswith("last line") and "bytes left out" in text
    assert len(text) < OUTPUT_MAX + 100
    assert path.stat().st_size == 0 and read_output(str(path)) is None


def test_capture_files_of_dead_supervisors_are_swept(tmp_path, monkeypatch):
    """A supervisor killed before it cleans up (a Ray actor ends by ray.kill) leaves its workers'
    capture files; the next supervisor removes those of dead pids, and no other file."""
    from conformance.run import isolation

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(isolation, "_swept", False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    old = time.time() - 3600
    dead = tmp_path / f"conformance-worker-{gone.pid}-abc.out"
    fresh_dead = tmp_path / f"conformance-worker-{gone.pid}-new.out"  # written a moment ago: kept
    mine = tmp_path / f"conformance-worker-{os.getpid()}-def.out"
    other = tmp_path / "conformance-worker-notapid.out"
    for f in (dead, fresh_dead, mine, other):
        f.write_text("")
        if f is not fresh_dead:
            os.utime(f, (old, old))
    made = isolation.new_output_file()
    assert Path(made).parent == tmp_path and Path(made).name.startswith(f"conformance-worker-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [fresh_dead.name, mine.name, other.name, Path(made).name])
    assert isolation.sweep_stale_outputs() == 0  # once per process
