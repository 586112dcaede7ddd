"""Kernel-log and device-plugin signatures: NVRM Xid, NVSwitch SXid, fallen off the bus, GPU identity.

Where it sits: called by ``handlers.signatures.classify_line`` on one unwrapped log line (any prefix still
on it: dmesg ``[  219.470994]`` or ``[Fri Aug 30 11:43:09 2024]``, ``[ T1946]`` thread ids, syslog
``Dec  2 11:38:47 worker4 kernel:``, journald, ``kern  :warn  : <ISO time>``, or none). The agent's kmsg
watcher and ``remediator classify`` reach it through there. gpu-faults.md §1.1, §1.7 and §3 describe the
formats; NVIDIA's own regex (NVSentinel) misses the old form without ``PCI:``, the MIG ``GPU-I:`` suffix and
``pid='<unknown>'``, which are all accepted here.

Also recognised: Xid 154 recovery-action lines (the new action goes to ``detail["recovery_action"]`` and
picks the playbook), Xid 45 "caused by previous Xid N" (``detail["caused_by_xid"]``), NVLink5 Xid 144-150
(decoded by ``handlers.signatures.nvlink5`` into ``detail["nvlink"]`` and the scalars
``detail["nvlink_decoded_action"]``, ``nvlink_subcode``, ``nvlink_link``, ...), the k8s-device-plugin's
``XidCriticalError: Xid=N``, NVML event and "device marked unhealthy" lines, GKE's ``XidCriticalError`` node
condition, EKS's ``NvidiaXID<N>Error`` reasons, and prose that names an Xid or SXid without parentheses.
"""

from __future__ import annotations

import json
import re

from handlers.signatures.model import Signal, catalog_view, freeze, pci_or_none, to_int
from handlers.signatures.nvlink5 import NVLINK5_XIDS, decode_nvlink5

_PCI = r"[0-9a-f]{2,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?"

# "Xid (PCI:0000:07:00): 48, pid=...", "Xid (0000:03:00): 14, ...", "Xid (PCI:0000:01:00 GPU-I:05): 94".
_XID_RE = re.compile(
    r"\bxid\s*[\[(]\s*(?:pci\s*:\s*)?(?P<pci>" + _PCI + r")?\s*(?:gpu-?i\s*:?\s*(?P<gi>\d+))?[^)\]\n]{0,40}"
    r"[)\]]\s*[:,]?\s*(?P<code>\d{1,5})\b(?P<rest>.*)",
    re.IGNORECASE | re.DOTALL,
)
# Last resort for prose that names an Xid without the kernel's parentheses ("XID 79 detected on GPU ...").
_LOOSE_XID_RE = re.compile(r"(?<![a-z0-9_])xids?(?:[ _-]?errors?)?\s*(?:code|number|no\.?)?\s*[:=#]?\s*(\d{1,3})\b",
                           re.IGNORECASE)
_LOOSE_SXID_RE = re.compile(r"(?:(?P<sw>nvidia-nvswitch\d*)\s*:\s*)?(?<![a-z0-9_])sxid\s*[:=#]?\s*(?P<pci>)"
                            r"(?P<code>\d{4,6})\b(?P<rest>.*)", re.IGNORECASE | re.DOTALL)
_PID_RE = re.compile(r"\bpid\s*=\s*'?(?P<pid><unknown>|\d+)'?", re.IGNORECASE)
_NAME_RE = re.compile(r"\bname\s*=\s*(?P<name><unknown>|[^,\s]+)", re.IGNORECASE)
_CH_RE = re.compile(r"\bch(?:annel)?\s+(?P<ch>[0-9a-f]{4,8})\b", re.IGNORECASE)
_CAUSED_RE = re.compile(r"(?:caused by|due to)\s+(?:a\s+)?previous\s+xid\s*:?\s*(\d+)", re.IGNORECASE)
_RECOVERY_RE = re.compile(
    r"recovery\s+action\s+changed\s+from\s+(?P<old>0x[0-9a-f]+|\d+)\s*(?:\((?P<oldname>[^)]*)\))?"
    r"\s*to\s+(?P<new>0x[0-9a-f]+|\d+)\s*(?:\((?P<newname>[^)]*)\))?",
    re.IGNORECASE,
)
# The device plugin: "XidCriticalError: Xid=94 on Device=GPU-...; marking device as unhealthy."
_PLUGIN_XID_RE = re.compile(
    r"xidcriticalerror\s*:?\s*xid\s*=\s*(?P<code>\d+)(?:\s+on\s+device\s*=\s*(?P<dev>[^\s;,]+))?",
    re.IGNORECASE,
)
# The device plugin's NVML event dump: "Processing event {Device:{...} EventType:8 EventData:94 ...}", in 2019
# plugins "{UUID:0xc000318220 Etype:2 Edata:0}", and the DRA driver's "Data=0, Type=2, GI=..., CI=...".
_NVML_EVENT_RE = re.compile(
    r"\be(?:vent)?type\s*:\s*(?P<type>\d+)\s+e(?:vent)?data\s*:\s*(?P<data>\d+)"
    r"|\bdata\s*=\s*(?P<data2>\d+)\s*,\s*type\s*=\s*(?P<type2>\d+)\s*,\s*gi\s*=",
    re.IGNORECASE,
)
# GKE node condition: "XidCriticalError  True ... {"31":true} <bootID>".
_GKE_RE = re.compile(r"xidcriticalerror\b[^{\n]*\{(?P<set>\s*\"\d+\"\s*:\s*true[^}]*)\}", re.IGNORECASE)
# EKS: reason NvidiaXID79Error / NvidiaXID13Warning, message "detected XID-79 on the instance" (for codes outside
# its fatal list "detected unknown XID-13 on the instance").
_EKS_RE = re.compile(r"nvidiaxid(?P<code>\d+)(?P<sev>error|warning)|detected\s+(?:unknown\s+)?xid-(?P<code2>\d+)",
                     re.IGNORECASE)
_SXID_RE = re.compile(
    r"(?:(?P<sw>nvidia-nvswitch\d*)\s*:\s*)?\bsxid\s*[\[(]\s*(?:pci\s*:\s*)?(?P<pci>" + _PCI
    + r")?[^)\]\n]{0,40}[)\]]\s*[:,]?\s*(?P<code>\d{1,6})\b(?P<rest>.*)",
    re.IGNORECASE | re.DOTALL,
)
_IDENTITY_RE = re.compile(
    r"nvrm:\s*gpu\s+at\s+(?:pci\s*:\s*)?(?P<pci>" + _PCI + r")\s*:\s*(?P<uuid>gpu-[0-9a-f-]{8,})",
    re.IGNORECASE,
)
# The device plugin after an Xid: "'nvidia.com/gpu' device marked unhealthy: GPU-...".
_UNHEALTHY_RE = re.compile(r"'?([\w./-]*gpu[\w./-]*)'?\s+device\s+marked\s+unhealthy", re.IGNORECASE)
_OFF_BUS_RE = re.compile(r"fallen\s+off\s+the\s+bus", re.IGNORECASE)
# A bare PCI id needs its domain (a time of day such as 11:38:47 has the same shape without one); without a
# domain only right after "GPU" and with the function digit ("NVRM: GPU 18:00.0: GPU has fallen off the bus.").
# nvidia-smi glues the word to the id: "Unable to determine the device handle for GPU0000:41:00.0: GPU is lost".
_ANY_PCI_RE = re.compile(
    r"(?:pci(?:\s*bus\s*id)?\s*[:=]?\s*(" + _PCI + r"))\b"
    r"|\b(?:gpu)?([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?)\b"
    r"|\bgpu\s+(?:at\s+)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\b",
    re.IGNORECASE,
)
_UUID_RE = re.compile(r"\bGPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
# No-Xid GPU failures: GPU gone (NVML), adapter init failed, GSP heartbeat lost, reset required.
_LOST_RE = re.compile(
    r"gpu[\s_]*is[\s_]*lost",
    re.IGNORECASE,
)
_INIT_FAIL_RE = re.compile(r"rminitadapter\s+failed|rm_init_adapter\s+failed", re.IGNORECASE)
# "_kgspIsHeartbeatTimedOut: Heartbeat timed out, ...", then "_kgspRpcRecvPoll: GSP RM heartbeat timed out" (or
# "LibOS heartbeat timed out", LibOS being the GSP firmware's OS).
_GSP_HB_RE = re.compile(r"_?kgspIsHeartbeatTimedOut|(?:gsp(?:\s+rm)?|libos)\s+heartbeat\s+timed?\s*out", re.IGNORECASE)
_RESET_REQ_RE = re.compile(r"\bNV_ERR_RESET_REQUIRED\b", re.IGNORECASE)
# nvidia-smi when NVML cannot reach a GPU: "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error"
# (also "GPU0000:20:00.0" glued, and "Unable to detect ..."). In the source threads that was a GPU off the bus; an
# "Insufficient Permissions" or "Not Found" answer is a setup problem and stays unrecognised.
_HANDLE_RE = re.compile(r"unable\s+to\s+(?:determine|detect)\s+the\s+device\s+handle\s+for\s+gpu\s*[0-9a-f:.]*\s*:\s*"
                        r"(?P<why>unknown\s+error)", re.IGNORECASE)  # "...: GPU is lost" stays gpu_is_lost
# "Skipping non-nvmlEventTypeXidCriticalError event: {... EventType:2 ...}", "Skipping event {...}", "ignoring Xid 13":
# the device plugin and DRA driver logging an NVML event they chose not to act on.
_SKIPPED_RE = re.compile(r"\b(?:skipping|skipped|ignoring|ignored)\s+(?:non-?\s*nvml\w*\s+)?(?:xid\s*\d*\s*)?event\b"
                         r"|\b(?:skipping|ignoring)\s+xid\b", re.IGNORECASE)
_RETIRE_FAIL_RE = re.compile(r"dynamic\s+page\s+retirement\s*:\s*blacklisting\s+failed", re.IGNORECASE)

# NVML_GPU_RECOVERY_ACTION_* (gpu-faults.md §2.3): value -> (name as Xid 154 prints it, our playbook).
RECOVERY_ACTIONS: dict[int, tuple[str, str | None]] = {
    0: ("None", None),
    1: ("GPU Reset Required", "gpu-reset"),
    2: ("Node Reboot Required", "node-reboot"),
    3: ("Drain P2P", "gpu-reset"),
    4: ("Drain and Reset", "gpu-reset"),
    5: ("Recover IMEX Domain", "node-reboot"),
    6: ("Bus Reset", "node-reboot"),
    7: ("System Reboot", "node-reboot"),
}


def _recovery_playbook(code: int | None, name: str | None) -> str | None:
    low = (name or "").strip().lower()
    if low:
        if "reboot" in low or "bus reset" in low or "imex" in low:
            return "node-reboot"
        if "reset" in low or "p2p" in low:
            return "gpu-reset"
        if low == "none":
            return None
    if code is not None and code in RECOVERY_ACTIONS:
        return RECOVERY_ACTIONS[code][1]
    return "unknown-xid"


def is_skip_report(text: str) -> bool:
    """True for a line in which a component says it skipped or ignored an (NVML) event or an Xid."""
    return _SKIPPED_RE.search(text) is not None


def gpu_identity(line: str) -> tuple[str, str] | None:
    """``(pci_bus_id, uuid)`` from ``NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...``, else None.

    The PCI id is normalised (``0000:9b:00.0``); the UUID keeps NVML's spelling with a ``GPU-`` prefix.
    """
    m = _IDENTITY_RE.search(line)
    if m is None:
        return None
    pci = pci_or_none(m.group("pci"))
    if pci is None:
        return None
    uuid = m.group("uuid")
    return pci, "GPU-" + uuid[4:]


def xid_signal(code: int, pci: str | None = None, rest: str = "", *, gpu_uuid: str | None = None,
               mig_gi: int | None = None, extra: dict[str, object] | None = None) -> Signal:
    """The ``xid`` signal for ``code``, with the catalog's action and playbook and the line's particulars."""
    view = catalog_view(code)
    detail: dict[str, object] = dict(extra or {})
    if mig_gi is not None:
        detail["mig_gi"] = mig_gi
    playbook = view.playbook
    is_fatal = view.is_fatal
    if rest:
        pm = _PID_RE.search(rest)
        if pm is not None:
            detail["pid"] = to_int(pm.group("pid"))
        nm = _NAME_RE.search(rest)
        if nm is not None and nm.group("name") != "<unknown>":
            detail["process"] = nm.group("name")
        cm = _CH_RE.search(rest)
        if cm is not None:
            detail["channel"] = cm.group("ch").lower()
        caused = _CAUSED_RE.search(rest)
        if caused is not None:
            detail["caused_by_xid"] = int(caused.group(1))
        message = rest.lstrip(" ,:").strip()
        if message:
            detail["message"] = message[:512]
    if code == 154 and rest:
        rm = _RECOVERY_RE.search(rest)
        if rm is not None:
            new_code = to_int(rm.group("new"), 0)
            new_name = (rm.group("newname") or "").strip() or (
                RECOVERY_ACTIONS[new_code][0] if new_code in RECOVERY_ACTIONS else None)
            old_code = to_int(rm.group("old"), 0)
            detail["recovery_action"] = new_name
            detail["recovery_action_code"] = new_code
            detail["previous_recovery_action"] = (rm.group("oldname") or "").strip() or None
            detail["previous_recovery_action_code"] = old_code
            playbook = _recovery_playbook(new_code, new_name)
            is_fatal = playbook is not None
    if code in NVLINK5_XIDS and rest:
        decoded = decode_nvlink5(code, rest)
        if decoded is not None:
            nv = decoded.as_detail()
            detail["nvlink"] = nv
            # Scalars too, for consumers that keep only scalar detail (event labels).
            for key in ("subcode", "link", "intr_info", "error_status", "decoded_action", "investigatory_action"):
                detail[f"nvlink_{key}"] = nv[key]
            is_fatal = decoded.is_fatal
    return Signal(kind="xid", code=code, xid=code, pci_bus_id=pci, gpu_uuid=gpu_uuid, action=view.action,
                  playbook=playbook, is_fatal=is_fatal, detail=freeze(detail))


def classify_kernel(text: str, low: str | None = None) -> Signal | None:
    """The kernel/device-plugin signal in one unwrapped line, or None (identity lines are not faults)."""
    if low is None:
        low = text.lower()
    if "handle" in low:
        h = _HANDLE_RE.search(text)
        if h is not None:
            return _gpu_lost(text, "device_handle_" + h.group("why").lower().replace(" ", "_"), "gpu-lost")
    if "xid" in low:
        m = _XID_RE.search(text)
        if m is not None and not _is_sxid_at(text, m.start()):
            return xid_signal(int(m.group("code")), pci_or_none(m.group("pci")), m.group("rest"),
                              gpu_uuid=_uuid_in(text), mig_gi=to_int(m.group("gi")))
        s = _SXID_RE.search(text) or _LOOSE_SXID_RE.search(text)
        if s is not None:
            return _sxid_signal(s)
        sig = _orchestrator_xid(text)
        if sig is not None:
            return sig
        loose = _LOOSE_XID_RE.search(text)
        if loose is not None and int(loose.group(1)) > 0:
            return xid_signal(int(loose.group(1)), _pci_in(text), text[loose.end():], gpu_uuid=_uuid_in(text))
    elif "eventdata" in low:
        sig = _orchestrator_xid(text)
        if sig is not None:
            return sig
    if "unhealthy" in low:
        u = _UNHEALTHY_RE.search(text)
        if u is not None:
            return Signal(kind="health_check", code="device_marked_unhealthy", gpu_uuid=_uuid_in(text),
                          is_fatal=True, detail=freeze({"reporter": "k8s-device-plugin", "resource": u.group(1)}))
    if "off the bus" in low:
        return _gpu_lost(text, "fallen_off_the_bus", "gpu-lost")
    if "lost" in low and _LOST_RE.search(text):
        return _gpu_lost(text, "gpu_is_lost", "gpu-lost")
    if "nvrm" not in low and "heartbeat" not in low:
        return None
    if "adapter" in low and _INIT_FAIL_RE.search(text):
        return _gpu_lost(text, "rm_init_adapter_failed", "gpu-lost")
    if "heartbeat" in low and _GSP_HB_RE.search(text):
        return _gpu_lost(text, "gsp_heartbeat_timeout", "gsp-hang")
    if "reset_required" in low:
        return _gpu_lost(text, "NV_ERR_RESET_REQUIRED", "gpu-reset")
    if "retirement" in low and _RETIRE_FAIL_RE.search(text):
        return Signal(kind="ecc", code="page_retirement_failed", pci_bus_id=_pci_in(text),
                      gpu_uuid=_uuid_in(text), playbook="memory-retirement-failure", is_fatal=True,
                      detail=freeze({"message": text.strip()[:512]}))
    return None


def _is_sxid_at(text: str, start: int) -> bool:
    return start > 0 and text[start - 1] in "sS"


def _pci_in(text: str) -> str | None:
    for m in _ANY_PCI_RE.finditer(text):
        pci = pci_or_none(m.group(1) or m.group(2) or m.group(3))
        if pci is not None:
            return pci
    return None


def _uuid_in(text: str) -> str | None:
    m = _UUID_RE.search(text)
    return None if m is None else "GPU-" + m.group(0)[4:]


def _sxid_signal(m: re.Match[str]) -> Signal:
    rest = m.group("rest")
    low = rest.lower()
    fatal = "fatal" in low and "non-fatal" not in low and "nonfatal" not in low and "non fatal" not in low
    link = re.search(r"\blink\s+(\d+)", rest, re.IGNORECASE)
    detail: dict[str, object] = {
        "nvswitch": m.group("sw"),
        "nvswitch_pci": pci_or_none(m.group("pci")),
        "link": None if link is None else int(link.group(1)),
        "severity": "fatal" if fatal else "non-fatal",
        "message": rest.lstrip(" ,:").strip()[:512] or None,
    }
    return Signal(kind="sxid", code=int(m.group("code")), playbook="node-reboot" if fatal else None,
                  is_fatal=fatal, detail=freeze(detail))


def _gpu_lost(text: str, code: str, playbook: str) -> Signal:
    return Signal(kind="gpu_lost", code=code, pci_bus_id=_pci_in(text), gpu_uuid=_uuid_in(text),
                  playbook=playbook, is_fatal=True, detail=freeze({"message": text.strip()[:512]}))


def _orchestrator_xid(text: str) -> Signal | None:
    """Xids as Kubernetes components report them (gpu-faults.md §3)."""
    m = _PLUGIN_XID_RE.search(text)
    if m is not None:
        dev = m.group("dev") or ""
        uuid = _uuid_in(dev) or _uuid_in(text)
        return xid_signal(int(m.group("code")), _pci_in(dev) if uuid is None else None, gpu_uuid=uuid,
                          extra={"reporter": "k8s-device-plugin"})
    e = _NVML_EVENT_RE.search(text)
    etype = -1 if e is None else int(e.group("type") or e.group("type2"))
    if e is not None and etype == 8:  # nvmlEventTypeXidCriticalError
        return xid_signal(int(e.group("data") or e.group("data2")), gpu_uuid=_uuid_in(text),
                          extra={"reporter": "nvml-event"})
    if e is not None and etype in (1, 2):  # SingleBit / DoubleBit ECC events
        dbe = etype == 2
        return Signal(kind="ecc", code="DoubleBitEccError" if dbe else "SingleBitEccError",
                      gpu_uuid=_uuid_in(text), playbook="gpu-memory-fatal" if dbe else None, is_fatal=dbe,
                      detail=freeze({"reporter": "nvml-event"}))
    g = _GKE_RE.search(text)
    if g is not None:
        try:
            codes = sorted(int(k) for k in json.loads("{" + g.group("set") + "}"))
        except ValueError:
            codes = [int(c) for c in re.findall(r"\"(\d+)\"", g.group("set"))]
        if codes:
            return xid_signal(codes[0], extra={"reporter": "gke-node-condition", "xids": tuple(codes)})
    k = _EKS_RE.search(text)
    if k is not None:
        code = int(k.group("code") or k.group("code2"))
        return xid_signal(code, extra={"reporter": "eks-node-condition"})
    return None
