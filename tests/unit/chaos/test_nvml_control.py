"""The NVML adapter's ``GpuControl`` through pynvml against the stub libnvidia-ml: persistence mode read and
set (and a refusal named), and who answers at a PCI address read afresh (another UUID after a reset)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediator.adapters.nvml import NvmlBackend
from remediator.agent.host import GpuControl

REPO = Path(__file__).resolve().parents[3]
UUID0 = "GPU-509665ad-1111-2222-3333-444444444444"
UUID1 = "GPU-22222222-1111-2222-3333-444444444444"


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc is needed to build the NVML stub"
    out = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out),
                    str(REPO / "chaos/native/nvml_stub.c"), "-lpthread"], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "nvml.state"
    monkeypatch.setenv("NVML_STUB_STATE", str(p))
    p.write_text(f"count=2\ngpu0.uuid={UUID0}\ngpu0.pci=00000000:3B:00.0\n"
                 f"gpu1.uuid={UUID1}\ngpu1.pci=00000000:DB:00.0\ngpu1.persistence=0\n")
    return p


@pytest.fixture
def backend(stub: Path, state: Path) -> Iterator[NvmlBackend]:
    b = NvmlBackend(str(stub), xid_events=False)
    yield b
    b.close()


def test_persistence_mode_read_and_set(backend: NvmlBackend) -> None:
    assert isinstance(backend, GpuControl)
    assert (backend.persistence_mode(0), backend.persistence_mode(1)) == (True, False)
    assert backend.set_persistence_mode(0, False) is None
    assert backend.persistence_mode(0) is False
    assert backend.set_persistence_mode(0, True) is None and backend.persistence_mode(0) is True


def test_a_refused_persistence_change_is_named(backend: NvmlBackend, state: Path) -> None:
    with state.open("a") as f:
        f.write("gpu0.rc.nvmlDeviceSetPersistenceMode=4\n")  # NVML_ERROR_NO_PERMISSION
    why = backend.set_persistence_mode(0, False)
    assert why is not None and "NVML_ERROR_NO_PERMISSION" in why and backend.persistence_mode(0) is True


def test_identity_at_a_pci_address_is_read_afresh(backend: NvmlBackend, state: Path) -> None:
    ident = backend.identity_at("0000:3b:00.0")
    assert ident is not None and (ident.index, ident.uuid) == (0, UUID0)
    assert backend.identity_at("0000:99:00.0") is None
    with state.open("a") as f:
        f.write("gpu0.uuid=GPU-99999999-1111-2222-3333-444444444444\n")  # another board at that address
    fresh = backend.identity_at("0000:3b:00.0")
    assert fresh is not None and fresh.uuid == "GPU-99999999-1111-2222-3333-444444444444"
    with state.open("a") as f:
        f.write("gpu0.lost=1\n")
    assert backend.identity_at("0000:3b:00.0") is None
