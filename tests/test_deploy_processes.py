"""Processes and state of `deploy` against a real tritonserver: a killed server's python stubs are found by the
recorded group and stopped, logs are rotated, `deploy status` exits 3 when nothing runs, and racing `deploy`
commands start one server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import run_cli, write_tiny_repository

CONFIG = """name: deploy-procs
model: {source: smollm2-135m}
engine: {backend: openvino}
triton: {http_port: 0, grpc_port: 0, metrics_port: 0}
deploy: {ready_timeout_s: 120}
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, seconds: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def servers_of(workdir: Path) -> list[int]:
    """tritonserver processes running in `workdir` (deploy starts them there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if argv0.endswith(b"/tritonserver") and cwd == str(workdir) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_servers(workdir: Path) -> None:
    """Last-resort cleanup (a failing test must not leak servers): SIGKILL each server's whole group."""
    for pid in servers_of(workdir):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def setup(tmp_path):
    config = tmp_path / "deploy.yaml"
    config.write_text(CONFIG)
    repo = write_tiny_repository(tmp_path / "repo")
    workdir = (tmp_path / "wd").resolve()
    yield config, repo, workdir
    run_in_process("deploy", "stop", "--workdir", str(workdir), "--grace", "5")
    kill_servers(workdir)


def deploy(config: Path, repo: Path, workdir: Path) -> subprocess.CompletedProcess:
    return run_cli("deploy", str(config), "--workdir", str(workdir), "--repository", str(repo), "--json")


@pytest.mark.slow
def test_killed_server_stubs_are_reported_and_stopped_and_its_log_is_kept(setup):
    """Started from a process that stays alive (as `run` or `bench` do), a server killed with SIGKILL stays an
    unreaped child, and its python stubs, seeing their parent still there, keep running (and spinning)."""
    from conftest import forge_test_config

    from trtllm_forge.deploy import start_server
    from trtllm_forge.processes import group_members, run_mark_of

    config, repo, workdir = setup
    state = start_server(forge_test_config(), workdir, repo).to_dict()

    stubs = [pid for pid in group_members(state["pgid"]) if pid != state["pid"]]
    assert len(stubs) == 2  # echo and words
    assert {run_mark_of(pid) for pid in [state["pid"], *stubs]} == {state["run_id"]}, "the stubs must carry the run mark"
    log = workdir / "logs" / "tritonserver.log"
    first_command = log.read_text().splitlines()[0]
    assert f"--http-port={state['ports']['http']}" in first_command

    os.kill(state["pid"], signal.SIGKILL)  # the server alone: its stubs stay behind
    wait_for(lambda: not alive(state["pid"]), what="the server to die")
    time.sleep(2)
    assert all(alive(pid) for pid in stubs)

    # `deploy status` and `stop` from another process, as a user runs them: in this process the killed server is
    # our own unreaped child, which changes what /proc shows.
    status = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
    assert status.returncode == 3, status.stderr
    doc = json.loads(status.stdout)
    assert doc["running"] is False and sorted(doc["leftover_pids"]) == sorted(stubs)
    human = run_cli("deploy", "status", "--workdir", str(workdir))
    assert human.returncode == 3
    assert "2 process(es) the dead server left running" in human.stderr and "deploy stop" in human.stderr

    second = deploy(config, repo, workdir)
    assert second.returncode == 0, second.stderr
    assert "stopping 2 process(es) the dead server" in second.stderr
    assert not any(alive(pid) for pid in stubs), "the next deploy left the dead server's stubs running"
    new_state = json.loads(second.stdout)
    # The crashed server's log is kept beside the new one.
    assert (workdir / "logs" / "tritonserver.1.log").read_text().splitlines()[0] == first_command
    assert f"--http-port={new_state['ports']['http']}" in log.read_text().splitlines()[0]

    stop = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert stop.returncode == 0, stop.stderr
    assert not group_members(new_state["pgid"])
    after = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
    assert after.returncode == 3 and json.loads(after.stdout)["running"] is False
    from trtllm_forge.deploy.local_runner import pid_alive

    assert not pid_alive(state["pid"])  # reaps the killed server (our child)


def test_stop_never_signals_a_process_the_deployment_did_not_start(tmp_path):
    """The server died; its recorded group id now belongs to someone else (ids are recycled): left alone. A
    process of the group carrying the deployment's run mark is a leftover: reported and stopped."""
    from trtllm_forge.deploy.state import TritonDeployment, write_state

    def sleeper(mark: str | None) -> subprocess.Popen:
        env = {**os.environ, "TRTLLM_FORGE_RUN": mark} if mark else {k: v for k, v in os.environ.items() if k != "TRTLLM_FORGE_RUN"}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env, start_new_session=True)

    finished = subprocess.Popen(["true"])
    finished.wait()

    def record(pgid: int, run_id: str) -> None:
        """A deployment whose server (a pid that has exited) led group `pgid`."""
        write_state(
            TritonDeployment(
                running=True,
                pid=finished.pid,
                pgid=pgid,
                host="127.0.0.1",
                bind_address="127.0.0.1",
                ports={"http": 1, "grpc": 2, "metrics": 3},
                repository=str(tmp_path / "repo"),
                models={},
                started_at="2026-01-01T00:00:00Z",
                command=["/opt/tritonserver/bin/tritonserver"],
                log=str(tmp_path / "log"),
                workdir=str(tmp_path / "wd"),
                run_id=run_id,
            )
        )

    stranger = sleeper(None)
    ours = sleeper("feedfacefeedface")
    try:
        record(stranger.pid, "feedfacefeedface")
        stop = run_in_process("deploy", "stop", "--workdir", str(tmp_path / "wd"), "--grace", "2")
        assert stop.returncode == 0, stop.stderr
        assert stranger.poll() is None, "deploy stop killed a process it did not start"

        record(ours.pid, "feedfacefeedface")
        status = run_in_process("deploy", "status", "--workdir", str(tmp_path / "wd"), "--json")
        assert status.returncode == 3
        assert json.loads(status.stdout)["leftover_pids"] == [ours.pid]
        stop = run_in_process("deploy", "stop", "--workdir", str(tmp_path / "wd"), "--grace", "2")
        assert stop.returncode == 0, stop.stderr
        assert ours.wait(timeout=30) is not None
    finally:
        for proc in (stranger, ours):
            proc.kill()
            proc.wait()


# `deploy` with a slow launch plan: widens the window between "is a server running?" and "record the new one",
# where racing commands used to each start a server.
SLOW_DEPLOY = """
import sys, time
import trtllm_forge.deploy.local_runner as local_runner

real = local_runner.plan_launch


def slow(*args, **kwargs):
    plan = real(*args, **kwargs)
    time.sleep(3)
    return plan


local_runner.plan_launch = slow  # what the local runner's plan calls, with the deploy lock held
from trtllm_forge.cli import main

main(sys.argv[1:])
"""


@pytest.mark.slow
def test_racing_deploys_start_one_server_and_stop_leaves_none(setup, tmp_path):
    config, repo, workdir = setup
    script = tmp_path / "slow_deploy.py"
    script.write_text(SLOW_DEPLOY)
    argv = [sys.executable, str(script), "deploy", str(config), "--workdir", str(workdir), "--repository", str(repo)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1, 1], results
    for code, stderr in results:
        if code == 1:
            last = stderr.strip().splitlines()[-1]
            assert last.startswith("error: deploy: a server from this workdir is already running"), stderr
    state = json.loads((workdir / "deploy" / "state.json").read_text())
    assert servers_of(workdir) == [state["pid"]]

    stop = run_in_process("deploy", "stop", "--workdir", str(workdir))
    assert stop.returncode == 0, stop.stderr
    assert servers_of(workdir) == []


SERVING = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from conftest import forge_test_config
from trtllm_forge.deploy import serving

with serving(forge_test_config(), Path(sys.argv[1]), Path(sys.argv[2])) as deployment:
    print(deployment.pgid, flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_sigkill_of_a_command_serving_for_its_own_duration_takes_the_server_along(setup, tmp_path):
    """`run` (without --keep-serving), `verify` and `bench` serve only while they run: when such a process is
    killed with SIGKILL, its server and stubs must not stay behind."""
    from trtllm_forge.processes import group_members

    _, repo, workdir = setup
    script = tmp_path / "serving.py"
    script.write_text(SERVING)
    tests_dir = str(Path(__file__).parent)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(workdir), str(repo), tests_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        pgid = int(proc.stdout.readline())
        assert len(group_members(pgid)) == 3  # server and two stubs
        proc.kill()
        proc.wait(timeout=30)
        wait_for(lambda: not group_members(pgid), seconds=60, what="the server and its stubs to die with their caller")
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_deploy_lock_held_by_another_process_gives_one_line_naming_it(tmp_path):
    from trtllm_forge.deploy.state import deploy_lock
    from trtllm_forge.errors import StepError

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from trtllm_forge.deploy.state import deploy_lock\n"
            "with deploy_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
            str(tmp_path / "wd"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StepError) as caught, deploy_lock(tmp_path / "wd", wait_s=0.5):
            pass
        assert f"deploy: pid {holder.pid} has held the deploy lock of {tmp_path / 'wd'}" in caught.value.format_message()
    finally:
        holder.kill()
        holder.wait()
    with deploy_lock(tmp_path / "wd", wait_s=5):  # released when its holder dies, even by SIGKILL
        pass


def test_cpu_seconds_counts_what_a_real_child_burns_and_none_once_it_is_gone():
    from trtllm_forge.processes import cpu_seconds

    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\nimport sys; sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
    try:
        wait_for(lambda: (cpu_seconds(child.pid) or 0.0) >= 0.5, what="the child's CPU time to reach its busy loop's")
        used = cpu_seconds(child.pid)
        assert used is not None and used < 30  # its own seconds, not the machine's or its parent's
    finally:
        child.communicate(b"")
    assert cpu_seconds(child.pid) is None  # reaped: no /proc entry
