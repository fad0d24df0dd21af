"""deploy.server dynamo on CPU, for real: NVIDIA Dynamo 1.6.1's frontend (KV router) and two workers serving our
OpenVINO engine loop, from Dynamo's own venv. ONE deployment for the module (started with `deploy`, stopped by the
last test): status, exact tokens against transformers (`verify`), a refused request, a worker killed with SIGKILL
under load (our bench counting the lost requests), `deploy` bringing it back, the frontend killed, and `deploy stop`
leaving no process and no discovery entry. And `run` of the shipped config end to end on the session's build."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
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


def test_the_config_says_what_the_router_knows_and_the_commands_follow(imported_smollm2, cpu_engine_fp32, tmp_path):
    """kv_events (default): the workers publish, the router uses events; false: the router's approximate mode and
    no publishing; round-robin: neither. Planned on the session's build (nothing started)."""
    from chain_helpers import reused_workdir

    from trtllm_forge.config.load import load_config

    workdir = reused_workdir(tmp_path, imported_smollm2.parent, cpu_engine_fp32[0] / "build")
    config = load_config(CONFIG)
    events = dynamo_local.plan(config, workdir)
    assert all("--publish-kv-events" in w.argv for w in events.workers) and "--no-router-kv-events" not in events.frontend.argv
    config.deploy.dynamo.kv_events = False
    config.deploy.dynamo.approximate_ttl_s = 30.0
    approximate = dynamo_local.plan(config, workdir)
    assert not any("--publish-kv-events" in w.argv for w in approximate.workers)
    at = approximate.frontend.argv.index("--no-router-kv-events")
    assert approximate.frontend.argv[at : at + 3] == ["--no-router-kv-events", "--router-ttl-secs", "30"]
    config.deploy.dynamo.router_mode = "round-robin"
    neither = dynamo_local.plan(config, workdir)
    assert "--publish-kv-events" not in neither.workers[0].argv and "--no-router-kv-events" not in neither.frontend.argv
    source = yaml.safe_load(CONFIG.read_text())
    source["deploy"]["dynamo"]["kv_events"] = False
    config_file = tmp_path / "approximate.yaml"
    config_file.write_text(yaml.safe_dump(source))
    dry = run_cli("deploy", str(config_file), "--workdir", str(workdir), "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"router kv knowing the caches by {dynamo_local.APPROXIMATE}" in dry.stdout + dry.stderr


@pytest.mark.slow
def test_run_deploys_verifies_benches_and_stops_a_frontend_and_two_workers(imported_smollm2, cpu_engine_fp32, chain_host_profile, tmp_path):
    """`run` of the shipped config on the session's import and fp32 build: deploy starts the frontend and two
    workers, smoke and verify ask /v1/completions (exact tokens against transformers), bench measures it with the
    openai target, and at the end no process of it runs and no discovery entry is left."""
    from chain_helpers import reused_workdir, run_chain
    from conftest import processes_with

    source = yaml.safe_load(CONFIG.read_text())
    source["runtime"]["max_tokens_in_paged_kv_cache"] = TEST_KV_TOKENS
    source["bench"]["workloads"][0].update(concurrency=[2], num_requests=4, input_len=16, output_len=8)
    config_file = tmp_path / "dynamo.yaml"
    config_file.write_text(yaml.safe_dump(source))
    workdir = reused_workdir(tmp_path, imported_smollm2.parent, cpu_engine_fp32[0] / "build")
    proc = run_chain(workdir, config_file, host_profile=chain_host_profile)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    statuses = {s["name"]: s["status"] for s in doc["stages"]}
    assert statuses["import"] == statuses["build"] == "skipped", statuses
    assert all(statuses[name] == "done" for name in ("deploy", "smoke", "verify", "bench")), statuses
    assert doc["verify"]["passed"] and doc["verify"]["agreement"]["prefix"] == 1.0, doc["verify"]
    workload = doc["bench"]["workloads"][0]
    (point,) = workload.get("points") or [workload]
    assert point["target"]["kind"] == "openai" and point["requests"]["completed"] == 4 and point["requests"]["failed"] == 0
    logs = sorted(p.name for p in (workdir / "logs").glob("dynamo-*.log"))
    assert logs == ["dynamo-frontend.log", "dynamo-worker-0.log", "dynamo-worker-1.log"], logs
    assert processes_with(str(workdir)) == []  # stopped: no worker (their argv names the engine in the workdir) ...
    launched = (workdir / "logs" / "dynamo-frontend.log").read_text().splitlines()[0].split()
    port = launched[launched.index("--http-port") + 1]
    assert processes_with("dynamo.frontend", f"--http-port {port} ") == []  # ... and no frontend
    assert not (workdir / "deploy" / dynamo_local.DISCOVERY_DIR).exists()
    assert not (workdir / "deploy" / dynamo_local.STATE).exists()


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


def test_a_worker_killed_under_load_loses_its_requests_and_deploy_brings_it_back(deployed, tmp_path):
    """Our bench (openai target) through the frontend while worker-1 is SIGKILLed with requests in flight on it: every
    request ends within its timeout, the lost ones counted as errors, none as a short success."""
    config_file, workdir, document = deployed
    url = document["http_url"]
    victim = next(p for p in document["processes"] if p["role"] == "worker-1")
    victim_log = _worker_logs(document)["worker-1"]
    offset = victim_log.stat().st_size
    requests, timeout_s = 12, 60
    argv = [sys.executable, "-m", "trtllm_forge", "bench", "run", "--target", "openai", "--url", url, "--model", "smollm2-cpu-dynamo"]
    argv += ["--concurrency", "6", "--num-requests", str(requests), "--warmup", "0", "--input-len", "16", "--output-len", "64"]
    argv += ["--request-timeout", str(timeout_s), "--no-plots", "--out", str(tmp_path / "bench"), "--json"]
    bench = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while "request: " not in victim_log.read_text()[offset:] and time.monotonic() < deadline and bench.poll() is None:
        time.sleep(0.1)
    assert "request: " in victim_log.read_text()[offset:], "worker-1 never got a request"
    time.sleep(0.5)  # its prefill ran: a stream is open on it
    os.kill(victim["pid"], signal.SIGKILL)
    _, err = bench.communicate(timeout=requests * timeout_s)
    assert bench.returncode == 1 and "requests failed" in err, err[-3000:]  # the bench fails, and says so
    counted = json.loads(next((tmp_path / "bench").rglob("summary.json")).read_text())["requests"]
    assert counted["completed"] + counted["failed"] == requests, counted
    assert counted["failed"] >= 1, counted  # the requests in flight on the dead worker
    records = [json.loads(line) for line in next((tmp_path / "bench").rglob("requests.jsonl")).read_text().splitlines()]
    measured = [r for r in records if r["phase"] == "measure"]
    assert len(measured) == requests
    assert all(r["error"] or r["output_tokens"] == 64 for r in measured), measured  # no short "success"
    # none hung: every request ended (its last response, or its error) within its timeout
    assert all(not r["responses"] or (r["responses"][-1]["recv_ns"] - r["sent_ns"]) / 1e9 < timeout_s for r in measured)
    # What the frontend answers: a stream open on the dead worker ends with an error event (503 service_unavailable;
    # request migration is off), a request routed to it before the frontend dropped it gets HTTP 503.
    kinds = {r["error"]["kind"] for r in measured if r["error"]}
    assert kinds and kinds <= {"server_error", "http_503"}, measured
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
    human = run_cli("deploy", "status", "--workdir", str(workdir))
    assert human.returncode == 1 and "restart with `trtllm-forge deploy` (it starts the dead workers" in human.stdout + human.stderr
    again = run_cli("deploy", str(config_file), "--workdir", str(workdir), "--json", timeout=400)
    assert again.returncode == 0, again.stderr[-2000:]
    code, status = _status(workdir)
    assert code == 0 and all(p["alive"] and p["ready"] for p in status["processes"]), status
    assert status["processes"][0]["pid"] == document["processes"][0]["pid"]  # the frontend kept running


def test_the_frontend_killed_status_says_so_and_stop_cleans_up_the_workers_and_discovery(deployed):
    _, workdir, _ = deployed
    _, status = _status(workdir)
    pids = {p["role"]: p["pid"] for p in status["processes"]}
    os.kill(pids["frontend"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (code := _status(workdir)[0]) != 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    code, status = _status(workdir)
    assert code == 3 and status["running"] is False, status  # not running: the frontend is what clients call
    assert [p["role"] for p in status["processes"] if not p["alive"]] == ["frontend"], status
    assert any(problem.startswith("frontend") for problem in status["problems"]), status
    assert sorted(status["leftover_pids"]) == sorted([pids["worker-0"], pids["worker-1"]]), status
    human = run_cli("deploy", "status", "--workdir", str(workdir))
    assert "deploy stop" in human.stdout + human.stderr  # a dead frontend: stop, then deploy
    proc = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert proc.returncode == 0, proc.stderr
    time.sleep(0.5)
    from trtllm_forge.processes import proc_stat

    # Gone, or a zombie nobody reaped yet (`deploy` exited, so init is their parent; in a container it may not reap).
    assert [pid for pid in pids.values() if (stat := proc_stat(pid)) is not None and stat[0] != "Z"] == []
    assert not (workdir / "deploy" / dynamo_local.DISCOVERY_DIR).exists()
    assert not (workdir / "deploy" / dynamo_local.STATE).exists()
    assert run_cli("deploy", "status", "--workdir", str(workdir)).returncode == 3
