"""The stage runner's children are real processes: they die with the run (SIGTERM, Ctrl-C, SIGKILL), what a
killed run left is stopped and removed by the next run, two runs of a stage never overlap, logs are rotated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A stage whose one step starts a child that starts a grandchild; both record their pids, the grandchild
# keeps (re)creating the run's temporary directory and appending to a file in it, as an export tool does.
RUNNER = """
import sys
from pathlib import Path
from trtllm_forge.stages import run_stage

workdir, marker = Path(sys.argv[1]), sys.argv[2]
child = str(Path(__file__).with_name("child.py"))


def body(tmp, recorder):
    if marker == "quick":
        recorder.run([sys.executable, "-c", "print('done')"], step="work")
        (tmp / "out.txt").write_text("complete")
        return {"out": "out.txt"}
    recorder.run([sys.executable, child, str(workdir), str(tmp)], step="work")
    return {}


run_stage(workdir, "demo", {"marker": marker}, {}, body)
"""
CHILD = """
import os, subprocess, sys, time
from pathlib import Path

workdir, tmp = Path(sys.argv[1]), sys.argv[2]
(workdir / "child.pid").write_text(str(os.getpid()))
subprocess.Popen([sys.executable, str(Path(__file__).with_name("grandchild.py")), tmp, str(workdir)])
time.sleep(600)
"""
GRANDCHILD = """
import os, sys, time
from pathlib import Path

tmp = Path(sys.argv[1])
(Path(sys.argv[2]) / "grandchild.pid").write_text(str(os.getpid()))
while True:
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / "partial.bin", "ab") as out:
        out.write(b"x")
    time.sleep(0.2)
"""


def start_runner(tmp_path: Path, marker: str = "slow") -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "runner.py"
    for name, text in (("runner.py", RUNNER), ("child.py", CHILD), ("grandchild.py", GRANDCHILD)):
        (tmp_path / name).write_text(text)
    workdir = tmp_path / "wd"
    workdir.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(script), str(workdir), marker], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, workdir


def wait_for(predicate, seconds: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def pids_of(workdir: Path) -> tuple[int, int]:
    wait_for(lambda: (workdir / "child.pid").is_file() and (workdir / "grandchild.pid").is_file(), what="the child and grandchild")
    return int((workdir / "child.pid").read_text()), int((workdir / "grandchild.pid").read_text())


@pytest.fixture
def cleanup():
    """Kill whatever a test's processes left (so a failing test does not leak them into the session)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_stop_child_and_grandchild(tmp_path, cleanup, sig):
    runner, workdir = start_runner(tmp_path)
    child, grandchild = pids_of(workdir)
    cleanup += [child, grandchild]
    # The child leads its own process group: Ctrl-C in a terminal reaches only the run, which stops the group.
    assert os.getpgid(child) == child != os.getpgid(runner.pid)
    runner.send_signal(sig)
    _, _stderr = runner.communicate(timeout=60)
    assert runner.returncode != 0
    wait_for(lambda: not alive(child) and not alive(grandchild), what="the children to stop")
    assert not list(workdir.glob(".demo.tmp-*")), "the interrupted run's temporary directory is left"


def test_sigkill_of_the_run_kills_the_child_and_the_rerun_stops_what_is_left(tmp_path, cleanup):
    runner, workdir = start_runner(tmp_path)
    child, grandchild = pids_of(workdir)
    cleanup += [child, grandchild]
    (stale,) = workdir.glob(".demo.tmp-*")
    assert os.environ.get("TRTLLM_FORGE_RUN") is None
    runner.kill()
    runner.wait(timeout=30)
    # The direct child gets the parent-death signal from the kernel.
    wait_for(lambda: not alive(child), what="the child to die with its parent")
    # The grandchild is beyond its reach and keeps writing into the dead run's temporary directory ...
    assert alive(grandchild)

    rerun, _ = start_runner(tmp_path, "quick")
    _, stderr = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, stderr
    # ... until the next run of the stage stops it (it carries the dead run's id) and removes the directory.
    assert not alive(grandchild)
    time.sleep(1.0)  # the grandchild wrote every 0.2 s: had it survived, the directory would be back
    assert not stale.exists()
    assert not list(workdir.glob(".demo.tmp-*"))
    assert (workdir / "demo" / "out.txt").read_text() == "complete"


def test_a_second_run_of_the_same_stage_fails_at_once_and_leaves_the_first_alone(tmp_path, cleanup):
    runner, workdir = start_runner(tmp_path)
    child, grandchild = pids_of(workdir)
    cleanup += [child, grandchild, runner.pid]
    second, _ = start_runner(tmp_path, "quick")
    _, stderr = second.communicate(timeout=120)
    try:
        assert second.returncode == 1
        assert f"demo: pid {runner.pid} is already running this stage in {workdir}" in stderr
        assert alive(child) and alive(grandchild), "the second run killed the first run's processes"
        assert list(workdir.glob(".demo.tmp-*")), "the second run removed the first run's temporary directory"
    finally:
        runner.terminate()
        runner.communicate(timeout=60)


def test_rerun_rotates_the_step_log(tmp_path):
    from trtllm_forge.stages import run_stage

    workdir = tmp_path / "wd"

    def body(value):
        def run(tmp, recorder):
            recorder.run([sys.executable, "-c", f"print('run {value}')"], step="work")
            return {}

        return run

    for value in (1, 2, 3):
        run_stage(workdir, "demo", {"value": value}, {}, body(value))
    logs = workdir / "logs"
    assert "run 3" in (logs / "demo-work.log").read_text()
    assert "run 2" in (logs / "demo-work.1.log").read_text()
    assert "run 1" in (logs / "demo-work.2.log").read_text()


def test_rotate_log_keeps_a_bounded_number(tmp_path):
    from trtllm_forge.stages import rotate_log

    log = tmp_path / "x.log"
    for i in range(5):
        rotate_log(log, keep=3)
        log.write_text(str(i))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.1.log", "x.2.log", "x.3.log", "x.log"]
    assert [(tmp_path / n).read_text() for n in ("x.log", "x.1.log", "x.2.log", "x.3.log")] == ["4", "3", "2", "1"]


def test_timeout_stops_the_childs_whole_group(tmp_path):
    from trtllm_forge.errors import StepError
    from trtllm_forge.stages import StageRecorder

    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(600)\n"
    )
    recorder = StageRecorder(stage="demo", logs_dir=tmp_path / "logs")
    for timeout in (2, 4, 8, 16, 32):  # a busy machine may not have started the grandchild within a short timeout
        with pytest.raises(StepError, match="timed out"):
            recorder.run([sys.executable, "-c", code], step="work", timeout=timeout)
        if pid_file.is_file() and pid_file.read_text():
            break
    grandchild = int(pid_file.read_text())
    wait_for(lambda: not alive(grandchild), what="the grandchild to stop")


@pytest.mark.slow
def test_sigkill_of_import_kills_its_converter(tmp_path):
    """`kill -9` of the `import` process alone (not its group): the gguf_to_hf child must not keep running
    and write into the workdir after a re-run."""
    from test_import import _converter_pids, _start_import, _wait_for_conversion

    workdir = tmp_path / "wd"
    proc = _start_import(workdir)
    _wait_for_conversion(proc, workdir)
    converters = _converter_pids(workdir)
    try:
        assert converters and all(os.getpgid(pid) != os.getpgid(proc.pid) for pid in converters)
        proc.kill()
        proc.communicate(timeout=30)
        wait_for(lambda: not _converter_pids(workdir), seconds=30, what="the converter to die with import")
    finally:
        for pid in converters:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
