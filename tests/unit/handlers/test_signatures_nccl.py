"""NCCL / torch.distributed signatures (gpu-faults.md §4): watchdog, heartbeat, desync, NCCL WARN, elastic."""

from __future__ import annotations

import pytest

from handlers.signatures import classify_line

WATCHDOG = [
    # (line, rank, seq, op, timeout_ms, ran_for_ms)
    ("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
     "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
     "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.", 0, 1580, "ALLREDUCE", 600000, 600060),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=600000) ran for 600013 milliseconds before timing out.", None, 5, "ALLREDUCE", 600000, 600013),
    ("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64088, "
     "OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for 1800485 milliseconds before timing out.", 1, 64088,
     "_ALLGATHER_BASE", 1800000, 1800485),
    ("[rank7]:[E1024 10:02:13.263405939 ProcessGroupNCCL.cpp:616] [Rank 7] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=317, OpType=_REDUCE_SCATTER_BASE, NumelIn=1048576, NumelOut=131072, "
     "Timeout(ms)=1800000) ran for 1800095 milliseconds before timing out.", 7, 317, "_REDUCE_SCATTER_BASE",
     1800000, 1800095),
    ("2024-01-01T00:00:00.000000000Z stderr F [rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=60000) "
     "ran for 60520 milliseconds before timing out.", 3, 12, "BROADCAST", 60000, 60520),
]


@pytest.mark.parametrize(("line", "rank", "seq", "op", "timeout", "ran"), WATCHDOG)
def test_watchdog_collective_timeout(line: str, rank: int | None, seq: int, op: str, timeout: int, ran: int) -> None:
    sig = classify_line(line)
    assert sig is not None
    assert (sig.kind, sig.code, sig.xid, sig.action) == ("nccl_timeout", "watchdog_timeout", None, None)
    d = sig.detail
    assert (d.get("rank"), d["seq"], d["op_type"], d["timeout_ms"], d["ran_for_ms"]) == (rank, seq, op, timeout, ran)


@pytest.mark.parametrize(
    ("line", "code", "fields"),
    [
        ("[rank2]:[E1024 10:02:13.26 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 2] Exception (either an error or timeout) "
         "detected by watchdog at work: 1580, last enqueued NCCL work: 1580, last completed NCCL work: 1579.",
         "watchdog_exception", {"rank": 2, "pg": 0, "seq": 1580, "last_enqueued": 1580, "last_completed": 1579}),
        ("[PG ID 0 PG GUID 0(default_pg) Rank 5]  failure detected by watchdog at work sequence id: 96120 PG status: "
         "last enqueued work: 96120, last completed work: 96119", "watchdog_exception",
         {"rank": 5, "pg": 0, "seq": 96120, "last_enqueued": 96120, "last_completed": 96119}),
        ("[Rank 7] Timeout at NCCL work: 64088, last enqueued NCCL work: 64088, last completed NCCL work: 64087.",
         "watchdog_timeout", {"rank": 7, "seq": 64088, "last_completed": 64087}),
        ("[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be "
         "terminated after dumping debug info. workMetaList_.size()=3", "heartbeat_timeout",
         {"rank": 0, "pending_work": 3}),
        ("Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=0",
         "heartbeat_timeout", {"pending_work": 0}),
        ("[F ProcessGroupNCCL.cpp:1178] [Rank 4] ProcessGroupNCCL's watchdog got stuck for 600 seconds without "
         "making progress in monitoring enqueued collectives.", "watchdog_stuck", {"rank": 4, "stuck_s": 600}),
        ("[rank1]:[E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed out. Due to the "
         "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
         "operations_failed_or_timed_out", {"rank": 1}),
        ("To avoid data inconsistency, we are taking the entire process down.", "process_taken_down", {}),
    ],
)
def test_watchdog_progress_heartbeat_and_teardown(line: str, code: str, fields: dict[str, object]) -> None:
    sig = classify_line(line)
    assert sig is not None and sig.kind == "nccl_timeout" and sig.code == code
    for key, value in fields.items():
        assert sig.detail[key] == value, key


@pytest.mark.parametrize(
    ("line", "ranks", "collectives"),
    [
        ("[Rank 0] To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are: [7] finished "
         "collective #182, but didn't join collective #183", (7,), (182, 183)),
        ("the lagging/dead/mismatched ranks that caused the desync are: [1, 3] joined but didn't finish collective "
         "#315 ALLREDUCE", (1, 3), (315,)),
        ("[rank0]:[E ProcessGroupNCCL.cpp:1201] To our best knowledge, the lagging/dead/mismatched ranks that caused "
         "the desync are: 12", (12,), None),
    ],
)
def test_desync_report_names_the_lagging_ranks(line: str, ranks: tuple[int, ...], collectives: object) -> None:
    sig = classify_line(line)
    assert sig is not None and (sig.kind, sig.code) == ("nccl_timeout", "desync_report")
    assert sig.detail["lagging_ranks"] == ranks
    assert sig.detail.get("collectives") == collectives


@pytest.mark.parametrize(
    ("line", "code", "fields"),
    [
        ("hostname-test:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 172.36.143.59<44206> "
         "with status=12 opcode=129 len=65536 vendor err 129 (Recv) localGid ::ffff:29.87.88.182 "
         "remoteGids::ffff:29.87.4.221", "IBV_WC_RETRY_EXC_ERR",
         {"ib_status": 12, "peer": "172.36.143.59<44206>", "vendor_err": 129, "direction": "recv", "host":
          "hostname-test", "pid": 984, "tid": 1357, "cuda_dev": 4}),
        ("node-3:12:99 [0] NCCL WARN NET/IB : Got completion from peer 10.1.2.3<56789> with error 5, opcode 0, len 0, "
         "vendor err 249", "IBV_WC_WR_FLUSH_ERR", {"ib_status": 5, "peer": "10.1.2.3<56789>", "vendor_err": 249}),
        ("gpu-7:3311:3402 [2] NCCL WARN NET/IB : Got completion from peer 10.0.0.9<4001> with status=13 opcode=0",
         "IBV_WC_RNR_RETRY_EXC_ERR", {"ib_status": 13}),
        ("gpu-7:3311:3402 [2] NCCL WARN Net : Call to recv from 10.0.0.9<41123> failed : Broken pipe", "socket_error",
         {"peer": "10.0.0.9<41123>", "socket_op": "recv"}),
        ("socketProgressOpt: Call to recv from 172.16.0.5<33759> failed : Connection reset by peer", "socket_error",
         {"peer": "172.16.0.5<33759>"}),
        ("gpu-7:3311:3402 [2] NCCL WARN socketProgress: Connection closed by remote peer node-4<36231>",
         "socket_error", {}),
        ("gpu-7:3311:3420 [2] NCCL WARN [Proxy Service 3] Failed to execute operation Connect from rank 3, retcode 6",
         "ncclRemoteError", {"rank": 3, "retcode": 6}),
        ("ip-10-0-1-2:77:88 [1] NCCL WARN NET/OFI Request 0x7f0a2c0e8f00 completed with error. RC: 113. Error: 2 "
         "(UNDELIVERABLE).", "ofi_error", {"ofi_rc": 113, "ofi_error": 2, "ofi_error_name": "UNDELIVERABLE"}),
        ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
         "remote process exited or there was a network error, NCCL version 2.21.5", "ncclRemoteError",
         {"nccl_version": "2.21.5", "nccl_result": 6}),
        ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, unhandled system "
         "error, NCCL version 2.14.3", "ncclSystemError", {"nccl_result": 2}),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run "
         "with NCCL_DEBUG=INFO for details), NCCL version 2.19.3", "ncclUnhandledCudaError", {"nccl_result": 1}),
        ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
         "ncclRemoteError", {"nccl_result": 6}),
        ("ncclInternalError: Internal check failed.", "ncclInternalError", {"nccl_result": 3}),
        ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.", "communicator_aborted", {}),
        ("gpu-2:100:200 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-aBc12 to 9637892 bytes", "nccl_warn", {}),
    ],
)
def test_nccl_errors(line: str, code: str, fields: dict[str, object]) -> None:
    sig = classify_line(line)
    assert sig is not None and sig.kind == "nccl_error" and sig.code == code
    for key, value in fields.items():
        assert sig.detail[key] == value, key


def test_nccl_error_spanning_lines_is_one_remote_error() -> None:
    text = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268,"
            " "
            "remote process exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed "
            "possibly due to a network error or a remote process exiting prematurely.\nLast error:\nsocketProgressOpt: "
            "Call to recv from 172....<33759> failed : Connection reset by peer")
    sig = classify_line(text)
    assert sig is not None and (sig.kind, sig.code) == ("nccl_error", "ncclRemoteError")


@pytest.mark.parametrize(
    "line",
    [
        "gpu-node-3:1234:1290 [3] NCCL INFO Channel 05/0 : 3[3] -> 4[4] via P2P/IPC/read",
        "gpu-node-3:1234:1290 [3] NCCL INFO comm 0x55d5c8a0 rank 3 nranks 16 cudaDev 3 busId 3b000 - Init COMPLETE",
        "gpu-node-3:1234:1290 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.3<0>",
        "gpu-node-3:1234:1290 [3] NCCL INFO transport/net_ib.cc:1234 -> 6",
        "NCCL version 2.21.5+cuda12.4",
        "gpu-node-3:1234:1290 [3] NCCL WARN NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot open shared "
        "object file: No such file or directory : when loading libnccl-net.so",
        "Sending process 4711 closing signal SIGTERM",
        "[2024-05-01 12:00:00] INFO - watchdog heartbeat ok, step 1200",
        "torch.distributed.elastic.agent.server.api: [default] Starting worker group",
    ],
)
def test_chatter_is_no_signal(line: str) -> None:
    assert classify_line(line) is None


@pytest.mark.parametrize(
    ("line", "code", "exitcode", "local_rank"),
    [
        ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 3411) of "
         "binary: /usr/bin/python3", "SIGABRT", -6, 0),
        ("E0301 12:00:00.123 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
         "local_rank: 3 (pid: 77) of binary: /opt/conda/bin/python", "SIGKILL", -9, 3),
        ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 7 (pid: 1) of binary: "
         "python", "exitcode_1", 1, 7),
        ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 2 (pid: 5) of binary: "
         "python", "SIGBUS", -7, 2),
    ],
)
def test_torch_elastic_child_failure(line: str, code: str, exitcode: int, local_rank: int) -> None:
    sig = classify_line(line)
    assert sig is not None and (sig.kind, sig.code) == ("job_failure", code)
    assert sig.detail["exitcode"] == exitcode and sig.detail["local_rank"] == local_rank


def test_child_failed_error_line() -> None:
    sig = classify_line("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    assert sig is not None and (sig.kind, sig.code) == ("job_failure", "ChildFailedError")
    assert classify_line("ERROR:torch.distributed.elastic:failed (exitcode: 0) local_rank: 0 (pid: 1)") is None


def test_cuda_error_in_the_watchdog_is_a_cuda_error() -> None:
    sig = classify_line("[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL watchdog thread terminated with "
                        "exception: CUDA error: uncorrectable ECC error encountered")
    assert sig is not None and (sig.kind, sig.code) == ("cuda_error", "cudaErrorECCUncorrectable")
    assert sig.detail["via"] == "nccl_watchdog"
    timeout = classify_line("NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective "
                            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
                            "600100 milliseconds before timing out.")
    assert timeout is not None and timeout.kind == "nccl_timeout" and timeout.detail["seq"] == 9
