"""CUDA signatures in application logs: CUDA errors and GPU out-of-memory.

Where it sits: called by ``handlers.signatures.classify_line`` for container-log lines (PyTorch, TensorFlow,
JAX, plain CUDA runtime messages) that the agent's pod-log scanner and ``remediator classify`` read.
gpu-faults.md §4.1 and §5 give the formats.

CUDA errors that point at the GPU (uncorrectable ECC = 214, illegal address = 700, uncorrectable NVLink =
220, ...) are kind ``cuda_error`` with the CUDA error name as ``code`` and the Xids to look for beside it in
``detail["check_xids"]``; an NCCL watchdog that died of one is the same signal (``detail["via"]``).
Out-of-memory is ``cuda_oom``; PyTorch's message gives capacity, free and "this process has X in use", and
capacity - free - X is memory held by other processes (``detail["held_by_others_bytes"]``): when that is
large the OOM points at a leak or orphan, and the signal names the ``memory-leak`` playbook.
"""

from __future__ import annotations

import re

from handlers.signatures.model import Signal, freeze, to_int

# CUDA runtime errors: message fragment -> (cudaError name, number, Xids worth checking, GPU suspect?).
_CUDA_ERRORS: tuple[tuple[str, str, int, tuple[int, ...], bool], ...] = (
    ("uncorrectable ecc error", "cudaErrorECCUncorrectable", 214, (48, 63, 64, 94, 95), True),
    ("uncorrectable nvlink error", "cudaErrorNvlinkUncorrectable", 220, (74, 144, 145, 146, 147, 148, 149, 150),
     True),
    ("illegal memory access", "cudaErrorIllegalAddress", 700, (31, 13), False),
    ("illegal address", "cudaErrorIllegalAddress", 700, (31, 13), False),
    ("illegal instruction", "cudaErrorIllegalInstruction", 715, (13,), False),
    ("misaligned address", "cudaErrorMisalignedAddress", 716, (13,), False),
    ("unspecified launch failure", "cudaErrorLaunchFailure", 719, (13, 31, 43), False),
    ("launch timed out", "cudaErrorLaunchTimeout", 702, (8,), False),
    ("device-side assert", "cudaErrorAssert", 710, (), False),
    ("hardware stack error", "cudaErrorHardwareStackError", 714, (13,), False),
    ("no cuda-capable device", "cudaErrorNoDevice", 100, (79,), True),
    ("busy or unavailable", "cudaErrorDevicesUnavailable", 46, (), True),
    ("gpu has fallen off the bus", "cudaErrorDevicesUnavailable", 46, (79,), True),
    ("system has unsupported display driver", "cudaErrorInsufficientDriver", 35, (), False),
    ("driver version is insufficient", "cudaErrorInsufficientDriver", 35, (), False),
    ("system not yet initialized", "cudaErrorSystemNotReady", 802, (), True),
    ("operation not permitted when stream is capturing", "cudaErrorStreamCaptureUnsupported", 900, (), False),
    ("unknown error", "cudaErrorUnknown", 999, (79, 119), True),
)
_DRIVER_NAME_RE = re.compile(r"\b(CUDA_ERROR_[A-Z_]+|cudaError[A-Za-z]+|CUBLAS_STATUS_[A-Z_]+|CUDNN_STATUS_[A-Z_]+)\b")
_DRIVER_NAMES: dict[str, tuple[str, int, tuple[int, ...], bool]] = {
    "CUDA_ERROR_ECC_UNCORRECTABLE": ("cudaErrorECCUncorrectable", 214, (48, 63, 64, 94, 95), True),
    "CUDA_ERROR_NVLINK_UNCORRECTABLE": ("cudaErrorNvlinkUncorrectable", 220, (74, 149), True),
    "CUDA_ERROR_ILLEGAL_ADDRESS": ("cudaErrorIllegalAddress", 700, (31, 13), False),
    "CUDA_ERROR_LAUNCH_FAILED": ("cudaErrorLaunchFailure", 719, (13, 31, 43), False),
    "CUDA_ERROR_NO_DEVICE": ("cudaErrorNoDevice", 100, (79,), True),
    "CUDA_ERROR_UNKNOWN": ("cudaErrorUnknown", 999, (79, 119), True),
}
_OOM_NAMES = ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED")
# "Search for `cudaErrorDevicesUnavailable' in https://docs.nvidia.com/cuda/... for more information."
_HINT_RE = re.compile(r"search\s+for\s+`[^'`\s]*'\s+in\s+\S+\s+for\s+more\s+information\.?", re.IGNORECASE)
_ERR_NUM_RE = re.compile(r"(?:error\s*=\s*|runtime error \()(\d{1,4})\)?", re.IGNORECASE)
_DEVICE_RE = re.compile(r"\b(?:gpu|device|cuda:)\s*(\d{1,3})\b", re.IGNORECASE)

_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGTP]i?B|bytes|B)"
_UNITS = {"B": 1, "BYTES": 1, "KB": 1000, "KIB": 1024, "MB": 1000**2, "MIB": 1024**2, "GB": 1000**3,
          "GIB": 1024**3, "TB": 1000**4, "TIB": 1024**4, "PB": 1000**5, "PIB": 1024**5}
_TRIED_RE = re.compile(r"(?:tried|trying) to allocate\s+" + _SIZE, re.IGNORECASE)
# XLA's BFC allocator: "Resource exhausted: Failed to allocate request for 32.00MiB (33554432B) on device ordinal 0".
_XLA_REQUEST_RE = re.compile(r"failed\s+to\s+allocate\s+request\s+for\s+" + _SIZE + r"(?:\s*\((\d+)B\))?"
                             r"(?:\s+on\s+device\s+ordinal\s+(\d+))?", re.IGNORECASE)
# TensorFlow: "OOM when allocating tensor with shape[16,112,112,147] and type float on
# /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc".
_TF_DEVICE_RE = re.compile(r"device:(?P<dev>gpu|cpu):(?P<n>\d+)", re.IGNORECASE)
_TF_SHAPE_RE = re.compile(r"tensor\s+with\s+shape\s*(\[[\d,\s]*\])", re.IGNORECASE)
# A CUDA device-side assertion line (printf from the kernel, one per failing thread):
# "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [1,0,0], thread: [121,0,0] Assertion
# `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed."
_ASSERT_RE = re.compile(
    r"(?P<file>[^\s:]*(?::[\\/][^\s:]*)?\.cuh?):(?P<line>\d+):\s*(?:(?P<func>[^\n]*?):\s*)?block:\s*\[(?P<block>[\d,\s]+)\]"
    r",?\s*thread:\s*\[(?P<thread>[\d,\s]+)\]\s*assertion\s*[`'\"](?P<expr>.*?)[`'\"]\s*failed",
    re.IGNORECASE,
)
# PyTorch >= 2.1 ("capacty" in 2.1 itself).
_NEW_CAP_RE = re.compile(r"gpu\s+(\d+)\s+has\s+a\s+total\s+capac(?:i)?ty\s+of\s+" + _SIZE
                         + r"\s+of\s+which\s+" + _SIZE + r"\s+is\s+free", re.IGNORECASE)
_IN_USE_RE = re.compile(r"this\s+process\s+has\s+" + _SIZE + r"\s+memory\s+in\s+use", re.IGNORECASE)
_OTHER_PROC_RE = re.compile(r"process\s+(\d+)\s+has\s+" + _SIZE + r"\s+memory\s+in\s+use", re.IGNORECASE)
_ALLOC_BY_PT_RE = re.compile(_SIZE + r"\s+is\s+allocated\s+by\s+pytorch", re.IGNORECASE)
_RESERVED_UNALLOC_RE = re.compile(_SIZE + r"\s+is\s+reserved\s+by\s+pytorch\s+but\s+unallocated", re.IGNORECASE)
# PyTorch < 2.1: "(GPU 0; 23.65 GiB total capacity; 1.2 GiB already allocated; 11 MiB free; 2 GiB reserved ...)".
_OLD_RE = re.compile(r"\(\s*gpu\s+(\d+)\s*;\s*" + _SIZE + r"\s+total\s+capacity\s*;\s*" + _SIZE
                     + r"\s+already\s+allocated\s*;\s*" + _SIZE + r"\s+free\s*;\s*(?:" + _SIZE
                     + r"\s+allowed\s*;\s*)?" + _SIZE + r"\s+reserved", re.IGNORECASE)

# An OOM whose memory held by others exceeds this (or a tenth of the GPU) points at a leak or orphan.
ORPHAN_THRESHOLD_BYTES = 1024**3


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNITS.get(unit.upper(), 1))


def classify_cuda(text: str) -> Signal | None:
    """The CUDA error or out-of-memory signal in one unwrapped line, or None."""
    low = text.lower()
    if "search for `" in low:  # PyTorch's hint line names a cudaError* without reporting one
        text = _HINT_RE.sub(" ", text)
        low = text.lower()
    if "assertion" in low and "block" in low:
        a = _ASSERT_RE.search(text)
        if a is not None:
            return _assertion(a)
    if "out of memory" in low or "outofmemoryerror" in low or "oom when allocating" in low \
            or "failed to allocate request for" in low or any(n.lower() in low for n in _OOM_NAMES):
        sig = _oom(text, low)
        if sig is not None:
            return sig
    if "cuda" not in low and "cublas" not in low and "cudnn" not in low:
        return None
    return _cuda_error(text, low)


def _oom(text: str, low: str) -> Signal | None:
    gpu_context = ("cuda" in low or "gpu" in low or "cublas" in low or "resource_exhausted" in low
                   or "outofmemoryerror" in low or "resource exhausted" in low or "resourceexhausted" in low
                   or "device ordinal" in low)
    if not gpu_context or "killed process" in low or "oom-kill" in low or "oom_kill" in low:
        return None  # the host OOM killer is not a GPU signal
    tf_dev = _TF_DEVICE_RE.search(text) if "device:" in low else None
    if (tf_dev is not None and tf_dev.group("dev").lower() == "cpu") or "allocator cpu" in low:
        return None  # TensorFlow/XLA out of host memory
    if "not a failure" in low:
        return None  # XLA/TF BFC allocator: "ran out of memory ... The caller indicates that this is not a failure"
    detail: dict[str, object] = {}
    gpu_index: int | None = None
    tried = _TRIED_RE.search(text)
    if tried:
        detail["tried_bytes"] = _bytes(tried.group(1), tried.group(2))
    xla = _XLA_REQUEST_RE.search(text) if "request for" in low else None
    if xla is not None:
        detail["tried_bytes"] = int(xla.group(3)) if xla.group(3) else _bytes(xla.group(1), xla.group(2))
        detail["reporter"] = "xla"
        if xla.group(4):
            gpu_index = int(xla.group(4))
    if tf_dev is not None:
        gpu_index = int(tf_dev.group("n"))
    shape = _TF_SHAPE_RE.search(text) if "shape" in low else None
    if shape is not None:
        detail["tensor_shape"] = shape.group(1).replace(" ", "")
        detail["reporter"] = "tensorflow"
    new = _NEW_CAP_RE.search(text)
    held: int | None = None
    capacity: int | None = None
    if new:
        gpu_index = int(new.group(1))
        capacity = _bytes(new.group(2), new.group(3))
        free = _bytes(new.group(4), new.group(5))
        detail["capacity_bytes"] = capacity
        detail["free_bytes"] = free
        in_use = _IN_USE_RE.search(text)
        others = tuple((int(m.group(1)), _bytes(m.group(2), m.group(3))) for m in _OTHER_PROC_RE.finditer(text))
        if others:
            detail["other_processes"] = tuple({"pid": p, "bytes": b} for p, b in others)
        if in_use:
            used = _bytes(in_use.group(1), in_use.group(2))
            detail["in_use_bytes"] = used
            held = max(0, capacity - free - used)
            detail["held_by_others_bytes"] = held
        a = _ALLOC_BY_PT_RE.search(text)
        if a:
            detail["allocated_by_pytorch_bytes"] = _bytes(a.group(1), a.group(2))
        r = _RESERVED_UNALLOC_RE.search(text)
        if r:
            detail["reserved_unallocated_bytes"] = _bytes(r.group(1), r.group(2))
    else:
        old = _OLD_RE.search(text)
        if old:
            gpu_index = int(old.group(1))
            capacity = _bytes(old.group(2), old.group(3))
            free = _bytes(old.group(6), old.group(7))
            reserved = _bytes(old.group(10), old.group(11))
            detail.update(capacity_bytes=capacity, allocated_bytes=_bytes(old.group(4), old.group(5)),
                          free_bytes=free, reserved_bytes=reserved)
            held = max(0, capacity - free - reserved)
            detail["held_by_others_bytes"] = held
    if gpu_index is None and tf_dev is None:
        d = _DEVICE_RE.search(text)
        gpu_index = to_int(d.group(1)) if d else None
    suspect = held is not None and capacity is not None and held > max(ORPHAN_THRESHOLD_BYTES, capacity // 10)
    detail["memory_held_elsewhere"] = suspect if held is not None else None
    return Signal(kind="cuda_oom", code="out_of_memory", gpu_index=gpu_index,
                  playbook="memory-leak" if suspect else None, detail=freeze(detail))


def _assertion(a: re.Match[str]) -> Signal:
    """The ``cuda_error`` of one device-side assertion line: which kernel, where, which thread, what failed."""
    func = (a.group("func") or "").strip() or None
    detail: dict[str, object] = {
        "cuda_error": "cudaErrorAssert", "cuda_error_code": 710, "gpu_suspect": False,
        "source_file": a.group("file"), "source_line": int(a.group("line")), "kernel": func,
        "block": a.group("block").replace(" ", ""), "thread": a.group("thread").replace(" ", ""),
        "assertion": a.group("expr")[:256],
    }
    return Signal(kind="cuda_error", code="cudaErrorAssert", detail=freeze(detail))


def _cuda_error(text: str, low: str) -> Signal | None:
    found: tuple[str, int, tuple[int, ...], bool] | None = None
    if "cuda error" in low or "cuda runtime error" in low or "cuda failure" in low or "cuda driver error" in low \
            or "thcudacheck" in low or "cuda_error_" in low or "cudaerror" in low or "cublas_status" in low \
            or "cudnn_status" in low:
        for fragment, name, number, xids, suspect in _CUDA_ERRORS:
            if fragment in low:
                found = (name, number, xids, suspect)
                break
        if found is None:
            token = next((t for t in _DRIVER_NAME_RE.findall(text) if not t.endswith("_SUCCESS")), None)
            if token is not None:
                found = _DRIVER_NAMES.get(token, (token, 0, (), False))
        if found is None:
            m = re.search(r"cuda (?:driver |runtime )?error\s*(?:\(\d+\))?\s*:\s*([^.\n]{3,80})", text, re.IGNORECASE)
            if m is None:
                return None
            found = (m.group(1).strip(), 0, (), False)
    if found is None:
        return None
    name, number, xids, suspect = found
    num = _ERR_NUM_RE.search(text)
    detail: dict[str, object] = {
        "cuda_error": name,
        "cuda_error_code": number or (to_int(num.group(1)) if num else None),
        "check_xids": xids or None,
        "gpu_suspect": suspect,
        "via": "nccl_watchdog" if "watchdog" in low else None,
    }
    d = _DEVICE_RE.search(text)
    return Signal(kind="cuda_error", code=name, gpu_index=to_int(d.group(1)) if d else None,
                  is_fatal=suspect, detail=freeze(detail))
