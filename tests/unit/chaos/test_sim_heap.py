"""The simulator's heap: a seed with the cyclic collector paused (restored as it was), a served cluster frozen
out of the collector's passes, and the benchmark's measure of the collector's pauses."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from chaos.bench.storm import GcPauses
from chaos.sim import seed_cluster


@pytest.mark.parametrize("enabled", [True, False])
def test_a_seed_leaves_the_collector_as_it_found_it(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        state = seed_cluster(3)
        assert len(state.node_names()) == 3
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_freezing_the_seeded_heap_puts_it_out_of_the_collectors_reach() -> None:
    code = ("import gc; from chaos.sim import freeze_heap, seed_cluster; s = seed_cluster(20); "
            "before = gc.get_freeze_count(); freeze_heap(); "
            "print(before, gc.get_freeze_count(), sum(gc.get_count()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, frozen, young = map(int, out.stdout.split())
    assert before == 0 and frozen > 10_000  # the 20 nodes' objects, and the rest of the start-up heap
    assert young < 100  # nothing left for the next passes to walk


def test_gc_pauses_counts_the_collectors_passes_while_installed() -> None:
    with GcPauses() as pauses:
        for _ in range(3):
            a: list[object] = []
            a.append(a)  # cyclic garbage, found only by a full pass
            del a
            gc.collect()
    summary = pauses.summary()
    assert summary["passes"] >= 3 and summary["full"] >= 3
    assert summary["total_ms"] >= summary["max_ms"] >= 0
    assert pauses._observe not in gc.callbacks
    gc.collect()
    assert pauses.summary() == summary  # removed: later passes are not counted
