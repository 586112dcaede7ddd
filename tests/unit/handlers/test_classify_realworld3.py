"""A third pass of real-world lines (issue 13): GPU faults as frameworks other than PyTorch and tools other
than the kernel print them, records split over lines, and the negatives that look close.

Classes: ``nvidia-smi`` failing to reach a GPU with "Unknown Error" (a GPU off the bus in the source threads);
NCCL failures as XLA/JAX report them; out-of-memory as JAX/XLA and TensorFlow print it (and the old XLA form
split over two lines); cuBLAS/cuDNN failures outside PyTorch; DCGM host-engine health watches and ``dcgmi
diag`` result rows; aws-ofi-nccl (NET/OFI) failures; CUDA device-side assertion lines; a watchdog timeout
wrapped over three lines. Every line is verbatim from the public source named beside it (an issue or PR
thread; ``find_string id N`` for a file of the code index); where a Markdown quote or tick was part of the
paste it is kept. Expectations come from ``../shared/reference/gpu-faults.md`` and the classify contract.

``CASES`` are single lines; ``RECORDS`` are verbatim multi-line excerpts that must give exactly the signals
listed, each at the line where its record starts (the framing layer, ``handlers.signatures.framing``).
"""
# ruff: noqa: E501

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from handlers.signatures import LineScanner, classify_line
from remediator.cli.classify import classify_text
from tests.unit.handlers.test_classify_realworld import NONE, Expect, K, X, _check, _row

GH = "https://github.com/"

# (line, expectation, source)
CASES: list[tuple[str, Expect, str]] = [
    # --- nvidia-smi cannot get a handle: "Unknown Error" (GPU off the bus) ------------------------------------
    ("Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error", K("gpu_lost", "0000:0b:00.0"),
     GH + "xxd3vin/workspace/issues/19"),
    ("Unable to determine the device handle for GPU 000:BA:80.0: Unknown Error", K("gpu_lost"),
     GH + "NVIDIA/dcgm-exporter/issues/604"),
    ("Unable to determine the device handle for GPU0000:20:00.0: Unknown Error", K("gpu_lost", "0000:20:00.0"),
     GH + "cihlab/fics-cluster-guide/issues/53 (title; dmesg there shows NVSwitch SXid 20034)"),
    ("Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error", K("gpu_lost", "0000:09:00.0"),
     GH + "NVIDIA/nvidia-docker/issues/1553"),
    ("Unable to determine the device handle for GPU0000:07:00.0: Unknown Error", K("gpu_lost", "0000:07:00.0"),
     GH + "pdbear/syno_nvidia_gpu_driver/issues/22"),
    ("Unable to determine the device handle for GPU0000:17:00.0: Unknown Error", K("gpu_lost", "0000:17:00.0"),
     GH + "meta-llama/llama-models/issues/200"),
    ("Unable to determine the device handle for GPU0000:65:00.0: Unknown Error -- only from container",
     K("gpu_lost", "0000:65:00.0"), GH + "NVIDIA/nvidia-container-toolkit/issues/69 (title)"),
    ("Unable to detect the device handle for GPU0000:B1:00.0: Unknown Error", K("gpu_lost", "0000:b1:00.0"),
     GH + "jamesstringer90/Easy-GPU-PV/issues/276"),
    # --- NCCL failures as XLA/JAX report them ---------------------------------------------------------------
    ("INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:275: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error",
     K("nccl_error"), GH + "jax-ml/jax/issues/17399"),
    ("2023-09-01 10:20:11.257981: E external/xla/xla/pjrt/pjrt_stream_executor_client.cc:2593] Execution of replica 3 failed: INTERNAL: Failed to execute XLA Runtime executable: run time error: custom call 'xla.gpu.all_reduce' failed: external/xla/xla/service/gpu/nccl_utils.cc:275: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error; current tracing scope: all-reduce-start.163; current profiling annotation: XlaModule:#hlo_module=pmap_train_step,program_id=1239#.",
     K("nccl_error"), GH + "jax-ml/jax/issues/17399"),
    ("INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled system error (run with NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'socketTryAccept: Accept failed: Bad file descriptor'.",
     K("nccl_error"), GH + "jax-ml/jax/issues/22747"),
    ("NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error (run with NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'Cuda failure 2 'out of memory''.; current tracing scope: all-reduce-start.285; current profiling annotation: XlaModule:#hlo_module=pjit__wrapped_step_fn,program_id=25#.",
     K("nccl_error"), GH + "openxla/xla/pull/7201"),
    ("2024-07-30 01:35:14.107390: W external/xla/xla/service/gpu/runtime/support.cc:58] Intercepted XLA runtime error:",
     NONE, GH + "jax-ml/jax/issues/22747 (the line before the error: no fault named yet)"),
    ("user-G493-ZB1-AAP1-000:275204:275658 [4] NCCL INFO misc/socket.cc:666 -> 2",
     NONE, GH + "jax-ml/jax/issues/22747 (NCCL INFO return-code trace)"),
    # --- out of memory: JAX/XLA and TensorFlow ----------------------------------------------------------------
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406166528 bytes.",
     K("cuda_oom"), GH + "google-deepmind/alphafold/issues/1023"),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.",
     K("cuda_oom"), GH + "patrickbryant1/AFProfile/issues/8"),
    ("RuntimeError: Resource exhausted: Failed to allocate request for 32.00MiB (33554432B) on device ordinal 0",
     K("cuda_oom", gpu=0), GH + "kingoflolz/mesh-transformer-jax/issues/66"),
    ("2021-07-21 16:15:16.513776: E external/org_tensorflow/tensorflow/compiler/xla/pjrt/pjrt_stream_executor_client.cc:1981] Execution of replica 0 failed: Resource exhausted: Failed to allocate request for 32.00MiB (33554432B) on device ordinal 0",
     K("cuda_oom", gpu=0), GH + "kingoflolz/mesh-transformer-jax/issues/66"),
    ("2021-08-12 18:16:23.302001: E external/org_tensorflow/tensorflow/compiler/xla/pjrt/pjrt_stream_executor_client.cc:1960] Execution of replica 0 failed: Resource exhausted: Failed to allocate request for 20.18GiB (21670470184B) on device ordinal 0",
     K("cuda_oom", gpu=0), GH + "kingoflolz/mesh-transformer-jax/issues/90"),
    ("E1103 18:23:55.103160 3413767 gpu_cudamallocasync_allocator.cc:361] gpu_async_1 cuMemAllocAsync failed to allocate 1225195446464 bytes: RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory",
     K("cuda_oom"), GH + "NovaSky-AI/SkyRL/issues/624"),
    ("ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[1,5095,3729,3]",
     K("cuda_oom"), GH + "tensorflow/tensorflow/issues/17669 (title)"),
    ("ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[100,4096,32]",
     K("cuda_oom"), GH + "santi-pdp/segan/issues/42"),
    ("  (0) Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
     K("cuda_oom", gpu=0), GH + "Azure/MachineLearningNotebooks/issues/880"),
    ("ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[500,17,17,4032] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc.",
     K("cuda_oom", gpu=0), GH + "tensorflow/models/issues/7142"),
    ("ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[256,112,112,64]",
     K("cuda_oom"), GH + "tensorflow/tensorflow/issues/4735"),
    ("Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom to RunOptions for current allocation info.",
     NONE, GH + "Azure/MachineLearningNotebooks/issues/880 (TensorFlow's hint under the OOM)"),
    ("BufferAssignment OOM Debugging.", NONE, GH + "patrickbryant1/AFProfile/issues/8 (XLA's debug header)"),
    # --- cuBLAS / cuDNN outside PyTorch ------------------------------------------------------------------------
    ("F0827 19:55:39.568928 17377 math_functions.cu:26] Check failed: status == CUBLAS_STATUS_SUCCESS (13 vs. 0)  CUBLAS_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "rbgirshick/py-faster-rcnn/issues/912"),
    ("F0421 09:02:45.161278  7233 math_functions.cu:52] Check failed: status == CUBLAS_STATUS_SUCCESS (13 vs. 0)  CUBLAS_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "chengyangfu/caffe/issues/6"),
    ("`2021-09-08 23:23:08.258752: E tensorflow/stream_executor/cuda/cuda_blas.cc:652] failed to run cuBLAS routine cublasSgemm_v2: CUBLAS_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "kimiyoung/transformer-xl/issues/139"),
    ("E tensorflow/stream_executor/cuda/cuda_dnn.cc:81] CUDNN_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "Li-Chongyi/Ucolor/issues/9"),
    ("E tensorflow/stream_executor/cuda/cuda_blas.cc:647] failed to run cuBLAS routine cublasSgemm_v2: CUBLAS_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "Li-Chongyi/Ucolor/issues/9"),
    ("CUBLAS failure 13: CUBLAS_STATUS_EXECUTION_FAILED ; GPU=1 ; hostname=rg404.bbn.com ; expr=cublas_gemm(cuHandle, CUBLAS_OP_N, CUBLAS_OP_N, (int) ARows, 1, (int) ACols, &alpha, a.Data()+ offsets[0], (int) ALd, GetOnesVector<ElemType>(ACols, a.GetComputeDeviceId())->Data(), (int) ACols, &beta, Data()+ offsets[1], (int) ARows)",
     K("cuda_error"), GH + "microsoft/CNTK/issues/379"),
    ("2017-12-30 21:18:15.018347: E tensorflow/stream_executor/cuda/cuda_blas.cc:366] failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED",
     K("cuda_error"), GH + "tensorflow/tensorflow/issues/9489"),
    ("2023-09-17 21:17:40.944285: E tensorflow/stream_executor/cuda/cuda_blas.cc:428] failed to run cuBLAS routine: CUBLAS_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "YudongGuo/AD-NeRF/issues/132 (title)"),
    ("2023-02-05 10:33:42.317036: E tensorflow/stream_executor/cuda/cuda_blas.cc:428] failed to run cuBLAS routine: CUBLAS_STATUS_EXECUTION_FAILED",
     K("cuda_error"), GH + "Kotlin/kotlindl/issues/518"),
    ("2023-02-05 10:33:42.061163: I tensorflow/stream_executor/platform/default/dso_loader.cc:44] Successfully opened dynamic library cublas64_100.dll",
     NONE, GH + "Kotlin/kotlindl/issues/518 (library load)"),
    ("*** Check failure stack trace: ***", NONE, GH + "rbgirshick/py-faster-rcnn/issues/912"),
    # --- CUDA device-side assertion lines ----------------------------------------------------------------------
    ('/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [1,0,0], thread: [121,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed.',
     K("cuda_error"), GH + "huggingface/accelerate/issues/2539"),
    ('/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:94: operator(): block: [0,0,0], thread: [31,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.',
     K("cuda_error"), GH + "kvcache-ai/ktransformers/issues/467"),
    ('C:\\actions-runner\\_work\\pytorch\\pytorch\\builder\\windows\\pytorch\\aten\\src\\ATen\\native\\cuda\\IndexKernel.cu:91: block: [26,0,0], thread: [32,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed.',
     K("cuda_error"), GH + "kousw/stable-diffusion-webui-daam/issues/4"),
    # --- DCGM: host-engine health watches, dcgmi diag -----------------------------------------------------------
    ("`ERROR [1514002:1514004] [[Health]] Detected a WARNING in health system Thermal: 'Detected clocks event due to thermal violation in GPU 2. Verify that the cooling on this machine is functional, including external, thermal material interface, fans, and any other components.`",
     K("thermal", gpu=2), GH + "NVIDIA/DCGM/issues/270"),
    ("|                           | Fail - GPU: 0                                  |",
     K("health_check", gpu=0), "stas00/ml-engineering, dcgmi diag -r 2 on a faulty node (find_string id 1844595288)"),
    ("| Targeted Power            | Pass - GPUs: 0, 2, 3                           |\\n|                           | Fail - GPU: 1                                  |\\n",
     K("health_check", gpu=1), "dcgmi diag table pasted JSON-escaped (find_string id 25468481308)"),
    ("| Warning                   | GPU 0 Thermal violations totaling 13.3 second  |",
     NONE, "stas00/ml-engineering (find_string id 1844595288): the warning text under a failing row"),
    ("| Denylist                  | Pass                                           |", NONE, GH + "NVIDIA/DCGM/issues/55"),
    ("2026-01-16 09:50:02.437 WARN  [3279516:3279516] Error getting the graphics pids for GPU 0. Status = -32 skipping check. [/builds/dcgm/dcgm/nvvs/src/Software.cpp:598] [Software::checkForGraphicsProcesses]",
     NONE, GH + "NVIDIA/DCGM/issues/272 (nvvs skipping a check)"),
    ("2026-01-16 09:50:02.437 DEBUG [3279516:3279516] Fabric manager successfully started for GPU 6 [/builds/dcgm/dcgm/nvvs/src/Software.cpp:1003] [Software::checkFabricManager]",
     NONE, GH + "NVIDIA/DCGM/issues/272"),
    # --- aws-ofi-nccl (NET/OFI) ----------------------------------------------------------------------------------
    ("NCCL WARN NET/OFI Request completed with error. RC: 21. Error: unknown error", K("nccl_error"),
     GH + "aws/aws-ofi-nccl/issues/161 (title)"),
    ("  | 2024-11-28T07:42:11.527Z | algo-1:17778:17848 [5] nccl_ofi_ofiutils_init_connection:274 NCCL WARN NET/OFI Couldn't open CQ. RC: -22, ERROR: Invalid argument",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/715 (CloudWatch table paste)"),
    ("get_req_from_imm_data:1411 NCCL WARN NET/OFI Unexpected status (0) for message 246", K("nccl_error"),
     GH + "aws/aws-ofi-nccl/issues/927"),
    ("process_completions:1648 NCCL WARN NET/OFI Write complete from unexpected request type!", K("nccl_error"),
     GH + "aws/aws-ofi-nccl/issues/927"),
    ("algo-1:462:462 [0] NCCL INFO NET/OFI Setting FI_EFA_FORK_SAFE environment variable to 1", NONE,
     GH + "aws/aws-ofi-nccl/issues/161"),
    ("libfabric:462:1673041636:efa:core:rxr_info_to_rxr():506<warn> FI_HMEM capability requires RDMA, which this device does not support.",
     NONE, GH + "aws/aws-ofi-nccl/issues/161"),
    ("2024-Sep-23 00:09:01.0809 1:26 [1] include/socket.h:270 CCOM WARN Skipping IPv6 loopback adddress",
     NONE, "Neuron CCOM WARN that skips an address (find_string id 41670846932)"),
    ("node23:12098:12141 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'", K("nccl_error"),
     GH + "NVIDIA/nccl/issues/1488 (NVLS after a Fabric Manager restart)"),
    ("[3] enqueue.cc:215 NCCL WARN Cuda failure 'invalid device function'", K("nccl_error"),
     GH + "NVIDIA/nccl/issues/444 (NCCL_DEBUG=WARN with only the device prefix)"),
    ("`[0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]", NONE,
     GH + "NVIDIA/nccl/issues/444 (no verbs library: sockets are used; INFO in later releases)"),
    ("h100-kickoff-llama-70b-chat-20230328-bcf75c4f6-gn6nd:2340:2384 [4] NCCL INFO Failed to open libibverbs.so[.1]",
     NONE, GH + "NVIDIA/nccl/issues/1410 (the same as INFO)"),
    ("ml3:32632:32662 [0] NCCL INFO Net/IB: call to devices() returned 0 devices.", NONE,
     GH + "horovod/horovod/issues/685 (NCCL 2.3.7)"),
    # --- breadth: vLLM, TensorRT/Triton, monitoring agents, Fabric Manager, nvidia-smi -q ----------------------
    ("(Worker_PP0 pid=23220) ERROR 07-15 21:01:01 [multiproc_executor.py:1007] torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
     K("cuda_error"), GH + "SystemPanic/vllm-windows/issues/72 (vLLM worker)"),
    ("(Worker_PP0 pid=23220) ERROR 07-15 21:01:01 [multiproc_executor.py:1007] Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.",
     NONE, GH + "SystemPanic/vllm-windows/issues/72 (PyTorch's hint line)"),
    ("(Worker_PP0 pid=23220) ERROR 07-15 21:01:01 [multiproc_executor.py:1007] Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
     NONE, GH + "SystemPanic/vllm-windows/issues/72"),
    ("ERROR 05-12 19:01:18 [serving_chat.py:885] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
     NONE, GH + "vllm-project/vllm/issues/18045 (the consequence; the cause is above it)"),
    ("INFO 02-25 11:11:31 metrics.py:455] Avg prompt throughput: 2082.8 tokens/s, Avg generation throughput: 194.4 tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 4.8%, CPU KV cache usage: 0.0%.",
     NONE, GH + "vllm-project/vllm/issues/13939 (metrics)"),
    ("ERROR 07-21 13:02:07 [core.py:588] EngineCore encountered a fatal error.", NONE,
     GH + "vllm-project/vllm/issues/21466"),
    ("ERROR: ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)", K("cuda_oom"),
     GH + "NVIDIA/TensorRT/issues/840"),
    ("[08/03/2022-23:18:05] [E] [TRT] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)",
     K("cuda_oom"), GH + "linghu8812/tensorrt_inference/issues/117"),
    ("WARNING: Get cuda error during timeReformat.", NONE, GH + "NVIDIA/TensorRT/issues/840 (tactic timing warning)"),
    ("Model 'tensorrt_llm' loading failed with error: version 1 is at UNAVAILABLE state: Internal: unexpected error when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)",
     K("cuda_oom"), GH + "triton-inference-server/tensorrtllm_backend/issues/281"),
    ("  what():  [FT][ERROR] CUDA runtime error: out of memory /workspace/build/fastertransformer_backend/build/_deps/repo-ft-src/src/fastertransformer/utils/allocator.h:220",
     K("cuda_oom"), GH + "triton-inference-server/fastertransformer_backend/issues/157"),
    ("Failed to allocate CUDA memory with byte size 78643200 on GPU 0: CNMEM_STATUS_OUT_OF_MEMORY, falling back to pinned system memory",
     NONE, GH + "triton-inference-server/server/issues/1765 (title; Triton recovered by falling back)"),
    ("[1231741.378609] NVRM: Xid (PCI:0009:01:00): 43, pid=3188489, name=trigger_xid, channel 0x0b00000a",
     X(43, "0009:01:00"), GH + "kubernetes-sigs/dra-driver-nvidia-gpu/issues/904"),
    ("kwi 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 38, pid=326, name=modprobe, channel 0x00000003 0000c597 00000000 00000000",
     X(38, "0000:07:00"), GH + "NVIDIA/open-gpu-kernel-modules/issues/1045 (Polish syslog month)"),
    ("kwi 15 07:56:59 testowy kernel: NVRM: GPU at PCI:0000:07:00: GPU-fb51809b-350a-99db-67b5-e16fc6d498ab",
     NONE, GH + "NVIDIA/open-gpu-kernel-modules/issues/1045 (identity line)"),
    ("XID 79(GPU has fallen off the bus) detected on PCI:0000:ae:00", X(79, "0000:ae:00"),
     GH + "leptonai/gpud/issues/604 (gpud's rendering)"),
    ("failed to get remapped rows for GPU-ac896b35-5782-c478-4b2a-a661de07770f: failed to get device remapped rows: ERROR_GPU_IS_LOST",
     K("gpu_lost"), GH + "leptonai/gpud/issues/604"),
    ("      message: 'GPU XID 79 - GPU has fallen off the bus',", X(79, None),
     GH + "NVIDIA/NVSentinel/pull/966 (HealthEvent document)"),
    ("Sep 18 03:19:01 ubuntu2404 nvidia-fabricmanager-start.sh[4756]: request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]",
     NONE, GH + "data-infra/cube-studio/issues/29 (Fabric Manager on a host without NVSwitch: setup)"),
    ("11月 15 14:15:47 leon-NF5468M6 nv-fabricmanager[4177]: request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]",
     NONE, GH + "NVIDIA/gpu-operator/issues/610"),
    ("10.10.10.10: 2025/11/25 13:58:49 nvidia-fabricmanager-wrapper: waiting for socket creation at /var/run/nvidia-fabricmanager/fm_sm_ipc.socket",
     NONE, GH + "siderolabs/extensions/issues/893"),
    ("        State                                          : In Progress", NONE,
     GH + "NVIDIA/gpu-operator/issues/2511 (nvidia-smi -q Fabric block)"),
    ("        Reset Required                    : N/A", NONE, GH + "NVIDIA/nvidia-docker/issues/1753 (nvidia-smi -q)"),
    ("        Drain and Reset Recommended       : N/A", NONE, GH + "NVIDIA/nvidia-docker/issues/1753 (nvidia-smi -q)"),
    ("\t\t\t<pending_blacklist>N/A</pending_blacklist>", NONE, GH + "influxdata/telegraf/issues/12996 (nvidia-smi -q -x)"),
    ("The current drain state of GPU 00000000:3F:00.0 is: not draining.", NONE, GH + "NVIDIA/dcgm-exporter/issues/213"),
]

# (verbatim excerpt, [(1-based line, kind)], source)
RECORDS: list[tuple[str, list[tuple[int, str]], str]] = [
    ("[1] 2019-06-13 01:17:08.886805: E external/org_tensorflow/tensorflow/compiler/xla/python/local_client.cc:672] Execution of replica 0 failed: Resource exhausted: Out \n"
     "of memory while trying to allocate 5520758552 bytes.",
     [(1, "cuda_oom")], GH + "jax-ml/jax/issues/788 (the old XLA form, split over two lines)"),
    ("[rank1]:[E1111 17:01:37] [Rank 1] Watchdog caught collective operation timeout: \n"
     "WorkNCCL(SeqNum=14863, OpType=ALLREDUCE, NumelIn=14845952, NumelOut=14845952, Timeout(ms)=1800000) \n"
     "ran for 1800048 milliseconds before timing out.\n"
     "\n"
     "[rank1]:[E1111 17:10:53] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress",
     [(1, "nccl_timeout"), (5, "nccl_timeout")], "a timeout record wrapped over three lines (find_string id 27867738904)"),
    ("| GPU Memory                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |\n"
     "|                           | Fail - GPU: 0                                  |\n"
     "| Warning                   | GPU 0 Thermal violations totaling 13.3 second  |\n"
     "|                           | s started at 9.7 seconds into the test for GP  |\n"
     "|                           | U 0 Verify that the cooling on this machine i  |\n"
     "|                           | s functional, including external, thermal mat  |\n"
     "|                           | erial interface, fans, and any other componen  |\n"
     "|                           | ts.",
     [(1, "health_check")], "stas00/ml-engineering, dcgmi diag -r 2 on a faulty node (find_string id 1844595288)"),
    ("2024-07-30 01:35:14.107390: W external/xla/xla/service/gpu/runtime/support.cc:58] Intercepted XLA runtime error:\n"
     "INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled system error (run with NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'socketTryAccept: Accept failed: Bad file descriptor'.",
     [(2, "nccl_error")], GH + "jax-ml/jax/issues/22747"),
]


def _params() -> list[Any]:
    counts: Counter[str] = Counter()
    out = []
    for line, expect, source in CASES:
        fam = expect.kind or "none"
        counts[fam] += 1
        out.append(pytest.param(line, expect, source, id=f"{fam}-{counts[fam]:03d}"))
    return out


@pytest.mark.parametrize(("line", "expect", "source"), _params())
def test_line_is_judged_as_the_reference_says(line: str, expect: Expect, source: str) -> None:
    assert "\n" not in line
    single = classify_line(line)
    _check(expect, [] if single is None else [_row(single)], f"classify_line ({source})")
    cli = [f.row() for f in classify_text(line + "\n")]
    _check(expect, cli, f"classify ({source})")


@pytest.mark.parametrize(("text", "expected", "source"), RECORDS, ids=[f"record-{i}" for i in range(len(RECORDS))])
def test_a_record_over_several_lines_is_one_signal_where_it_starts(text: str, expected: list[tuple[int, str]],
                                                                   source: str) -> None:
    found = [(n, s.kind) for n, s in LineScanner().scan_text(text)]
    assert found == expected, source
    assert [(f.line, f.signal.kind) for f in classify_text(text + "\n")] == expected, source


def _case(fragment: str) -> str:
    return next(line for line, _, _ in CASES if fragment in line)


def _sig(fragment: str) -> Any:
    sig = classify_line(_case(fragment))
    assert sig is not None, fragment
    return sig


def test_details_that_the_handlers_use() -> None:
    xla = _sig("nccl_utils.cc:275: NCCL operation")
    assert xla.code == "ncclUnhandledCudaError" and xla.detail["operation"] == "ncclCommInitRank"
    sys_err = _sig("INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305")
    assert sys_err.code == "ncclSystemError" and "socketTryAccept" in str(sys_err.detail["last_nccl_warning"])
    assert _sig("RuntimeError: Resource exhausted: Failed to allocate").detail["tried_bytes"] == 33554432
    assert _sig("shape[500,17,17,4032]").detail["tensor_shape"] == "[500,17,17,4032]"
    assert _sig("F0827 19:55:39").code == "CUBLAS_STATUS_EXECUTION_FAILED"  # not the _SUCCESS it compares to
    assertion = _sig("IndexKernel.cu:93")
    assert assertion.code == "cudaErrorAssert" and assertion.detail["kernel"] == "operator()"
    assert assertion.detail["thread"] == "121,0,0" and assertion.detail["source_line"] == 93
    dcgm = _sig("[[Health]]")
    assert dcgm.detail["health_system"] == "Thermal" and dcgm.detail["severity"] == "WARNING"
    lost = _sig("GPU 0000:0B:00.0: Unknown Error")
    assert lost.code == "device_handle_unknown_error" and lost.playbook == "gpu-lost"
    assert _sig("| Targeted Power").detail["test"] == "Targeted Power"
    assert _sig("Request completed with error").detail["ofi_request_failed"] is True


def test_negatives_with_positives_around_them_stay_silent() -> None:
    text = "\n".join(line for line, _, _ in CASES)
    found = {n for n, _ in LineScanner().scan_text(text)}
    for n, (_line, expect, source) in enumerate(CASES, 1):
        assert (n in found) != expect.none, (n, source)


def test_the_table_covers_every_class_of_issue_13() -> None:
    kinds = Counter(e.kind for _, e, _ in CASES if e.kind)
    assert {"gpu_lost", "nccl_error", "cuda_oom", "cuda_error", "thermal", "health_check"} <= set(kinds)
    assert sum(1 for _, e, _ in CASES if e.none) >= 12
    lines = [line for line, _, _ in CASES]
    assert len(set(lines)) == len(lines)
