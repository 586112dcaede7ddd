"""CUDA error and out-of-memory signatures (gpu-faults.md §4.1, §5), with the OOM memory arithmetic."""

from __future__ import annotations

import pytest

from handlers.signatures import classify_line

GIB = 1024**3
MIB = 1024**2


def test_pytorch_oom_arithmetic_reveals_memory_held_by_others() -> None:
    sig = classify_line(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 "
        "GiB of which 1.50 GiB is free. Process 4242 has 30.00 GiB memory in use. Including non-PyTorch memory, this "
        "process has 47.60 GiB memory in use. Of the allocated memory 45.00 GiB is allocated by PyTorch, and 1.20 GiB "
        "is reserved by PyTorch but unallocated.")
    assert sig is not None and (sig.kind, sig.gpu_index) == ("cuda_oom", 1)
    d = sig.detail
    assert d["tried_bytes"] == 2 * GIB
    assert d["capacity_bytes"] == int(79.15 * GIB)
    assert d["free_bytes"] == int(1.5 * GIB)
    assert d["in_use_bytes"] == int(47.6 * GIB)
    assert d["held_by_others_bytes"] == int(79.15 * GIB) - int(1.5 * GIB) - int(47.6 * GIB)
    assert d["other_processes"] == ({"pid": 4242, "bytes": 30 * GIB},)
    assert d["memory_held_elsewhere"] is True
    assert sig.playbook == "memory-leak"


def test_oom_of_the_process_itself_is_no_leak() -> None:
    sig = classify_line(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of "
        "23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use.")
    assert sig is not None and sig.kind == "cuda_oom" and sig.gpu_index == 0
    held = sig.detail["held_by_others_bytes"]
    assert isinstance(held, int) and held < GIB
    assert sig.detail["memory_held_elsewhere"] is False
    assert sig.playbook is None


def test_pytorch_21_typo_capacty() -> None:
    sig = classify_line("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
                        "total capacty of 3.81 GiB of which 17.19 MiB is free. Including non-PyTorch memory, this "
                        "process has 3.29 GiB memory in use.")
    assert sig is not None and sig.detail["capacity_bytes"] == int(3.81 * GIB)
    held = sig.detail["held_by_others_bytes"]
    assert isinstance(held, int) and 0.45 * GIB < held < 0.55 * GIB  # the "about 0.5 GiB elsewhere" example


def test_pre_21_oom_format() -> None:
    sig = classify_line("RuntimeError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 15.78 GiB total "
                        "capacity; 8.02 GiB already allocated; 1.12 GiB free; 12.31 GiB reserved in total by PyTorch)")
    assert sig is not None and (sig.kind, sig.gpu_index) == ("cuda_oom", 0)
    assert sig.detail["reserved_bytes"] == int(12.31 * GIB)
    assert sig.detail["held_by_others_bytes"] == int(15.78 * GIB) - int(1.12 * GIB) - int(12.31 * GIB)


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: out of memory",
        "2024-01-01 tensorflow/core/common_runtime/gpu/gpu_device.cc] failed to allocate 2.0G: "
        "CUDA_ERROR_OUT_OF_MEMORY",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB "
        "on GPU",
    ],
)
def test_other_gpu_oom_forms(line: str) -> None:
    sig = classify_line(line)
    assert sig is not None and sig.kind == "cuda_oom"


def test_host_oom_killer_is_not_a_gpu_signal() -> None:
    assert classify_line("[ 123.4] Out of memory: Killed process 4242 (python) total-vm:123kB, anon-rss:1kB") is None
    assert classify_line("[ 123.4] python invoked oom-killer: gfp_mask=0x100cca, order=0 out of memory") is None


@pytest.mark.parametrize(
    ("line", "code", "number", "suspect"),
    [
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cudaErrorECCUncorrectable", 214, True),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cudaErrorIllegalAddress", 700, False),
        ("RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
         "cudaErrorNvlinkUncorrectable", 220, True),
        ("RuntimeError: CUDA error: unspecified launch failure", "cudaErrorLaunchFailure", 719, False),
        ("RuntimeError: CUDA error: device-side assert triggered", "cudaErrorAssert", 710, False),
        ("RuntimeError: CUDA error: no CUDA-capable device is detected", "cudaErrorNoDevice", 100, True),
        ("THCudaCheck FAIL file=/pytorch/aten/src/THC/THCCachingHostAllocator.cpp line=278 error=700 : an illegal "
         "memory access was encountered", "cudaErrorIllegalAddress", 700, False),
        ("cuda runtime error (214) : uncorrectable ECC error encountered at /pytorch/aten/src/THC/THCGeneral.cpp:405",
         "cudaErrorECCUncorrectable", 214, True),
        ("E tensorflow/stream_executor/cuda/cuda_driver.cc:1010] failed to synchronize: CUDA_ERROR_ECC_UNCORRECTABLE",
         "cudaErrorECCUncorrectable", 214, True),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, "
         "k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, CUDA_R_32F, "
         "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`", "CUBLAS_STATUS_EXECUTION_FAILED", None, False),
    ],
)
def test_cuda_errors(line: str, code: str, number: int | None, suspect: bool) -> None:
    sig = classify_line(line)
    assert sig is not None and (sig.kind, sig.code) == ("cuda_error", code)
    assert sig.detail.get("cuda_error_code") == number
    assert sig.detail["gpu_suspect"] is suspect
    assert sig.is_fatal is suspect


@pytest.mark.parametrize(
    "line",
    [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
        "be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
        "Using device: cuda:0",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py", line 300, in _lazy_init',
        "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
        "torch.cuda.is_available(): True, CUDA version 12.4, cuDNN 90100",
    ],
)
def test_cuda_mentions_that_are_no_fault(line: str) -> None:
    assert classify_line(line) is None
