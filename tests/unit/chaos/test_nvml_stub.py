"""The NVML adapter through pynvml's own ctypes layer, against a stub libnvidia-ml built from
chaos/native/nvml_stub.c: values, struct layouts, and the GPU_IS_LOST / NOT_SUPPORTED / TIMEOUT mappings."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediator.adapters.nvml import NvmlBackend

REPO = Path(__file__).resolve().parents[3]
STUB_SOURCE = REPO / "chaos" / "native" / "nvml_stub.c"
UUID0 = "GPU-509665ad-1111-2222-3333-444444444444"


@pytest.fixture(scope="session")
def nvml_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``libnvidia-ml.so.1`` compiled from the stub source with gcc, once per session."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc is needed to build the NVML stub"
    out = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out), str(STUB_SOURCE),
                    "-lpthread"], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture
def state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "nvml.state"
    monkeypatch.setenv("NVML_STUB_STATE", str(p))
    return p


@pytest.fixture
def backend(nvml_stub: Path, state_file: Path) -> Iterator[NvmlBackend]:
    state_file.write_text(
        "count=3\n"
        f"gpu0.uuid={UUID0}\n"
        "gpu0.pci=00000000:3B:00.0\n"
        "gpu0.mem_total=85899345920\n"
        "gpu0.mem_used=17179869184\n"
        "gpu0.ecc_sbe_volatile=7\ngpu0.ecc_dbe_volatile=2\ngpu0.ecc_sbe_aggregate=70\ngpu0.ecc_dbe_aggregate=3\n"
        "gpu0.retired_sbe=1\ngpu0.retired_dbe=4\ngpu0.retired_pending=1\n"
        "gpu0.remap_correctable=5\ngpu0.remap_uncorrectable=2\ngpu0.remap_pending=1\ngpu0.remap_failure=0\n"
        "gpu0.procs=4242:1073741824,4243:2147483648\n"
        "gpu0.throttle=0x48\n"
        "gpu0.temp=81\n"
        "gpu1.uuid=GPU-22222222-1111-2222-3333-444444444444\n"
        "gpu1.pci=00000009:01:00.0\n"
        "gpu1.rc.nvmlDeviceGetRemappedRows=3\n"
        "gpu1.rc.nvmlDeviceGetRetiredPagesPendingStatus=3\n"
        "gpu1.rc.nvmlDeviceGetTemperature=10\n"
        "gpu1.rc.nvmlDeviceGetCurrentClocksEventReasons=13\n"
        "gpu1.throttle=0x20\n"
        "gpu1.events=0x0\n"
        "gpu2.uuid=GPU-33333333-1111-2222-3333-444444444444\n"
        "gpu2.pci=00000000:DB:00.0\n"
    )
    b = NvmlBackend(str(nvml_stub))
    yield b
    b.close()


def test_identity_and_every_field_through_pynvml(backend: NvmlBackend) -> None:
    assert backend.gpu_count() == 3
    assert [(i.index, i.uuid, i.pci_bus_id) for i in backend.identities()] == [
        (0, UUID0, "0000:3b:00.0"),
        (1, "GPU-22222222-1111-2222-3333-444444444444", "0009:01:00.0"),
        (2, "GPU-33333333-1111-2222-3333-444444444444", "0000:db:00.0"),
    ]
    s = backend.snapshot(0)
    assert not s.lost and not s.unsupported and not s.errors
    assert (s.ecc.sbe_volatile, s.ecc.dbe_volatile, s.ecc.sbe_aggregate, s.ecc.dbe_aggregate) == (7, 2, 70, 3)
    assert (s.retired_pages_sbe, s.retired_pages_dbe, s.retired_pages_pending) == (1, 4, True)
    assert s.remapped_rows is not None
    assert (s.remapped_rows.correctable, s.remapped_rows.uncorrectable, s.remapped_rows.pending,
            s.remapped_rows.failure) == (5, 2, True, False)
    assert (s.memory_used, s.memory_total) == (16 * 2**30, 80 * 2**30)
    assert s.processes is not None
    assert [(p.pid, p.used_bytes) for p in s.processes] == [(4242, 2**30), (4243, 2 * 2**30)]
    assert (s.throttle_reasons, s.temperature_c) == (0x48, 81)


def test_not_supported_per_field_timeout_and_the_older_throttle_call(backend: NvmlBackend) -> None:
    s = backend.snapshot(1)
    assert not s.lost
    assert s.remapped_rows is None and s.retired_pages_pending is None
    assert {"remapped_rows", "retired_pages_pending"} <= s.unsupported
    assert s.temperature_c is None and s.errors == {"temperature": "NVML_ERROR_TIMEOUT"}
    # ClocksEventReasons answers FUNCTION_NOT_FOUND (an older driver): ClocksThrottleReasons is used instead
    assert s.throttle_reasons == 0x20
    assert s.ecc.dbe_volatile == 0 and s.processes == ()


def test_gpu_is_lost_maps_to_a_lost_snapshot_that_keeps_its_identity(backend: NvmlBackend, state_file: Path
                                                                     ) -> None:
    with open(state_file, "a") as f:
        f.write("gpu0.lost=1\n")
    s = backend.snapshot(0)
    assert s.lost and s.identity.uuid == UUID0 and s.identity.pci_bus_id == "0000:3b:00.0"
    assert s.processes is None and s.ecc.dbe_volatile is None
    assert not backend.snapshot(2).lost


def test_xid_events_from_the_event_set_and_timeout(backend: NvmlBackend, state_file: Path) -> None:
    assert backend.wait_xid(0.05) is None  # NVML_ERROR_TIMEOUT is "nothing yet"
    with open(state_file, "a") as f:
        f.write("gpu2.xids=79,48\ngpu1.xids=13\n")
    first, second = backend.wait_xid(1.0), backend.wait_xid(1.0)
    assert first is not None and (first.index, first.code) == (2, 79)
    assert second is not None and (second.index, second.code) == (2, 48)
    assert backend.wait_xid(0.05) is None  # GPU 1 does not support Xid events: never registered


def test_gpu_lost_at_start_and_event_sets_unavailable(nvml_stub: Path, state_file: Path) -> None:
    state_file.write_text("count=1\ngpu0.lost=1\nrc.nvmlEventSetWait_v2=999\n")
    b = NvmlBackend(str(nvml_stub))
    try:
        s = b.snapshot(0)
        assert s.lost and s.identity.uuid is None
        assert b.wait_xid(0.05) is None  # registration failed on a lost GPU: no event set
    finally:
        b.close()
