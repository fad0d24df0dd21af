"""deploy.server dynamo on CPU, for real: NVIDIA Dynamo 1.6.1's frontend (KV router) and two workers serving our
OpenVINO engine loop, from Dynamo's own venv. ONE deployment for the module (started with `deploy`, stopped by the
last test): status, exact tokens against transformers (`verify`), a refused request, a worker killed with SIGKILL
under load, `deploy` bringing it back, and `deploy stop` leaving no process and no discovery entry."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CONFIGS, TEST_KV_TOKENS, run_cli

from trtllm_forge.deploy import dynamo_local

CONFIG = CONFIGS / "smollm2-cpu-dynamo.yaml"

pytestmark = pytest.mark.skipif(
    not (Path(__file__).resolve().parents[1] / dynamo_local.VENV / "bin" / "python").is_file()
    and dynamo_local.PYTHON_ENV not in os.environ,
    reason="Dynamo's venv is missing: run `make setup`",
)


def test_dry_run_of_the_dynamo_config_lists_the_stages(tmp_path):
    proc = run_cli("run", str(CONFIG), "--dry-run", "--workdir", str(tmp_path / "wd"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dynamo" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def deployed(imported_smollm2, cpu_engine_fp32, tmp_path_factory) -> Any:
    """(config file, workdir, `deploy --json` document): the module's one Dynamo deployment on the session's
    import and fp32 build, with the suite's KV pool."""
    from chain_helpers import reused_workdir

    root = tmp_path_factory.mktemp("dynamo")
    source = yaml.safe_load(CONFIG.read_text())
    source["runtime"]["max_tokens_in_paged_kv_cache"] = TEST_KV_TOKENS
    config_file = root / "dynamo.yaml"
    config_file.write_text(yaml.safe_dump(source))
    workdir = reused_workdir(root, imported_smollm2.parent, cpu_engine_fp32[0] / "build")
    started = run_cli("deploy", str(config_file), "--workdir", str(workdir), "--json", timeout=400)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield config_file, workdir, json.loads(started.stdout)
    finally:
        run_cli("deploy", "stop", "--workdir", str(workdir))


def _post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _status(workdir: Path) -> tuple[int, dict]:
    proc = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
    return proc.returncode, json.loads(proc.stdout)


def test_deploy_starts_a_frontend_and_two_ready_workers(deployed):
    _, workdir, document = deployed
    assert document["server"] == "dynamo" and document["speaks"] == "openai"
    roles = {p["role"]: p for p in document["processes"]}
    assert set(roles) == {"frontend", "worker-0", "worker-1"}
    assert all(p["alive"] and p["ready"] for p in roles.values())
    code, status = _status(workdir)
    assert code == 0 and status["running"] is True
    assert status["http_url"].startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{status['http_url']}/v1/models") as response:
        assert [m["id"] for m in json.loads(response.read())["data"]] == ["smollm2-cpu-dynamo"]
    # Both workers registered through the file store (no etcd): one instance entry each.
    instances = list((workdir / "deploy" / dynamo_local.DISCOVERY_DIR).rglob("instances/*"))
    assert len(instances) == 2, instances


def _worker_logs(document: dict) -> dict[str, Path]:
    return {p["role"]: Path(p["log"]) for p in document["processes"] if p["role"] != "frontend"}


def test_the_kv_router_sends_a_repeated_long_prompt_to_the_worker_that_cached_it(deployed):
    """The workers publish KV events (deploy.dynamo.kv_events, the default): the second and third sending of a
    ~700-token prompt go to the worker whose engine holds its blocks, and that worker's record knows them."""
    _, _, document = deployed
    logs = _worker_logs(document)
    assert all("publishing KV events" in log.read_text() for log in logs.values()), logs
    frontend_argv = document["frontend"]["argv"]
    assert "--no-router-kv-events" not in frontend_argv and frontend_argv[frontend_argv.index("--router-mode") + 1] == "kv"
    frontend_log = Path(document["frontend"]["log"])
    offsets = {role: log.stat().st_size for role, log in {**logs, "frontend": frontend_log}.items()}
    prompt = f"Session {os.getpid()}-{time.time_ns()}. " + " ".join(f"Rule {i}: answer in plain words." for i in range(70))
    sent = [_post(document["http_url"], {"model": "smollm2-cpu-dynamo", "prompt": prompt, "max_tokens": 2}) for _ in range(3)]
    assert [code for code, _ in sent] == [200, 200, 200], sent
    prompt_tokens = sent[0][1]["usage"]["prompt_tokens"]
    assert 600 <= prompt_tokens <= 1000, prompt_tokens
    served: dict[str, list[int]] = {}
    for role, log in logs.items():
        with log.open() as handle:
            handle.seek(offsets[role])
            for line in handle:
                if f"request: {prompt_tokens} prompt tokens, " in line:
                    served.setdefault(role, []).append(int(line.split(", ")[-1].split()[0]))
    assert len(served) == 1 and len(next(iter(served.values()))) == 3, served  # one worker got all three
    known = next(iter(served.values()))
    full_blocks = prompt_tokens - prompt_tokens % 32
    assert known[0] == 0 and known[1:] == [full_blocks, full_blocks], known
    # The router's own account of each routing: the blocks of the prompt it knew on the chosen worker.
    with frontend_log.open() as handle:
        handle.seek(offsets["frontend"])
        routed = re.sub(r"\x1b\[[0-9;]*m", "", handle.read())
    overlaps = [int(n) for n in re.findall(r"route request completed.*?overlap_blocks=(\d+)", routed)]
    assert overlaps[-3:] == [0, full_blocks // 32, full_blocks // 32], overlaps


def test_verify_matches_transformers_token_for_token_through_the_frontend(deployed):
    config_file, workdir, _ = deployed
    proc = run_cli("verify", str(config_file), "--workdir", str(workdir), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["passed"] is True, report


def test_a_prompt_longer_than_the_engine_takes_is_a_400_naming_the_field(deployed):
    _, workdir, document = deployed
    code, body = _post(document["http_url"], {"model": "smollm2-cpu-dynamo", "prompt": "word " * 1500, "max_tokens": 4})
    assert code == 400, body
    assert "prompt" in body["message"] and "max_input_len" in body["message"], body
    assert _status(workdir)[0] == 0  # no worker died of it


def test_a_worker_killed_under_load_loses_its_requests_and_deploy_brings_it_back(deployed):
    config_file, workdir, document = deployed
    url = document["http_url"]
    victim = next(p for p in document["processes"] if p["role"] == "worker-1")
    results: list[Any] = []

    def one(index: int) -> None:
        started = time.monotonic()
        try:
            code, _ = _post(
                url, {"model": "smollm2-cpu-dynamo", "prompt": f"Story {index}:", "max_tokens": 48, "ignore_eos": True}, timeout=60
            )
        except OSError as exc:  # the connection dropped
            code = type(exc).__name__
        results.append((code, time.monotonic() - started))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(0.8)
    os.kill(victim["pid"], signal.SIGKILL)
    for thread in threads:
        thread.join(90)
    assert len(results) == 6 and all(seconds < 61 for _, seconds in results), results  # none hangs past its timeout
    # The frontend keeps serving on the survivor: a request it still routes to the dead worker fails fast (503) until
    # it drops that instance; then three in a row succeed.
    codes: list[int] = []
    deadline = time.monotonic() + 20
    while codes[-3:] != [200, 200, 200] and time.monotonic() < deadline:
        codes.append(_post(url, {"model": "smollm2-cpu-dynamo", "prompt": f"Hello {len(codes)}", "max_tokens": 4}, timeout=30)[0])
    assert codes[-3:] == [200, 200, 200], codes
    code, status = _status(workdir)
    assert code == 1, status
    dead = [p["role"] for p in status["processes"] if not p["alive"]]
    assert dead == ["worker-1"] and any("worker-1" in problem for problem in status["problems"])
    again = run_cli("deploy", str(config_file), "--workdir", str(workdir), "--json", timeout=400)
    assert again.returncode == 0, again.stderr[-2000:]
    code, status = _status(workdir)
    assert code == 0 and all(p["alive"] and p["ready"] for p in status["processes"]), status
    assert status["processes"][0]["pid"] == document["processes"][0]["pid"]  # the frontend kept running


def test_deploy_stop_leaves_no_process_and_no_discovery_entry(deployed):
    _, workdir, _ = deployed
    _, status = _status(workdir)
    pids = [p["pid"] for p in status["processes"]]
    proc = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert proc.returncode == 0, proc.stderr
    time.sleep(0.5)
    from trtllm_forge.processes import proc_stat

    # Gone, or a zombie nobody reaped yet (`deploy` exited, so init is their parent; in a container it may not reap).
    assert [pid for pid in pids if (stat := proc_stat(pid)) is not None and stat[0] != "Z"] == []
    assert not (workdir / "deploy" / dynamo_local.DISCOVERY_DIR).exists()
    assert not (workdir / "deploy" / dynamo_local.STATE).exists()
    assert run_cli("deploy", "status", "--workdir", str(workdir)).returncode == 3
