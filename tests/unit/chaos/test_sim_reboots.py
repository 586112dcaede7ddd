"""The simulator's reboots (``chaos.sim.controllers.Reboots``): a poll looks only at the nodes that can have a
new boot id — those going through a reboot and the attached GPU nodes — not at every node of the cluster on
every API request."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.sim import seed_cluster
from chaos.sim.controllers import Reboots


def _ready(node: dict[str, Any]) -> str:
    return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")


def _looks(reboots: Reboots, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The node names the next polls read from the store."""
    seen: list[str] = []
    store_obj = reboots.s.obj

    def counting(plural: str, namespace: str, name: str) -> Any:
        if plural == "nodes":
            seen.append(name)
        return store_obj(plural, namespace, name)

    monkeypatch.setattr(reboots.s, "obj", counting)
    return seen


def test_a_poll_of_a_large_cluster_with_no_reboot_looks_at_no_node(monkeypatch: pytest.MonkeyPatch) -> None:
    state = seed_cluster(2_000, gpus_per_node=1)
    state.tick()  # the first scan of reboot requests looks at every node once
    reboots: Reboots = state._controllers.reboots
    seen = _looks(reboots, monkeypatch)
    reboots._polled_all_at = -1.0  # the periodic look at the attached GPU nodes is due: there are none
    assert reboots.poll() is False
    assert seen == []


def test_a_rebooted_node_is_looked_at_until_it_is_ready_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state = seed_cluster(2_000, gpus_per_node=1)
    state.reboot_down_s = 0.0
    name = state.node_names()[1234]
    state.tick()
    reboots: Reboots = state._controllers.reboots
    seen = _looks(reboots, monkeypatch)
    with state._store.lock:
        reboots.reboot(name)
        assert reboots.poll() is True  # down: NotReady, no boot id
        assert _ready(state._store.obj("nodes", "", name)) == "False"
        assert reboots.poll() is True  # down_s passed: Ready with the new boot id
    node = state.node(name)
    assert _ready(node) == "True" and node["status"]["nodeInfo"]["bootID"]
    assert set(seen) == {name}  # the rebooted node, and none of the other 1,999
    seen.clear()
    with state._store.lock:
        assert reboots.poll() is False
    assert seen == []
    assert state.reboots(name) == 1
