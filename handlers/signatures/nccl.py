"""NCCL and torch.distributed signatures: watchdog timeouts, heartbeat monitor, desync, NCCL WARN, elastic.

Where it sits: called by ``handlers.signatures.classify_line`` for container-log lines of training jobs; the
NCCL handler correlates the resulting events across the ranks of one job (DESIGN.md §6), so every field it
needs to do that is pulled out here: rank, process group, sequence number, op type, timeout, last
enqueued/completed work, lagging ranks, peer address, IB completion status. Formats: gpu-faults.md §4.

Kinds: ``nccl_timeout`` for the PyTorch ProcessGroupNCCL watchdog (collective timeouts, progress markers,
teardown, heartbeat monitor, watchdog stuck) and desync reports; ``nccl_error`` for NCCL WARN lines (NET/IB
completion errors, socket and remote errors, system errors, OFI) and NCCL errors raised into Python;
``job_failure`` for torch elastic child failures. ``NCCL INFO`` chatter is never a signal.
"""

from __future__ import annotations

import re

from handlers.signatures.model import Signal, freeze, to_int

# ibv_wc_status (rdma-core verbs.h).
IBV_WC_STATUS: dict[int, str] = {
    0: "SUCCESS", 1: "LOC_LEN_ERR", 2: "LOC_QP_OP_ERR", 3: "LOC_EEC_OP_ERR", 4: "LOC_PROT_ERR",
    5: "WR_FLUSH_ERR", 6: "MW_BIND_ERR", 7: "BAD_RESP_ERR", 8: "LOC_ACCESS_ERR", 9: "REM_INV_REQ_ERR",
    10: "REM_ACCESS_ERR", 11: "REM_OP_ERR", 12: "RETRY_EXC_ERR", 13: "RNR_RETRY_EXC_ERR",
    14: "LOC_RDD_VIOL_ERR", 15: "REM_INV_RD_REQ_ERR", 16: "REM_ABORT_ERR", 17: "INV_EECN_ERR",
    18: "INV_EEC_STATE_ERR", 19: "FATAL_ERR", 20: "RESP_TIMEOUT_ERR", 21: "GENERAL_ERR",
}
# ncclResult_t, by name and by the text PyTorch/NCCL print for it.
NCCL_RESULTS: dict[str, int] = {
    "ncclUnhandledCudaError": 1, "ncclSystemError": 2, "ncclInternalError": 3, "ncclInvalidArgument": 4,
    "ncclInvalidUsage": 5, "ncclRemoteError": 6, "ncclInProgress": 7,
}
_RESULT_TEXT: tuple[tuple[str, str], ...] = (
    ("remote process exited or there was a network error", "ncclRemoteError"),
    ("unhandled system error", "ncclSystemError"),
    ("unhandled cuda error", "ncclUnhandledCudaError"),
    ("internal error", "ncclInternalError"),
    ("invalid argument", "ncclInvalidArgument"),
    ("invalid usage", "ncclInvalidUsage"),
)
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}

_RANK_RE = re.compile(
    r"\[\s*(?:PG\s+(?:ID\s+)?(?P<pg>\d+)\s+(?:PG\s+GUID\s+(?P<guid>[^\]]*?)\s+)?)?Rank\s+(?P<rank>\d+)\s*\]",
    re.IGNORECASE,
)
_RANK_PREFIX_RE = re.compile(r"\[rank(?P<rank>\d+)\]", re.IGNORECASE)
# Open MPI's --tag-output prefix "[1,0]<stderr>:" (job, rank); SageMaker's "[1,mpirank:0,algo-1]<stdout>:"; a
# Markdown tick or quote before it where the line was pasted.
_MPI_RANK_RE = re.compile(r"^[\s`>]*\[\d+,(?:mpirank:)?(?P<rank>\d+)(?:,[^\]]*)?\]<std(?:out|err)>", re.IGNORECASE)
_WORK_RE = re.compile(r"WorkNCCL\s*\((?P<body>[^()]*(?:\([^()]*\)[^()]*)*)\)", re.IGNORECASE)
_KV_RE = re.compile(r"(\w+(?:\(ms\))?)\s*=\s*([^,\s)]+(?:\[[^\]]*\])?)")
_RAN_FOR_RE = re.compile(r"ran\s+for\s+(\d+)\s+milliseconds", re.IGNORECASE)
_PROGRESS_RE = re.compile(
    r"(?:detected\s+by\s+watchdog\s+at\s+work(?:\s+sequence\s+id)?|timeout\s+at\s+nccl\s+work)\s*:\s*(?P<seq>\d+)"
    r".*?last\s+enqueued(?:\s+nccl)?\s+work\s*:\s*(?P<enq>-?\d+).*?last\s+completed(?:\s+nccl)?\s+work\s*:\s*"
    r"(?P<done>-?\d+)",
    re.IGNORECASE | re.DOTALL,
)
_STUCK_RE = re.compile(r"watchdog\s+got\s+stuck\s+for\s+(\d+)\s+seconds", re.IGNORECASE)
# The other ranks' side of a collective timeout (PyTorch 2.3+): "Received a dump signal due to a collective timeout
# from this local rank / from  rank 6 ...", "Received a timeout signal from this local rank ...", "Received a global
# timeout from another rank ...", the [F] exit line "... watchdog detected a collective timeout and notified current
# rank", and the heartbeat monitor's exit "Terminating the process ..., due to ProcessGroupNCCL watchdog hang".
_TIMEOUT_NOTICE_RE = re.compile(
    r"(?P<notice>dump\s+signal\s+due\s+to\s+a\s+collective\s+timeout|received\s+a\s+(?:global\s+)?timeout(?:\s+signal)?"
    r"\s+from|detected\s+a\s+collective\s+timeout)(?:\s+from)?\s*(?:(?P<local>this\s+local\s+rank)|rank\s+(?P<src>\d+))?"
    r"|(?P<hang>watchdog\s+hang)",
    re.IGNORECASE,
)
_LAST_WORK_RE = re.compile(r"last\s+enqueued(?:\s+nccl)?\s+work\s*:\s*(?P<enq>-?\d+).*?last\s+completed(?:\s+nccl)?"
                           r"\s+work\s*:\s*(?P<done>-?\d+)", re.IGNORECASE | re.DOTALL)
_WORKMETA_RE = re.compile(r"workMetaList_\.size\(\)\s*=\s*(\d+)", re.IGNORECASE)
_DESYNC_RANKS_RE = re.compile(r"ranks\s+that\s+caused\s+the\s+desync\s+are\s*:?\s*\[?(?P<ranks>[\d,\s]*)\]?"
                              r"(?P<rest>.*)", re.IGNORECASE | re.DOTALL)
_COLLECTIVE_RE = re.compile(r"collective\s+#(\d+)", re.IGNORECASE)
_NCCL_PREFIX_RE = re.compile(
    r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+(?:(?P<src>[\w./]+:\d+)\s+)?NCCL\s+WARN",
    re.IGNORECASE,
)
_DEV_PREFIX_RE = re.compile(r"(?:^|[\s`])\[(?P<dev>\d+)\]\s+(?P<src>[\w./]+:\d+)\s+NCCL\s+WARN", re.IGNORECASE)
_IB_RE = re.compile(
    r"got\s+completion\s+from\s+peer\s+(?P<peer>[^\s,]+)\s+with\s+(?:status\s*=\s*|error\s+)(?P<status>\d+)"
    r"(?:[,\s]+opcode\s*=?\s*(?P<opcode>\d+))?(?:[,\s]+len\s*=?\s*(?P<len>\d+))?"
    r"(?:[,\s]+vendor\s+err\s*=?\s*(?P<vendor>\d+))?(?:\s*\((?P<dir>send|recv)\))?",
    re.IGNORECASE,
)
_GID_RE = re.compile(r"localgid\s*(?P<local>\S+)\s+remotegids?\s*(?P<remote>\S+)", re.IGNORECASE)
_SOCKET_RE = re.compile(r"(?:call\s+to\s+(?P<op>recv|send|connect|accept|poll)\s+(?:from|to)?|(?P<op2>connect)\s+to)"
                        r"\s*(?P<peer>\S+?)\s+failed\s*:\s*(?P<why>[^\n]+)", re.IGNORECASE)
_NCCL_SOCKET_FN_RE = re.compile(r"\bsocket(?:progressopt|progress|startconnect|pollconnect|finalizeconnect|tryaccept"
                                r"|finalizeaccept|wait)\s*:", re.IGNORECASE)
_SOCKET_CLOSED_RE = re.compile(r"connection\s+(?:closed|reset)\s+by\s+(?:remote\s+)?peer", re.IGNORECASE)
_PROXY_RE = re.compile(r"\[proxy\s+service\s+(?P<svc>\d+)\]\s*failed\s+to\s+execute\s+operation\s+(?P<op>\w+)"
                       r"\s+from\s+rank\s+(?P<rank>\d+),\s*retcode\s+(?P<rc>\d+)", re.IGNORECASE)
_OFI_RE = re.compile(r"net/ofi.*?\brc\s*:\s*(?P<rc>-?\d+).*?error\s*:\s*(?:(?P<err>-?\d+)\s*(?:\((?P<name>\w+)\))?"
                     r"|(?P<text>[^.,\n]+))", re.IGNORECASE)
# aws-ofi-nccl: "NET/OFI Request 0x7f.. completed with error. RC: 21. Error: unknown error. Completed length: 0"
_OFI_REQ_RE = re.compile(r"net/ofi\s+request\s+(?:0x[0-9a-f]+\s+)?completed\s+with\s+error", re.IGNORECASE)
# XLA/JAX: "NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error (run with
# NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'Cuda failure 2 'out of memory''."
_XLA_OP_RE = re.compile(r"[nr]ccl\s+operation\s+(?P<op>nccl\w+)\s*\((?P<args>[^)]*)\)\s+failed\s*:\s*(?P<why>[^.;(\n]+)"
                        r"(?:.*?last\s+nccl\s+warning\(error\)\s+log\s+entry[^']*'(?P<last>.*?)'\.?(?:;|$))?",
                        re.IGNORECASE | re.DOTALL)
# A framework naming the NCCL call that failed with NCCL's own result text (Horovod: "ncclGroupEnd failed: invalid
# usage"); only the result texts of ``_RESULT_TEXT`` count, so a call that "failed" for another reason is not one.
_NCCL_CALL_FAILED_RE = re.compile(r"\b(?P<op>nccl[A-Z]\w*)(?:\([^)]*\))?\s+failed\s*:\s*(?P<why>[^.;(\n]+)")
# NCCL releases before the "NCCL" tag in their prefix: "host:pid:tid [dev] file.cc:NN WARN <message>".
# The host:pid:tid part is optional: NCCL 2.0 users' pastes keep only "<host> [dev] file:line WARN" (nccl#111).
_OLD_WARN_RE = re.compile(r"(?:(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+)\s+)?(?:^|(?<=\s))\[(?P<dev>\d+)\]\s+"
                          r"(?P<src>[\w./]+\.(?:cc|cu|h|c):\d+)\s+WARN\s+(?P<msg>.+)")
_NCCL_ERR_IN_RE = re.compile(r"nccl\s+error\s+in\s*:\s*(?P<where>[^,]+),\s*(?P<what>[^\n]*?)(?:,\s*nccl\s+version\s+"
                             r"(?P<ver>[\d.]+\S*))?\s*$", re.IGNORECASE | re.MULTILINE)
# nccl-tests: "Test NCCL failure common.cu:497 'unhandled cuda error'" (the ncclResult_t text of the failing call).
_NCCL_TEST_RE = re.compile(r"test\s+nccl\s+failure\s+(?P<where>\S+)\s+'(?P<what>[^']*)'", re.IGNORECASE)
_NCCL_RESULT_RE = re.compile(r"\b(nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage"
                             r"|RemoteError))\b", re.IGNORECASE)
_RAISE_CHILD_RE = re.compile(r"\braise\s+childfailederror\s*\(", re.IGNORECASE)
_ELASTIC_FAILED_RE = re.compile(
    r"failed\s*\(\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\)\s*local_rank\s*:\s*(?P<lr>\d+)"
    r"(?:\s*\(\s*pid\s*:\s*(?P<pid>\d+)\s*\))?(?:\s*of\s+binary\s*:\s*(?P<bin>\S+))?",
    re.IGNORECASE,
)


def is_old_nccl_warn(text: str) -> bool:
    """True for a WARN line of an NCCL release that printed no ``NCCL`` tag ([host:pid:tid] [dev] file:line WARN)."""
    return " WARN " in text and _OLD_WARN_RE.search(text) is not None


def classify_nccl(text: str) -> Signal | None:
    """The NCCL / torch.distributed signal in one unwrapped line, or None."""
    low = text.lower()
    if "nccl warn" not in low and is_old_nccl_warn(text):
        o = _OLD_WARN_RE.search(text)
        assert o is not None
        tagged = text[:o.end("src")] + " NCCL WARN " + o.group("msg")
        sig = _nccl_error(tagged, tagged.lower())
        if sig is not None:
            return Signal(kind=sig.kind, code=sig.code, detail=freeze({**sig.detail, "nccl_tag": False}))
        return None
    if "exitcode" in low or "childfailederror" in low or "exits with return code" in low:
        sig = _elastic(text, low)
        if sig is not None:
            return sig
    if "watchdog" in low or "heartbeat" in low or "desync" in low or "worknccl" in low or "timeout" in low \
            or "nccl work" in low or "nccl operations" in low or "entire process down" in low:
        sig = _watchdog(text, low)
        if sig is not None:
            return sig
    if "nccl" in low or "proxy service" in low:
        return _nccl_error(text, low)
    if "got completion from peer" in low:  # an IB completion error quoted without NCCL's prefix ("NET/IBP:Got ...")
        return _nccl_error(text, low)
    if "socket" in low and _NCCL_SOCKET_FN_RE.search(text):  # NCCL's "Last error:" line, e.g. "socketStartConnect: ..."
        return _nccl_error(text, low)
    return None


def _ranks(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    m = _RANK_RE.search(text)
    if m is not None:
        out["rank"] = int(m.group("rank"))
        out["pg"] = to_int(m.group("pg"))
        if m.group("guid"):
            out["pg_guid"] = m.group("guid").strip()
    else:
        p = _RANK_PREFIX_RE.search(text)
        if p is not None:
            out["rank"] = int(p.group("rank"))
    return out


def _timeout(code: str, detail: dict[str, object], playbook: str | None = None) -> Signal:
    return Signal(kind="nccl_timeout", code=code, playbook=playbook, detail=freeze(detail))


def _watchdog(text: str, low: str) -> Signal | None:
    detail = _ranks(text)
    if "watchdog caught collective operation timeout" in low or ("worknccl" in low and "timing out" in low):
        w = _WORK_RE.search(text)
        if w is not None:
            kv = {k.lower(): v for k, v in _KV_RE.findall(w.group("body"))}
            detail["seq"] = to_int(kv.get("seqnum"))
            detail["op_type"] = kv.get("optype")
            detail["numel_in"] = to_int(kv.get("numelin"))
            detail["numel_out"] = to_int(kv.get("numelout"))
            detail["timeout_ms"] = to_int(kv.get("timeout(ms)"))
        r = _RAN_FOR_RE.search(text)
        if r is not None:
            detail["ran_for_ms"] = int(r.group(1))
        return _timeout("watchdog_timeout", detail)
    p = _PROGRESS_RE.search(text)
    if p is not None:
        detail.update(seq=int(p.group("seq")), last_enqueued=int(p.group("enq")),
                      last_completed=int(p.group("done")))
        return _timeout("watchdog_timeout" if "timeout at" in low else "watchdog_exception", detail)
    if "heartbeat monitor timed out" in low:
        m = _WORKMETA_RE.search(text)
        detail["pending_work"] = to_int(m.group(1)) if m else None
        return _timeout("heartbeat_timeout", detail)
    s = _STUCK_RE.search(text)
    if s is not None:
        detail["stuck_s"] = int(s.group(1))
        return _timeout("watchdog_stuck", detail)
    n = _TIMEOUT_NOTICE_RE.search(text)
    if n is not None:
        if n.group("hang"):
            return _timeout("watchdog_stuck", detail)
        w = _LAST_WORK_RE.search(text, n.end())
        if w is not None:
            detail.update(last_enqueued=int(w.group("enq")), last_completed=int(w.group("done")))
        detail["timeout_rank"] = detail.get("rank") if n.group("local") else to_int(n.group("src"))
        return _timeout("collective_timeout_notice", detail)
    if "desync" in low:
        d = _DESYNC_RANKS_RE.search(text)
        if d is not None:
            detail["lagging_ranks"] = tuple(int(x) for x in re.findall(r"\d+", d.group("ranks")))
            cols = [int(c) for c in _COLLECTIVE_RE.findall(d.group("rest"))]
            if cols:
                detail["collectives"] = tuple(cols)
            why = d.group("rest").strip()
            if why:
                detail["desync"] = why[:256]
            return _timeout("desync_report", detail)
        if "desync report" in low or ("desync debug" in low and "report" in low):
            return _timeout("desync_report", detail)
        return None
    if "some nccl operations have failed or timed out" in low:
        return _timeout("operations_failed_or_timed_out", detail)
    if "taking the entire process down" in low:
        return _timeout("process_taken_down", detail)
    if "watchdog thread terminated with exception" in low:
        return Signal(kind="nccl_error", code="watchdog_exception", detail=freeze(detail))
    return None


def _nccl_error(text: str, low: str) -> Signal | None:
    detail: dict[str, object] = {}
    warn = "nccl warn" in low
    if not warn and "nccl info" in low:
        return None  # INFO chatter, including the "-> <rc>" return-code trace lines
    if "ccl operation" in low:  # XLA's "NCCL operation ...", and "RCCL operation ..." in its ROCm build
        x = _XLA_OP_RE.search(text)
        if x is not None:
            why = x.group("why").strip()
            result = next((name for frag, name in _RESULT_TEXT if frag in why.lower()), "nccl_error")
            return Signal(kind="nccl_error", code=result, detail=freeze({
                "reporter": "xla", "operation": x.group("op"), "reason": why[:256],
                "last_nccl_warning": (x.group("last") or "")[:256] or None, "nccl_result": NCCL_RESULTS.get(result)}))
    if " failed" in low and not warn:
        c = _NCCL_CALL_FAILED_RE.search(text)
        called = None if c is None else next((n for frag, n in _RESULT_TEXT if frag in c.group("why").lower()), None)
        if c is not None and called is not None:
            return Signal(kind="nccl_error", code=called, detail=freeze({
                "operation": c.group("op"), "reason": c.group("why").strip()[:256],
                "nccl_result": NCCL_RESULTS.get(called)}))
    if "segfault at" in low and "libnccl" in low:  # kernel: "pt_main_thread[..]: segfault at .. in libnccl.so.2[..]"
        return Signal(kind="nccl_error", code="segfault", detail=freeze({"message": text.strip()[:256]}))
    if warn:
        if "net/plugin" in low and ("no plugin" in low or "could not find" in low or "load returned" in low
                                    or "failed to find" in low or "cannot open shared object" in low):
            return None  # plugin discovery at start-up, not a fault
        if "failed to open libibverbs" in low:
            return None  # no verbs library: NCCL uses sockets (later releases print this as INFO)
        p = _NCCL_PREFIX_RE.search(text)
        if p is not None:
            detail.update(host=p.group("host"), pid=int(p.group("pid")), tid=int(p.group("tid")),
                          cuda_dev=int(p.group("dev")), src=p.group("src"))
        else:  # NCCL_DEBUG output with only the device prefix: "[3] enqueue.cc:215 NCCL WARN ..."
            d = _DEV_PREFIX_RE.search(text)
            if d is not None:
                detail.update(cuda_dev=int(d.group("dev")), src=d.group("src"))
    ib = _IB_RE.search(text)
    if ib is not None:
        status = int(ib.group("status"))
        detail.update(peer=ib.group("peer"), ib_status=status, ib_status_name=IBV_WC_STATUS.get(status),
                      opcode=to_int(ib.group("opcode")), length=to_int(ib.group("len")),
                      vendor_err=to_int(ib.group("vendor")),
                      direction=ib.group("dir").lower() if ib.group("dir") else None)
        g = _GID_RE.search(text)
        if g is not None:
            detail.update(local_gid=g.group("local"), remote_gid=g.group("remote"))
        name = IBV_WC_STATUS.get(status, str(status))
        return Signal(kind="nccl_error", code=f"IBV_WC_{name}", detail=freeze(detail))
    o = _OFI_RE.search(text)
    if o is not None:
        detail.update(ofi_rc=int(o.group("rc")), ofi_error=to_int(o.group("err")),
                      ofi_error_name=o.group("name") or (o.group("text") or "").strip() or None,
                      ofi_request_failed=True if _OFI_REQ_RE.search(text) else None)
        p = _RANK_PREFIX_RE.search(text) or _MPI_RANK_RE.search(text)
        if p is not None:
            detail["rank"] = int(p.group("rank"))
        return Signal(kind="nccl_error", code="ofi_error", detail=freeze(detail))
    px = _PROXY_RE.search(text)
    if px is not None:
        rc = int(px.group("rc"))
        detail.update(proxy_service=int(px.group("svc")), operation=px.group("op"), rank=int(px.group("rank")),
                      retcode=rc)
        name = next((k for k, v in NCCL_RESULTS.items() if v == rc), "proxy_error")
        return Signal(kind="nccl_error", code=name, detail=freeze(detail))
    t = _NCCL_TEST_RE.search(text) if "test nccl failure" in low else None
    if t is not None:
        failed = t.group("what").lower()
        result = next((name for frag, name in _RESULT_TEXT if frag in failed), "nccl_error")
        detail.update(where=t.group("where"), reason=t.group("what") or None, reporter="nccl-tests",
                      nccl_result=NCCL_RESULTS.get(result))
        return Signal(kind="nccl_error", code=result, detail=freeze(detail))
    e = _NCCL_ERR_IN_RE.search(text)
    code: str | None = None
    if e is not None:
        what = e.group("what").lower()
        code = next((name for frag, name in _RESULT_TEXT if frag in what), None)
        detail.update(where=e.group("where").strip(), reason=e.group("what").strip()[:256] or None,
                      nccl_version=e.group("ver"))
    r = _NCCL_RESULT_RE.search(text)
    if r is not None and code is None:
        token = r.group(1)
        code = next((k for k in NCCL_RESULTS if k.lower() == token.lower()), token)
    if code is None and e is None:
        s = _SOCKET_RE.search(text)
        if s is not None:
            detail.update(socket_op=(s.group("op") or s.group("op2")).lower(), peer=s.group("peer"),
                          reason=s.group("why").strip()[:128])
            return Signal(kind="nccl_error", code="socket_error", detail=freeze(detail))
        if _SOCKET_CLOSED_RE.search(text) and ("socket" in low or warn):
            return Signal(kind="nccl_error", code="socket_error", detail=freeze(detail))
        if "communicator was aborted" in low or ("nccl communicator" in low and "abort" in low):
            code = "communicator_aborted"
        elif "setting up nccl communicator" in low:  # the ncclUniqueId exchange through the c10d store failed
            code = "communicator_setup_failed"
        elif "distbackenderror" in low or ("nccl error" in low and "nccl info" not in low):
            code = next((name for frag, name in _RESULT_TEXT if frag in low), "nccl_error")
        elif warn:
            code = "nccl_warn"
            detail["message"] = text[low.index("nccl warn") + 9:].strip()[:256] or None
        else:
            return None
    detail["nccl_result"] = NCCL_RESULTS.get(code or "")
    return Signal(kind="nccl_error", code=code or "nccl_error", detail=freeze(detail))


# DeepSpeed's launcher (deepspeed/launcher/launch.py sigkill_handler) when a rank's process died:
# "[ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'main.py', '--local_rank=1', ...] exits with
# return code = -9".
_DS_EXIT_RE = re.compile(r"sigkill_handler\].*?(?:--local_rank=(?P<lr>\d+).*?)?\bexits\s+with\s+return\s+code\s*=\s*"
                         r"(?P<code>-?\d+)", re.IGNORECASE | re.DOTALL)


def _deepspeed_exit(text: str) -> Signal | None:
    m = _DS_EXIT_RE.search(text)
    if m is None or int(m.group("code")) == 0:
        return None
    code = int(m.group("code"))
    sig = _SIGNALS.get(-code) if code < 0 else None
    return Signal(kind="job_failure", code=sig or f"exitcode_{code}", detail=freeze({
        "reporter": "deepspeed.launcher", "exitcode": code, "signal": sig, "local_rank": to_int(m.group("lr"))}))


def _elastic(text: str, low: str) -> Signal | None:
    if "exits with return code" in low:
        return _deepspeed_exit(text)
    m = _ELASTIC_FAILED_RE.search(text)
    detail: dict[str, object] = {}
    exit_code: int | None = None
    if m is not None:
        exit_code = int(m.group("code"))
        detail.update(local_rank=int(m.group("lr")), pid=to_int(m.group("pid")), binary=m.group("bin"))
    elif "childfailederror" in low:
        if _RAISE_CHILD_RE.search(text) and low.count("childfailederror") == 1:
            return None  # the traceback's source line, not the report (that is "...errors.ChildFailedError:")
        return Signal(kind="job_failure", code="ChildFailedError", detail=freeze({"reporter": "torch.elastic"}))
    else:
        return None
    if exit_code == 0:
        return None
    detail["exitcode"] = exit_code
    detail["reporter"] = "torch.elastic"
    sig = _SIGNALS.get(-exit_code) if exit_code < 0 else None
    detail["signal"] = sig
    return Signal(kind="job_failure", code=sig or f"exitcode_{exit_code}", detail=freeze(detail))
