"""What the Dynamo worker tells the KV router (deploy/dynamo_worker.py KvCacheRecord), and which router knowledge a
config renders (deploy/dynamo_local.py router_knowledge): fast, no Dynamo needed."""

from __future__ import annotations

import threading
from typing import Any

import yaml
from conftest import CONFIGS

from trtllm_forge.config.load import parse_config
from trtllm_forge.deploy import dynamo_local
from trtllm_forge.deploy.dynamo_worker import KvCacheRecord, block_hashes


class Events:
    """The publisher's two calls, recorded in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.arrived = threading.Condition()

    def stored(self, **event: Any) -> None:
        with self.arrived:
            self.seen.append(("stored", event))
            self.arrived.notify_all()

    def removed(self, hashes: list[int]) -> None:
        with self.arrived:
            self.seen.append(("removed", {"block_hashes": hashes}))
            self.arrived.notify_all()


def _record(capacity: int) -> tuple[KvCacheRecord, Events]:
    events = Events()
    return KvCacheRecord(events.stored, events.removed, 4, capacity), events


def test_block_ids_chain_each_full_block_to_the_tokens_before_it():
    first = block_hashes(list(range(10)), 4)
    assert len(first) == 2  # the partial third block is never published
    assert block_hashes(list(range(8)), 4) == first
    other_start = block_hashes([99, *range(1, 8)], 4)
    assert other_start[0] != first[0] and other_start[1] != first[1]  # same tokens in block 2, another prefix
    assert all(-(2**63) <= h < 2**63 for h in first)


def test_the_record_publishes_only_new_blocks_chained_to_their_parent():
    record, events = _record(capacity=100)
    record.stored(list(range(8)))
    record.stored(list(range(13)))  # the prompt again, one block longer (a multi-turn session)
    record.close()
    (kind1, first), (kind2, second) = events.seen
    assert kind1 == kind2 == "stored"
    hashes = block_hashes(list(range(13)), 4)
    assert first == {"token_ids": list(range(8)), "num_block_tokens": [4, 4], "block_hashes": hashes[:2], "parent_hash": None}
    assert second == {"token_ids": list(range(8, 12)), "num_block_tokens": [4], "block_hashes": hashes[2:], "parent_hash": hashes[1]}


def test_the_record_removes_least_recently_used_blocks_past_the_pools_capacity():
    record, events = _record(capacity=3)
    shared = list(range(8))
    record.stored(shared)
    record.stored([50, 51, 52, 53])  # a third block: at capacity
    assert record.known_tokens([*shared, 7, 7, 7]) == 8
    record.stored(shared)  # used again: the other prompt is now the oldest
    record.stored([60, 61, 62, 63])
    record.close()
    assert events.seen[-1] == ("removed", {"block_hashes": block_hashes([50, 51, 52, 53], 4)})
    assert record.known_tokens(shared) == 8 and record.known_tokens([50, 51, 52, 53]) == 0


def _config(**dynamo: Any) -> Any:
    source = yaml.safe_load((CONFIGS / "smollm2-cpu-dynamo.yaml").read_text())
    source["deploy"]["dynamo"].update(dynamo)
    return parse_config(source, CONFIGS)


def test_router_knowledge_follows_the_config():
    assert dynamo_local.router_knowledge(_config()) == dynamo_local.KV_EVENTS
    assert dynamo_local.router_knowledge(_config(kv_events=False)) == dynamo_local.APPROXIMATE
    assert dynamo_local.router_knowledge(_config(router_mode="round-robin")) == dynamo_local.NOTHING
    no_reuse = _config()
    no_reuse.runtime.enable_kv_cache_reuse = False
    assert dynamo_local.router_knowledge(no_reuse) == dynamo_local.NOTHING
