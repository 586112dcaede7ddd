"""A fourth pass of real-world lines (issue 13, the gaps left after the third): NCCL releases before the tag,
IB/OFI plugin lines quoted without NCCL's prefix or behind a log shipper's, XLA/RCCL and Horovod "invalid
usage", Slurm's GPU drain reasons (one of them after a MIG layout change) and NHC's failed GPU checks,
DeepSpeed's launcher, Megatron, Ray and SGLang -- and the lines around them that look close and are not faults
(schedulers saying they killed a subprocess or drained a node for a reason that names no GPU, NHC failing for
no GPU reason, NCCL INFO chatter behind an MPI rank prefix,
host-memory OOM kills, SGLang's "Scheduler hit an exception" header before the traceback names anything).

Every line is verbatim from the public source named beside it (an issue thread, or ``find_string id N`` for a
file of the code index); where the paste redacted a host name, the redaction is kept. Expectations come from
``../shared/reference/gpu-faults.md`` and the classify contract.
"""
# ruff: noqa: E501

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from handlers.signatures import LineScanner, classify_line, has_anchor
from handlers.signatures.explain import explain
from remediator.cli.classify import classify_text
from tests.unit.handlers.test_classify_realworld import NONE, Expect, K, X, _check, _row

GH = "https://github.com/"

# (line, expectation, source)
CASES: list[tuple[str, Expect, str]] = [
    # --- NCCL before the "NCCL" tag, and IB/OFI lines without NCCL's own prefix -----------------------------
    ("*server name* [0] include/socket.h:185 WARN Call to connect failed : Connection refused", K("nccl_error"),
     GH + "NVIDIA/nccl/issues/111 (NCCL 2.0; host redacted by the reporter)"),
    ("NET/IBP:Got completion from peer 7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err 129 (Send)",
     K("nccl_error"), GH + "NVIDIA/nccl/issues/1664"),
    ("  | 2024-11-28T07:42:11.527Z | algo-1:17778:17848 [5] nccl_ofi_ofiutils_init_connection:274 NCCL WARN NET/OFI Couldn't open CQ. RC: -22, ERROR: Invalid argument",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/715 (CloudWatch-prefixed)"),
    ("  | 2024-11-28T07:42:11.527Z | algo-1:17778:17848 [5] nccl_net_ofi_create_plugin:259 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/715"),
    ("get_req_from_imm_data:1411 NCCL WARN NET/OFI Unexpected status (0) for message 246", K("nccl_error"),
     GH + "aws/aws-ofi-nccl/issues/927"),
    ("process_completions:1648 NCCL WARN NET/OFI Write complete from unexpected request type!", K("nccl_error"),
     GH + "aws/aws-ofi-nccl/issues/927"),
    ("init.cc:290 NCCL WARN Attempt to use communicator before the previous operation returned ncclSuccess",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/927"),
    # --- aws-ofi-nccl behind Open MPI's --tag-output rank prefix, and its pre-NCCL-tag format -------------------
    ("`[1,13]<stdout>:nccl-tests-worker-1:35:89 [5] ofi_process_cq:1039 NCCL WARN NET/OFI Request 0x7fbb944701b8 completed with error. RC: 20. Error: unknown error. Completed length: 0, Request: { buffer_index: 255, dev: 1, size: 0, state: CREATED, direction: SEND }",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/156 (the Markdown tick is the reporter's)"),
    ("[1,23]<stdout>:ip-172-32-45-165:72593:73427 [7] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/24"),
    ("WARN: Function: create_nccl_ofi_component Line: 459: NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",
     K("nccl_error"), GH + "aws/aws-ofi-nccl/issues/22 (nccl_message_transfer, 2019)"),
    # --- "invalid usage" as XLA's ROCm build and Horovod report it -------------------------------------------
    ("RCCL operation ncclGetUniqueId(&id) failed: invalid usage", K("nccl_error"),
     "find_string id 68854717750 (a MaxText-on-ROCm runbook quoting the training log)"),
    ("# ncclGroupEnd failed: invalid usage", K("nccl_error"),
     "find_string id 4784636364 (horovod test/parallel/test_tensorflow.py, the error the test once hit)"),
    # --- Slurm: fewer GPUs than configured (a GPU gone, or a MIG layout changed) -------------------------------
    ("Reason=gres/gpu count reported lower than configured (0 < 8)", K("health_check"),
     GH + "awslabs/awsome-distributed-ai/issues/195"),
    ("   Reason=gres/gpu count reported lower than configured (0 < 1) [slurm@2024-12-19T11:03:34]", K("health_check"),
     GH + "awslabs/awsome-distributed-ai/issues/195 (scontrol show node)"),
    ("May 23 12:49:52 mgmt1.int.p2-ecole.calculquebec.cloud slurmctld[80708]: slurmctld: error: Setting node nodegpu1 state to INVAL with reason:gres/gpu count reported lower than configured (3 < 4)",
     K("health_check"), GH + "ComputeCanada/puppet-magic_castle/issues/361 (MIG divisions changed)"),
    # --- LBNL NHC (Slurm's HealthCheckProgram) failing a GPU check ------------------------------------------------
    ("Found XID errors: 63", X(63, None), GH + "mej/nhc/issues/147 (/var/log/nhc.log)"),
    ("Node Health Check failed.  Check check_xid_errors returned 1", K("health_check"), GH + "mej/nhc/issues/147"),
    ("ERROR:  nhc:  Health check failed:  Check check_xid_errors returned 1", K("health_check"),
     GH + "mej/nhc/issues/147"),
    ("    ERROR:  nhc:  Health check failed:  Check check_nv_gpu_count 2 returned 1", K("health_check"),
     GH + "NVIDIA/deepops/pull/660 (the test plan's nhc -v)"),
    # --- DeepSpeed's launcher, Megatron, Ray, SGLang -----------------------------------------------------------
    ("[2023-07-18 09:02:14,830] [ERROR] [launch.py:321:sigkill_handler] ['/opt/ChatGLM-Finetuning/venv/bin/python', '-u', 'finetuning_pt.py', '--local_rank=1', '--model_dir', '/opt/ChatGLM-Finetuning/ChatGLM-6B/', '--output_dir', '/opt/'] exits with return code = -9",
     K("job_failure"), GH + "liucongg/ChatGLM-Finetuning/issues/67"),
    ("[rank2]:[E ProcessGroupNCCL.cpp:754] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=305, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600381 milliseconds before timing out.",
     K("nccl_timeout"), GH + "NVIDIA/Megatron-LM/issues/735"),
    ("[E ProcessGroupNCCL.cpp:828] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=33, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 607565 milliseconds before timing out.",
     K("nccl_timeout"), GH + "NVIDIA/Megatron-LM/issues/1140"),
    ("(WorkerDict pid=859188) RuntimeError: CUDA error: an illegal memory access was encountered", K("cuda_error"),
     GH + "verl-project/verl/issues/1611 (a Ray actor's prefix)"),
    ("  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
     K("cuda_error"), GH + "sgl-project/sglang/issues/8296"),
    # --- MIG: an Xid from the DRA driver's MIG discussion; MIG management output is no fault ---------------------
    ("[1231741.378609] NVRM: Xid (PCI:0009:01:00): 43, pid=3188489, name=trigger_xid, channel 0x0b00000a",
     X(43, "0009:01:00"), GH + "kubernetes-sigs/dra-driver-nvidia-gpu/issues/904"),
    ("Failed to display compute instances: Insufficient Permissions", NONE,
     GH + "Project-HAMi/HAMi/issues/1044 (nvidia-smi mig -lci)"),
    ('time="2025-03-05T09:12:47Z" level=debug msg="    Current MIG mode: Disabled"', NONE,
     GH + "NVIDIA/gpu-operator/issues/1310 (mig-parted)"),
    ("MIG configuration applied successfully", NONE, GH + "NVIDIA/gpu-operator/issues/1310"),
    # --- negatives and traps ------------------------------------------------------------------------------------
    ("192.169.83.120: [2023-10-13 11:31:28,593] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 249", NONE,
     GH + "deepspeedai/DeepSpeed/issues/4510 (the launcher cleaning up, not the failure)"),
    ("May 23 12:49:52 mgmt1.int.p2-ecole.calculquebec.cloud slurmctld[80708]: slurmctld: _node_config_validate: gres/gpu: Count changed on node nodegpu1 (4 != 3)",
     NONE, GH + "ComputeCanada/puppet-magic_castle/issues/361"),
    ("May 23 12:49:52 mgmt1.int.p2-ecole.calculquebec.cloud slurmctld[80708]: slurmctld: drain_nodes: node nodegpu1 state set to DRAIN",
     NONE, GH + "ComputeCanada/puppet-magic_castle/issues/361 (a drain names no GPU by itself)"),
    ("Feb 22 17:46:38 ip-10-1-74-228 slurmd[13562]: spank-epilog: error: pyxis: mkdir: cannot create directory '/opt/dlami/nvme/tmp/enroot/data': Permission denied",
     NONE, GH + "awslabs/awsome-distributed-ai/issues/185 (an epilog failure that drains the node, not a GPU)"),
    ("2025-06-11T19:12:23.050922+00:00 cpu001 nhc[1013622]: Health check failed:  Script timed out.", NONE,
     GH + "mej/nhc/issues/161 (NHC failing for no GPU reason)"),
    ("2025-06-11T19:12:24.052725+00:00 cpu001 nhc[1013628]: Health check failed:  Terminated by signal SIGTERM.",
     NONE, GH + "mej/nhc/issues/161"),
    ("[2025-06-11T19:12:28.063] error: health_check killed by signal 9 output:", NONE,
     GH + "mej/nhc/issues/161 (slurmd.log)"),
    ("ERROR:  nhc:  Health check failed:  Watchdog timer unable to terminate hung NHC process 16263.", NONE,
     GH + "mej/nhc/issues/134"),
    ("Kill task failed root 2024-01-25T15:12:23 ip-10-0-1-23", NONE,
     GH + "awslabs/awsome-distributed-ai/issues/185 (sinfo -R)"),
    ("[1,mpirank:0,algo-1]<stdout>:algo-1:79:1300 [0] NCCL INFO Launch mode Parallel", NONE,
     "find_string id 544493407 (SageMaker mpirun output: NCCL INFO behind an MPI rank prefix)"),
    ("[1,13]<stderr>:libfabric:35:1668017255::efa:cq:rxr_cq_write_tx_error():243<warn> rxr_cq_write_tx_error: err: 20, prov_err: Not a directory (20)`",
     NONE, GH + "aws/aws-ofi-nccl/issues/156 (libfabric's own line; the NCCL WARN above it is the signal)"),
    ("[1,26]<stdout>:ip-172-32-36-209:8716:9558 [2] NCCL INFO Ring 00 : 26[2] -> 30[6] via P2P/IPC", NONE,
     GH + "aws/aws-ofi-nccl/issues/24"),
    ("[1,31]<stdout>:ip-172-32-36-209:8800:9549 [7] NCCL INFO include/net.h:24 -> 2", NONE,
     GH + "aws/aws-ofi-nccl/issues/24"),
    ("INFO: Function: ofi_init Line: 686: NET/OFI Selected Provider is efa", NONE, GH + "aws/aws-ofi-nccl/issues/22"),
    ("kp-ddp-worker-0:3468:3905 [4] NCCL INFO transport/net.cc:1302 -> 6", NONE,
     GH + "NVIDIA/nccl/issues/1405 (the return-code trace after a WARN)"),
    ("algo-1:17778:17848 [5] NCCL INFO NCCL_IB_DISABLE set by environment to 1.", NONE,
     GH + "aws/aws-ofi-nccl/issues/715"),
    ("  | 2024-11-28T07:42:11.527Z | libfabric:17778:1732779731::efa:cq:efa_cq_ibv_cq_ex_open_with_ibv_create_cq_ex():92<warn> Unable to create extended CQ: Cannot allocate memory",
     NONE, GH + "aws/aws-ofi-nccl/issues/715 (host memory for a completion queue, not GPU memory)"),
    ("axon:5022:5089 [3] NCCL INFO channel.cc:40 Cuda Alloc Size 1536 pointer 0x7f998c000000", NONE,
     GH + "axolotl-ai-cloud/axolotl/issues/889"),
    ("hostname-test:984:1257 [4] NCCL INFO comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 nvmlDev 4 busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE",
     NONE, GH + "NVIDIA/nccl/issues/1814"),
    ("9aee1c01f3e7:6727:7168 [1] NCCL INFO [Service thread] Connection closed by localRank 2", NONE,
     GH + "NVIDIA/Megatron-LM/issues/735"),
    ("[iteration] datetime: 2024-09-13 07:04:42 ", NONE, GH + "NVIDIA/Megatron-LM/issues/1140"),
    ("2025-07-25T07:53:08.21748708+08:00 stdout F [2025-07-25 07:53:08 TP2] Scheduler hit an exception: Traceback (most recent call last):",
     NONE, GH + "sgl-project/sglang/issues/8336 (the header; the fault is named lines later)"),
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.", NONE,
     GH + "marmotlab/PRIMAL2/issues/6 (title)"),
    ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.",
     NONE, GH + "hkust-nlp/simpleRL-reason/issues/98 (host OOM killer, not GPU memory)"),
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
    _check(expect, [f.row() for f in classify_text(line + "\n")], f"classify ({source})")
    if not expect.none:
        assert has_anchor(line), source


# dcgmi diag's deployment section, the Error cell wrapped onto a continuation row (verbatim, the book's excerpt).
DIAG_ERROR_TABLE = """\
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Error                     | GPU 3 has uncorrectable memory errors and row  |
|                           |  remappings are pending                        |"""
DIAG_ERROR_SOURCE = GH + "stas00/ml-engineering (compute/accelerator/nvidia/debug.md, repeated Xid 64)"


def test_a_dcgmi_diag_error_row_takes_its_continuation_row() -> None:
    found = list(LineScanner().scan_text(DIAG_ERROR_TABLE))
    assert [(n, s.kind, s.gpu_index) for n, s in found] == [(5, "ecc", 3)], DIAG_ERROR_SOURCE
    sig = found[0][1]
    assert sig.playbook == "row-remap-pending" and str(sig.detail["message"]).endswith("row remappings are pending")
    assert [(f.line, f.signal.kind) for f in classify_text(DIAG_ERROR_TABLE + "\n")] == [(5, "ecc")]


def _sig(fragment: str) -> Any:
    sig = classify_line(next(line for line, _, _ in CASES if fragment in line))
    assert sig is not None, fragment
    return sig


def test_details_that_the_handlers_use() -> None:
    old = _sig("include/socket.h:185 WARN")
    assert old.detail["nccl_tag"] is False and old.detail["cuda_dev"] == 0
    assert _sig("NET/IBP:Got completion").code == "IBV_WC_RETRY_EXC_ERR"
    rccl = _sig("RCCL operation")
    assert rccl.code == "ncclInvalidUsage" and rccl.detail["operation"] == "ncclGetUniqueId"
    assert _sig("ncclGroupEnd failed").code == "ncclInvalidUsage"
    slurm = _sig("(0 < 8)")
    assert slurm.code == "slurm_gres_gpu_count_low" and slurm.playbook is None
    assert (slurm.detail["gpus_found"], slurm.detail["gpus_configured"]) == (0, 8)
    assert _sig("state to INVAL").detail["slurm_node"] == "nodegpu1"
    assert explain(next(x for x, _, _ in CASES if "(0 < 8)" in x), slurm)["rule"] == "builtin:sched"
    assert _sig("[1,13]<stdout>").detail["rank"] == 13 and _sig("[1,13]<stdout>").detail["ofi_request_failed"] is True
    assert _sig("[1,23]<stdout>").detail["rank"] == 23
    nhc = _sig("check_nv_gpu_count 2")
    assert nhc.code == "nhc_gpu_check_failed" and nhc.detail["check"] == "check_nv_gpu_count"
    assert nhc.detail["arguments"] == "2" and nhc.playbook is None
    ds = _sig("exits with return code = -9")
    assert ds.code == "SIGKILL" and ds.detail["local_rank"] == 1 and ds.detail["reporter"] == "deepspeed.launcher"


def test_negatives_with_positives_around_them_stay_silent() -> None:
    text = "\n".join(line for line, _, _ in CASES)
    found = {n for n, _ in LineScanner().scan_text(text)}
    for n, (_line, expect, source) in enumerate(CASES, 1):
        assert (n in found) != expect.none, (n, source)


def test_the_table_covers_the_families_left_after_the_third_pass() -> None:
    sources = " ".join(s for _, _, s in CASES)
    for project in ("NVIDIA/nccl", "aws-ofi-nccl", "horovod", "DeepSpeed", "Megatron-LM", "verl", "sglang", "MIG"):
        assert project.lower() in sources.lower(), project
    assert any("slurmctld" in line for line, _, _ in CASES) and any("Reason=gres/gpu" in line for line, _, _ in CASES)
    assert sum(1 for _, e, _ in CASES if e.none) >= 15
    lines = [line for line, _, _ in CASES]
    assert len(set(lines)) == len(lines)
