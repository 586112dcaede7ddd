"""The NVML adapter's framebuffer read (memory info v2 with the driver's reserve, v1 on an older driver),
through pynvml's ctypes layer against the stub libnvidia-ml of chaos/native/nvml_stub.c."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediator.adapters.nvml import NvmlBackend
from tests.unit.chaos.test_nvml_stub import nvml_stub, state_file  # noqa: F401  (fixtures)

GIB = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize(
    ("extra", "reserved"),
    [pytest.param("", 512 * MIB, id="v2-reserve-reported"),
     pytest.param("gpu0.rc.nvmlDeviceGetMemoryInfo_v2=3\n", None, id="older-driver-v1-only")],
)
def test_used_includes_the_reserve_and_the_reserve_is_separate(nvml_stub: Path, state_file: Path,  # noqa: F811
                                                               extra: str, reserved: int | None) -> None:
    state_file.write_text("count=1\ngpu0.uuid=GPU-1\ngpu0.pci=00000000:3B:00.0\ngpu0.mem_total=85899345920\n"
                          f"gpu0.mem_used={16 * GIB}\ngpu0.mem_reserved={512 * MIB}\n"
                          f"gpu0.procs=4242:{15 * GIB}\n{extra}")
    b = NvmlBackend(str(nvml_stub))
    try:
        s = b.snapshot(0)
    finally:
        b.close()
    assert (s.memory_used, s.memory_total, s.memory_reserved) == (16 * GIB, 80 * GIB, reserved)
    assert not s.unsupported and not s.errors
    assert s.processes is not None and [(p.pid, p.used_bytes) for p in s.processes] == [(4242, 15 * GIB)]
