"""The load generator: closed-loop concurrency or an open-loop arrival schedule, one sweep point at a time.

Everything runs on one asyncio event loop. Self-checks run beside the load: an event-loop lag sampler (how
late a timer fires: the delay any response stamp can suffer), and the process CPU time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtllm_forge.bench.provenance import machine_cpu_ticks, steal_share
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.schedule import arrival_offsets
from trtllm_forge.bench.specs import LoadSpec
from trtllm_forge.bench.target import Target, TargetDown, now_ns
from trtllm_forge.bench.workload import BenchRequest

LAG_PERIOD_S = 0.005
SPIN_S = 0.002  # the last stretch before a scheduled send is waited by yielding, not by a coarse timer
# A quiet spell this long on every request in flight starts a stall: the deployment's stubs are asked (at most once
# per spell and period). Reading /proc is cheap, and it ends a point whose engine stub died at once instead of after
# the stall timeout (Triton 2.51 never errors the streams of a dead stub and keeps saying ready).
STALL_PROBE_S = 1.0
NO_STUB_CHECK = "cannot check whether an engine stub died: the bench was given a bare --url (give CONFIG to name the deployment)"


@dataclass
class RunResult:
    load: LoadSpec
    records: list[RequestRecord]
    start_ns: int
    end_ns: int
    wall_start_ns: int  # time.time_ns() at start_ns, to anchor the monotonic stamps
    cpu_seconds: float
    loop_lag_ns: list[int] = field(default_factory=list)
    aborted: str | None = None  # why sending stopped early
    steal_share: float | None = None  # the machine's CPU time the hypervisor gave to other guests, over the run


class _LagSampler:
    """Every LAG_PERIOD_S, queue a callback and measure how long it waits to run: the delay a response that
    is ready on the socket waits before it is stamped (timer granularity is not counted)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.task: asyncio.Task | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(LAG_PERIOD_S)
            queued = now_ns()
            loop.call_soon(lambda q: self.samples.append(now_ns() - q), queued)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def _sleep_until(target_ns: int) -> None:
    remaining = (target_ns - now_ns()) / 1e9
    if remaining > SPIN_S:
        await asyncio.sleep(remaining - SPIN_S)
    while now_ns() < target_ns:
        await asyncio.sleep(0)


def _record(request: BenchRequest, index: int, phase: str, intended_ns: int) -> RequestRecord:
    return RequestRecord(
        id=f"{phase[0]}{index}",
        phase=phase,
        intended_ns=intended_ns,
        input_tokens=request.input_tokens,
        input_tokens_source=request.input_tokens_source,
        requested_output_tokens=request.output_tokens,
    )


async def _warmup(target: Target, warmup: list[BenchRequest], concurrency: int) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    queue = list(enumerate(warmup))

    async def worker() -> None:
        while queue:
            i, request = queue.pop(0)
            record = _record(request, i, "warmup", now_ns())
            records.append(record)
            await target.send(request, record)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(warmup))))), return_exceptions=True)
    return records


@dataclass(frozen=True)
class StubCheck:
    """The deployment under measurement, as a stall asks it (deploy/health.py): its server's process group and its
    model repository."""

    pgid: int
    repository: str

    def dead_stubs(self, expected: dict[str, int]) -> list[str]:
        """What is missing of the python stubs `expected` (model -> instances); empty while all are alive."""
        from trtllm_forge.deploy.health import StubHealth, stub_processes

        alive, dead = stub_processes(self.pgid)
        return StubHealth(expected=expected, alive=alive, dead=dead).problems()

    def expected(self) -> dict[str, int]:
        from trtllm_forge.deploy.health import python_instances

        return python_instances(Path(self.repository))


def shard_share(total: int, shard: int, shards: int) -> int:
    return total // shards + (1 if shard < total % shards else 0)


async def run_load(
    target: Target,
    requests: list[BenchRequest],
    warmup: list[BenchRequest],
    load: LoadSpec,
    seed: int = 0,
    shard: tuple[int, int] = (0, 1),
    start_at: Callable[[], Awaitable[int]] | None = None,
    stall_s: float = 60.0,
    stubs: StubCheck | None = None,
) -> RunResult:
    """Run one sweep point. With `shard` = (k, n) this process sends only the requests whose index is k mod n
    (and k's share of the concurrency); `start_at` then returns the common start time of all shards.
    When no request in flight has received anything for `stall_s` seconds (a server that stopped answering
    without closing the connection), or on SIGINT/SIGTERM, sending stops and the requests in flight end as
    errors, so the records and the summary of what completed are still written. `stubs`: the deployment's python
    stubs, asked when a stall starts (STALL_PROBE_S without a response): a dead one ends the point at once
    ("engine stub died"); without it a stall says it could not check."""
    k, n_shards = shard
    concurrency = shard_share(int(load.value), k, n_shards) if load.mode == "concurrency" else 0
    warm = await _warmup(target, warmup, max(1, concurrency) if load.mode == "concurrency" else (load.max_concurrency or 8))
    for record in warm:
        record.worker = k
    records: list[RequestRecord] = []
    stop = asyncio.Event()
    aborted: list[str] = []
    lag = _LagSampler()
    start = await start_at() if start_at else now_ns()
    await _sleep_until(start)
    cpu0 = time.process_time()
    ticks0 = machine_cpu_ticks()
    wall0 = time.time_ns() - (now_ns() - start)
    deadline = start + int(load.duration_s * 1e9) if load.duration_s else None
    lag.start()

    records_by_index: dict[int, RequestRecord] = {}
    in_flight: dict[str, tuple[RequestRecord, asyncio.Task]] = {}
    loop = asyncio.get_running_loop()

    def abort(kind: str, reason: str) -> None:
        """Stop sending and end every request in flight as an error of `kind` (records are kept)."""
        if not aborted:
            aborted.append(reason)
        stop.set()
        for record, task in list(in_flight.values()):
            if record.error_kind is None:
                record.error_kind, record.error_message = kind, reason
            task.cancel()

    expected_stubs: dict[str, int] = {}
    probed_ns = 0

    async def stub_died(quiet_since: int) -> str | None:
        """Ask the stubs once per STALL_PROBE_S of a quiet spell; the problem when one died."""
        nonlocal expected_stubs, probed_ns
        if stubs is None or now_ns() - max(quiet_since, probed_ns) < STALL_PROBE_S * 1e9:
            return None
        probed_ns = now_ns()
        if not expected_stubs:
            expected_stubs = await loop.run_in_executor(None, stubs.expected)
        problems = await loop.run_in_executor(None, stubs.dead_stubs, expected_stubs)
        return "; ".join(problems) or None

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(0.5)
            if not in_flight:
                continue
            last = max((r.recv_ns[-1] if r.recv_ns else r.sent_ns or r.intended_ns) for r, _ in in_flight.values())
            died = await stub_died(last)
            if died:
                abort("stub_died", f"engine stub died ({died}); {len(in_flight)} requests in flight were ended")
            elif now_ns() - last > stall_s * 1e9:
                unchecked = "" if stubs is not None else f"; {NO_STUB_CHECK}"
                abort("stalled", f"no response on any of {len(in_flight)} requests in flight for {stall_s:g} s{unchecked}")

    async def send(request: BenchRequest, index: int, intended: int) -> None:
        record = _record(request, index, "measure", intended)
        record.worker = k
        records.append(record)
        records_by_index[index] = record
        task = loop.create_task(target.send(request, record))
        in_flight[record.id] = (record, task)
        try:
            await task
        except TargetDown as exc:
            if not aborted:
                aborted.append(f"target down: {exc}")
            stop.set()
        except asyncio.CancelledError:
            if record.error_kind is None:
                record.error_kind, record.error_message = "cancelled", aborted[0] if aborted else "cancelled"
            if not stop.is_set():
                raise
        finally:
            in_flight.pop(record.id, None)

    signals = (signal.SIGINT, signal.SIGTERM) if k == 0 and n_shards == 1 else ()
    for sig in signals:
        loop.add_signal_handler(sig, abort, "interrupted", f"interrupted by {signal.Signals(sig).name}")
    guard = loop.create_task(watchdog())

    def more(index: int) -> bool:
        if stop.is_set() or index >= len(requests):
            return False
        return deadline is None or now_ns() < deadline

    if load.mode == "concurrency":
        counter = iter(range(k, len(requests), n_shards))

        async def worker() -> None:
            free_since = start  # a slot's next request is due when its previous one ended
            while True:
                index = next(counter, None)
                if index is None or not more(index):
                    return
                await send(requests[index], index, free_since)
                record = records_by_index[index]
                free_since = record.recv_ns[-1] if record.recv_ns else now_ns()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    else:
        rng = np.random.default_rng([seed, int(load.value * 1000)])
        offsets = arrival_offsets(len(requests), load.value, load.arrival, rng, load.burstiness)
        cap = asyncio.Semaphore(max(1, shard_share(load.max_concurrency, k, n_shards))) if load.max_concurrency else None
        tasks = []

        async def capped(request: BenchRequest, index: int, intended: int) -> None:
            assert cap is not None  # used only with a cap
            async with cap:
                await send(request, index, intended)

        for index, offset in enumerate(offsets):
            if index % n_shards != k:
                continue
            intended = start + int(offset * 1e9)
            await _sleep_until(intended)
            if not more(index):
                break
            coro = capped(requests[index], index, intended) if cap else send(requests[index], index, intended)
            tasks.append(asyncio.get_running_loop().create_task(coro))
        if tasks:
            await asyncio.gather(*tasks)
    end = now_ns()
    guard.cancel()
    for sig in signals:
        loop.remove_signal_handler(sig)
    await lag.stop()
    target.count_client_tokens(warm + records)
    return RunResult(
        load,
        warm + records,
        start,
        end,
        wall0,
        time.process_time() - cpu0,
        lag.samples,
        aborted[0] if aborted else None,
        steal_share(ticks0, machine_cpu_ticks()),
    )


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
