"""Command responder: node-local playbook steps on ``agent.<node>.cmd`` (core NATS request/reply).

Where it sits: the executor's hands on a node. A request carries an ``AgentCommand`` (JSON, from
``remediator.contracts``) and gets an ``AgentReply``. Transport: nats-py, on the agent's one connection
(``publisher.BusLink``): the agent must start and spool while NATS is down, and a faststream broker would
add a second connection (and ~7 MB of resident memory) for one subscription. The logic is
``CommandResponder.handle``, a plain coroutine that tests call directly.

Verbs (``cmd.gpu`` names the GPU by any of index, uuid, PCI bus id):

=================  ==========================================================================================
verb               does
=================  ==========================================================================================
``isolate_gpu``    ``nvidia-smi drain -p <pci> -m 1`` (no new work lands on it); no-op when already isolated;
                   the reply names the pods holding the GPU (``after.holders``)
``release_gpu``    undoes ``isolate_gpu`` (``-m 0``); no-op when not isolated (``params.force``: run anyway)
``reset_gpu``      ``nvidia-smi --gpu-reset -i <uuid>`` (PCI bus id without a UUID; never the index);
                   refused (``ok=False``) while any process holds the GPU (``after.refused = "in_use"``,
                   ``after.processes``: ``[{pid, used_bytes, pod_uid}]``), when the process list cannot be
                   read, or when the GPU is lost. Persistence mode on is turned off for the reset and back on
                   after (``after.persistence``: ``before``, ``during``, ``restored``); with it off, a process
                   still holding ``/dev/nvidia<minor>`` open (read from ``/proc/<pid>/fd`` where the pod view
                   can, the minor from NVML) refuses the reset too, named like the others. Then verified
                   (``after.verification``): the same UUID answers at the same PCI address (read afresh),
                   not lost, no page retirement or row remap pending; ``ok`` only when the reset ran and the
                   verification passed, ``after.reset_failed`` otherwise
``collect_bug_report``  the configured bug-report command (``--bug-report-command``, default
                   ``nvidia-bug-report.sh``); its output's last 2,000 characters in ``after.output``;
                   refused when none is configured
``kill_orphans``   SIGKILL to every process holding GPU memory whose pod is gone (``cmd.gpu``/``params.pids``
                   narrow it), then waits up to ``params.wait_s`` (5 s) for them to go; ``ok`` when none is left
``health_check``   NVML checks (not lost, no volatile DBE, no pending/failed row remap, no pending page
                   retirement, temperature below the limit) plus the configured command (``dcgmi diag -r 1``)
``reboot_node``    the configured reboot hook (simulated node: a simulated reboot); refused if none
``status``         every GPU's snapshot with its holders, the isolated GPUs, and the agent's counters;
                   with ``cmd.gpu``, that GPU's holders as ``after.holders`` too
=================  ==========================================================================================

Holders: the containers the kubelet gave the GPU to (device plugin or DRA), ``[{namespace, name, uid,
container}]``, from the agent's ``PodResourcesView``: the kubelet's PodResources socket read over gRPC and
joined with NVML (``remediator.agent.holders``), one ``List`` per command. ``after.holders_known`` is True only
when the socket answered for this reply; where the agent has no socket, or it did not answer, it is False and
the detail says why: then ``holders`` is empty and means "unknown", not "free". The service evicts exactly
the holders, by UID.

Idempotency: the reply of a command that changed something is kept under its id (in memory and in the
state directory, the last 512), and a repeat of that id returns it without acting again. Refusals, no-ops,
failed actions and read-only verbs are evaluated afresh, which is safe because they changed nothing.
Commands run one at a time.

Trust (DESIGN.md §4): ``on_message`` acts only on a command signed by a key of the agent's ``trust`` set
(the service's public keys: ``--trust-key``/``REMEDIATOR_TRUST_KEYS``), meant for this node, inside its
``issued_at``..``expires_at`` window (``skew_s`` of clock difference allowed, at most ``max_ttl_s`` long)
and with a nonce it has not seen: the nonces are kept until they expire (at most ``REPLAY_CACHE_SIZE``, in
the state directory, so a restart does not reopen a replay). Everything else (unsigned, untrusted signer,
bad signature, wrong node, expired, replayed, malformed) is refused whatever NATS let through: the reply
says ``refused: <reason>``, a warning is logged, ``refusals`` counts it by reason (shown by ``status``
and the agent's stats), and ``on_refused`` hands it to the agent's refusal reporter, which gets it audited
(``remediator.agent.refusals``). Every reply, refusals included, is signed with the agent's key (``signer``) and
names the node and the nonce it answers. ``handle`` is the trusted in-process entry (tests, benchmarks).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from remediator.agent.holders import with_process_uids
from remediator.agent.host import (
    DeviceOpeners,
    GpuBackend,
    GpuControl,
    GpuIdentity,
    GpuSnapshot,
    HostRunner,
    PodResourcesView,
    PodView,
    RunResult,
    gpu_reset_target,
)
from remediator.agent.orphans import find_orphans
from remediator.agent.state import StateStore
from remediator.contracts import AgentCommand, AgentReply, Change, GpuRef, normalize_pci_bus_id, utcnow
from remediator.signing import Signer, TrustSet, generate_seed, verify_document
from remediator.subjects import agent_cmd_subject

log = logging.getLogger(__name__)

CACHE_SIZE = 512
REPLAY_CACHE_SIZE = 8192
MAX_COMMAND_BYTES = 256 * 1024
DEFAULT_TEMPERATURE_LIMIT_C = 90
BUG_REPORT_DETAIL_CHARS = 2000
NO_HOLDER_SOURCE = ("which pods hold the GPU is unknown: this agent reads no kubelet PodResources socket "
                    "(--pod-resources SOCKET)")


class _Refused(Exception):
    """A verb declined to act; the message is the reply's detail."""


class CommandVerifier:
    """Decides whether a received command may run on ``node`` (see the module docstring's trust
    paragraph); keeps the nonces it accepted until they expire (in ``state`` when given) and counts
    refusals by reason. The node agent's responder and every test double of an agent use it."""

    def __init__(self, node: str, trust: TrustSet, state: StateStore | None = None, *,
                 clock: Callable[[], datetime] = utcnow, skew_s: float = 30.0, max_ttl_s: float = 600.0) -> None:
        self.node = node
        self.trust = trust
        self.state = state
        self.clock = clock
        self.skew_s = skew_s
        self.max_ttl_s = max_ttl_s
        self.refusals: Counter[str] = Counter()
        saved = state.load("replay").get("nonces", {}) if state is not None else {}
        self._nonces: dict[str, float] = {
            k: float(v) for k, v in saved.items() if isinstance(k, str) and isinstance(v, int | float)}

    def check(self, cmd: AgentCommand, raw: Any) -> tuple[str, str] | None:
        """Why ``cmd`` (as received, ``raw``) must not run: ``(reason, detail)``, counted in ``refusals``;
        None when it may (and then its nonce is recorded)."""
        refused = self._reason(cmd, raw)
        if refused is not None:
            self.refusals[refused[0]] += 1
        return refused

    def _reason(self, cmd: AgentCommand, raw: Any) -> tuple[str, str] | None:
        if not self.trust:
            return "no-trust", ("this agent trusts no service key: start it with --trust-key (or "
                                "REMEDIATOR_TRUST_KEYS) naming the service's public key")
        if cmd.sig is None or cmd.signer is None:
            return "unsigned", "the command is not signed"
        if cmd.signer not in self.trust:
            return "untrusted", f"signed by {cmd.signer}, which this agent does not trust"
        if not isinstance(raw, dict) or not verify_document(raw):
            return "bad-signature", "the signature does not match the command"
        if cmd.node != self.node:
            return "wrong-node", f"meant for node {cmd.node!r}, this is {self.node!r}"
        if cmd.nonce is None or cmd.issued_at is None or cmd.expires_at is None:
            return "incomplete", "the command has no nonce or validity window"
        now = self.clock()
        skew = timedelta(seconds=self.skew_s)
        if cmd.expires_at + skew < now:
            return "expired", f"expired at {cmd.expires_at.isoformat()}"
        if cmd.issued_at - skew > now:
            return "not-yet-valid", f"issued at {cmd.issued_at.isoformat()}, in the future"
        if (cmd.expires_at - cmd.issued_at).total_seconds() > self.max_ttl_s:
            return "too-long", f"valid for more than {self.max_ttl_s:g} s"
        if cmd.nonce in self._nonces:
            return "replayed", f"nonce {cmd.nonce} was already used"
        self._remember_nonce(cmd.nonce, (cmd.expires_at + skew).timestamp(), now.timestamp())
        return None

    def _remember_nonce(self, nonce: str, until: float, now: float) -> None:
        for k in [k for k, t in self._nonces.items() if t < now]:
            del self._nonces[k]
        self._nonces[nonce] = until
        while len(self._nonces) > REPLAY_CACHE_SIZE:  # the soonest to expire goes first
            del self._nonces[min(self._nonces, key=self._nonces.__getitem__)]
        if self.state is not None:
            self.state.save("replay", {"nonces": self._nonces})


class CommandResponder:
    """Runs ``AgentCommand``s against a ``GpuBackend`` and a ``HostRunner``."""

    # The health check's ``memory`` verdict for one GPU (the agent's memory-trend watch sets it): why the
    # GPU's memory is not back (processes over their baseline x factor, memory held by no process).
    memory_check: Callable[[GpuSnapshot], list[str]] | None = None
    # Told of every refused command, ``(reason, verb, command id, detail)``: the agent's refusal reporter
    # (``remediator.agent.refusals``), which gets them audited without any right beyond the agent's own.
    on_refused: Callable[[str, str, str, str], None] | None = None

    def __init__(self, *, node: str, gpus: GpuBackend | None, host: HostRunner, pods: PodView | None,
                 state: StateStore, status_extra: Callable[[], dict[str, Any]] | None = None,
                 temperature_limit_c: int = DEFAULT_TEMPERATURE_LIMIT_C, kill_wait_s: float = 5.0,
                 pod_resources: PodResourcesView | None = None, signer: Signer | None = None,
                 trust: TrustSet | None = None, clock: Callable[[], datetime] = utcnow, skew_s: float = 30.0,
                 max_ttl_s: float = 600.0) -> None:
        self.node = node
        self.signer = signer or Signer(generate_seed())
        self.trust = trust or TrustSet()
        self.clock = clock
        self.skew_s = skew_s
        self.max_ttl_s = max_ttl_s
        self.verifier = CommandVerifier(node, self.trust, state, clock=clock, skew_s=skew_s, max_ttl_s=max_ttl_s)
        self.refusals = self.verifier.refusals
        self.gpus = gpus
        self.pod_resources = pod_resources
        self.host = host
        self.pods = pods
        self.state = state
        self.status_extra = status_extra
        self.temperature_limit_c = temperature_limit_c
        self.kill_wait_s = kill_wait_s
        self._lock = asyncio.Lock()
        saved = state.load("commands")
        self._replies: OrderedDict[str, dict[str, Any]] = OrderedDict(
            (k, v) for k, v in saved.get("replies", []) if isinstance(k, str) and isinstance(v, dict))
        self._isolated: set[str] = set(state.load("isolation").get("isolated", []))
        self.handled = 0

    # --- transport -----------------------------------------------------------------------------------

    async def subscribe(self, nc: NATS) -> Subscription:
        """Subscribe to this node's command subject, and return once the server has the subscription.

        The flush is the round trip that makes "the agent is up" true for a sender on another connection:
        without it the SUB can still sit in this client's buffer while a request finds no responder. A flush
        that fails (the connection dropped meanwhile) leaves the subscription to the client, which sends it
        again on reconnecting; it is logged, never raised into the bus link.
        """
        sub = await nc.subscribe(agent_cmd_subject(self.node), cb=self.on_message)
        try:
            await nc.flush(timeout=5)
        except (nats.errors.Error, OSError) as e:
            log.warning("the server has not confirmed the command subscription yet (%s); it is sent again on "
                        "reconnect", type(e).__name__)
        return sub

    async def on_message(self, msg: Msg) -> None:
        """Verify, then act: see the module docstring's trust paragraph."""
        raw: Any = None
        try:
            if len(msg.data) > MAX_COMMAND_BYTES:
                raise ValueError(f"command of {len(msg.data)} bytes is over the limit")
            raw = json.loads(msg.data)
            cmd = AgentCommand.model_validate(raw)
        except (ValueError, ValidationError) as e:
            cmd_id = raw["id"][:512] if isinstance(raw, dict) and isinstance(raw.get("id"), str) else "invalid"
            detail = f"{e.errors()[:3]}" if isinstance(e, ValidationError) else str(e)[:200]
            self.refusals["malformed"] += 1
            reply = self._refuse(msg.subject, cmd_id, "?", "malformed", f"invalid command: {detail}",
                                 raw.get("nonce") if isinstance(raw, dict) else None)
        else:
            reason = self.verifier.check(cmd, raw)
            if reason:
                reply = self._refuse(msg.subject, cmd.id, cmd.verb, reason[0], reason[1], cmd.nonce)
            else:
                reply = await self.handle(cmd)
                reply = reply.model_copy(update={"nonce": cmd.nonce})
        if msg.reply:
            await msg.respond(self.sign(reply))

    def sign(self, reply: AgentReply) -> bytes:
        """``reply`` as sent: naming this node, signed by the agent's key (the exact bytes signed)."""
        body = json.loads(reply.model_copy(update={"node": self.node, "signer": None, "sig": None}).model_dump_json())
        return json.dumps(self.signer.sign_document(body), separators=(",", ":")).encode()

    def _refuse(self, subject: str, cmd_id: str, verb: str, reason: str, detail: str,
                nonce: Any) -> AgentReply:
        log.warning("refused command %r (%s) on %s: %s: %s", cmd_id[:120], verb, subject, reason, detail)
        if self.on_refused is not None:
            self.on_refused(reason, verb, cmd_id, detail)
        return AgentReply(id=cmd_id, ok=False, detail=f"refused: {detail}", after={"refused": reason},
                          nonce=nonce if isinstance(nonce, str) and len(nonce) <= 64 else None)

    # --- dispatch ------------------------------------------------------------------------------------

    async def handle(self, cmd: AgentCommand) -> AgentReply:
        """The reply to ``cmd``; a repeated id of a command that acted returns the first reply."""
        async with self._lock:
            cached = self._replies.get(cmd.id)
            if cached is not None:
                return AgentReply.model_validate(cached)
            self.handled += 1
            verb: Callable[[AgentCommand], Awaitable[tuple[AgentReply, bool]]] = getattr(self, f"_{cmd.verb}")
            try:
                reply, acted = await verb(cmd)
            except _Refused as e:
                reply, acted = AgentReply(id=cmd.id, ok=False, detail=str(e)), False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("command %s (%s) failed", cmd.id, cmd.verb)
                reply, acted = AgentReply(id=cmd.id, ok=False, detail=f"error: {e}"), False
            log.info("command %s %s%s -> ok=%s changed=%s: %s", cmd.id, cmd.verb,
                     f" gpu={cmd.gpu.key}" if cmd.gpu else "", reply.ok, reply.changed, reply.detail)
            if acted and reply.changed:
                self._remember(reply)
            return reply

    def _remember(self, reply: AgentReply) -> None:
        self._replies[reply.id] = reply.model_dump(mode="json")
        while len(self._replies) > CACHE_SIZE:
            self._replies.popitem(last=False)
        self.state.save("commands", {"replies": list(self._replies.items())})

    # --- helpers -------------------------------------------------------------------------------------

    async def _snapshots(self) -> list[GpuSnapshot]:
        backend = self.gpus
        if backend is None:
            return []
        return await asyncio.to_thread(lambda: [backend.snapshot(i) for i in range(backend.gpu_count())])

    async def _resolve(self, ref: GpuRef | None) -> GpuSnapshot:
        if self.gpus is None:
            raise _Refused("this agent has no GPU backend (started without --nvml or --sim-gpus)")
        if ref is None:
            raise _Refused("the command names no GPU")
        snaps = await self._snapshots()
        pci = None
        if ref.pci_bus_id:
            try:
                pci = normalize_pci_bus_id(ref.pci_bus_id)
            except ValueError:
                pci = None
        for snap in snaps:
            ident = snap.identity
            if (ref.uuid and ident.uuid == ref.uuid) or (pci and ident.pci_bus_id == pci) or (
                    not ref.uuid and not pci and ref.index is not None and ident.index == ref.index):
                return snap
        raise _Refused(f"no GPU {ref.key} on node {self.node}")

    def _unknown_why(self) -> str:
        """Why the holders are unknown, for a reply's detail."""
        source = self.pod_resources
        if source is None:
            return NO_HOLDER_SOURCE
        return f"which pods hold the GPU is unknown: {getattr(source, 'last_error', None) or 'no answer'}"

    async def _holder_lists(self, snaps: list[GpuSnapshot]) -> list[list[dict[str, Any]] | None]:
        """The containers holding each of ``snaps``' GPUs, from one question to the source (one ``List``);
        None for each when this agent cannot tell."""
        source = self.pod_resources
        if source is None or not snaps:
            return [None] * len(snaps)
        batch = getattr(source, "holder_map", None)
        if batch is not None:
            found = await asyncio.to_thread(batch, [s.identity for s in snaps])
            if found is None:
                return [None] * len(snaps)
            if any(h.uid is None for hs in found.holders.values() for h in hs):
                found = with_process_uids(found, await asyncio.to_thread(self._process_pod_uids, snaps))
            return [[h.to_dict() for h in found.of(s.identity)] for s in snaps]
        out: list[list[dict[str, Any]] | None] = []
        for s in snaps:
            one = await asyncio.to_thread(source.gpu_holders, s.identity)
            out.append(None if one is None else [h.to_dict() for h in one])
        return out

    def _process_pod_uids(self, snaps: list[GpuSnapshot]) -> dict[str, set[str]]:
        """GPU key -> the pod UIDs (from their cgroups) of the compute processes NVML lists on it."""
        out: dict[str, set[str]] = {}
        if self.pods is None:
            return out
        for snap in snaps:
            uids = {self.pods.pid_info(p.pid).pod_uid for p in (snap.processes or ())[:64]}
            out[snap.identity.key] = {u for u in uids if u}
        return out

    async def _holders(self, snap: GpuSnapshot) -> list[dict[str, Any]] | None:
        """The containers holding ``snap``'s GPU; None when this agent cannot tell."""
        return (await self._holder_lists([snap]))[0]

    async def _with_holders(self, snap: GpuSnapshot, after: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """``after`` with ``holders``/``holders_known``, and a note for the detail when they are unknown."""
        holders = await self._holders(snap)
        note = "" if holders is not None else f"; {self._unknown_why()}"
        return {**after, "holders": holders or [], "holders_known": holders is not None}, note

    def _save_isolation(self) -> None:
        self.state.save("isolation", {"isolated": sorted(self._isolated)})

    @staticmethod
    def _result(cmd: AgentCommand, r: RunResult, before: dict[str, Any], after: dict[str, Any]
                ) -> tuple[AgentReply, bool]:
        return AgentReply.of(cmd.id, r.ok, Change(r.ok, before, after, r.detail)), True

    # --- verbs ---------------------------------------------------------------------------------------

    async def _isolate_gpu(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        snap = await self._resolve(cmd.gpu)
        key = snap.identity.key
        before = {"isolated": key in self._isolated}
        if key in self._isolated:
            after, note = await self._with_holders(snap, before)
            return AgentReply(id=cmd.id, ok=True, detail=f"GPU {snap.index} is already isolated{note}",
                              before=before, after=after), False
        r = await self.host.isolate_gpu(snap.identity)
        if r.ok:
            self._isolated.add(key)
            self._save_isolation()
        after, note = await self._with_holders(snap, {"isolated": key in self._isolated})
        return AgentReply(id=cmd.id, ok=r.ok, changed=r.ok, detail=r.detail + note, before=before,
                          after=after), True

    async def _release_gpu(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        snap = await self._resolve(cmd.gpu)
        key = snap.identity.key
        before = {"isolated": key in self._isolated}
        if key not in self._isolated and not cmd.params.get("force"):
            return AgentReply(id=cmd.id, ok=True, detail=f"GPU {snap.index} is not isolated",
                              before=before, after=before), False
        r = await self.host.release_gpu(snap.identity)
        if r.ok:
            self._isolated.discard(key)
            self._save_isolation()
        return self._result(cmd, r, before, {"isolated": key in self._isolated})

    def _process_holders(self, snap: GpuSnapshot) -> list[dict[str, Any]]:
        """The compute processes on ``snap``'s GPU with the pod each belongs to (its cgroup's pod UID)."""
        out: list[dict[str, Any]] = []
        for proc in (snap.processes or ())[:64]:
            info = self.pods.pid_info(proc.pid) if self.pods is not None else None
            out.append({"pid": proc.pid, "used_bytes": proc.used_bytes,
                        "pod_uid": info.pod_uid if info is not None else None})
        return out

    async def _device_openers(self, snap: GpuSnapshot) -> list[int]:
        """PIDs holding ``/dev/nvidia<minor>`` of the GPU open, where the pod view can read ``/proc`` fds and
        the backend knows the minor number (NVML on a real node); [] elsewhere."""
        view, minor_of = self.pods, getattr(self.gpus, "minor_number", None)
        if not isinstance(view, DeviceOpeners) or not callable(minor_of):
            return []
        minor = await asyncio.to_thread(minor_of, snap.index)
        if not isinstance(minor, int):
            return []
        return await asyncio.to_thread(view.device_openers, f"/dev/nvidia{minor}")

    async def _reset_gpu(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        snap = await self._resolve(cmd.gpu)
        ident = snap.identity
        if snap.lost:
            raise _Refused(f"refused: GPU {snap.index} is lost (fallen off the bus); a reset cannot reach it, "
                           "the node needs a power cycle")
        if snap.processes is None:
            raise _Refused(f"refused: the compute processes on GPU {snap.index} cannot be read, so a reset "
                           "could kill work")
        if snap.processes:
            holders = await asyncio.to_thread(self._process_holders, snap)
            named = ", ".join(f"{h['pid']}" + (f" (pod {h['pod_uid']})" if h["pod_uid"] else "") for h in holders)
            return AgentReply(id=cmd.id, ok=False, detail=(
                f"refused: {len(snap.processes)} process(es) hold GPU {snap.index}: pid {named}; drain the GPU "
                "first"), after={"refused": "in_use", "processes": holders}), False
        target = gpu_reset_target(ident)
        if target is None:
            raise _Refused(f"refused: GPU {snap.index} has no known UUID or PCI bus id; a reset by index could "
                           "reach another GPU")
        control = self.gpus if isinstance(self.gpus, GpuControl) else None
        before = snap.to_dict()
        persistence: dict[str, Any] = {"before": None, "during": None, "restored": None}
        if control is not None:
            persistence["before"] = persistence["during"] = await asyncio.to_thread(
                control.persistence_mode, ident.index)
        if control is not None and persistence["before"]:
            why = await asyncio.to_thread(control.set_persistence_mode, ident.index, False)
            if why is not None:
                return AgentReply(id=cmd.id, ok=False, detail=(
                    f"refused: persistence mode of GPU {snap.index} is on and could not be turned off for the "
                    f"reset: {why}"), before=before,
                    after={"refused": "persistence", "persistence": persistence}), False
            persistence["during"] = False
        # with persistence off nvidia-persistenced has let go: whoever still holds the device node open
        # (the device plugin, DCGM: no compute process NVML would list) makes the reset fail "in use"
        openers = await self._device_openers(snap)
        if openers:
            if control is not None and persistence["before"]:
                await asyncio.to_thread(control.set_persistence_mode, ident.index, True)
            holders = [{"pid": pid, "used_bytes": None, "pod_uid": info.pod_uid if info is not None else None}
                       for pid in openers
                       for info in [self.pods.pid_info(pid) if self.pods is not None else None]]
            named = ", ".join(f"{h['pid']}" + (f" (pod {h['pod_uid']})" if h["pod_uid"] else "") for h in holders)
            return AgentReply(id=cmd.id, ok=False, detail=(
                f"refused: {len(holders)} process(es) hold the device node of GPU {snap.index} open: pid {named}"),
                before=before, after={"refused": "in_use", "processes": holders}), False
        r = await self.host.reset_gpu(ident)
        if control is not None and persistence["before"]:
            why = await asyncio.to_thread(control.set_persistence_mode, ident.index, True)
            persistence["restored"] = why is None
            if why is not None:
                persistence["restore_error"] = why
        verification = await self._verify_reset(ident, control) if r.ok else None
        ok = r.ok and bool(verification and verification["passed"])
        detail = r.detail
        if persistence["before"]:
            detail += ("; persistence mode turned off for the reset and " +
                       ("restored" if persistence["restored"] else f"NOT restored: {persistence.get('restore_error')}"))
        if verification is not None:
            detail += ("; verified: same UUID at the same PCI address, nothing pending" if verification["passed"]
                       else "; verification failed: " + "; ".join(verification["problems"]))
        snapshot = verification.pop("snapshot") if verification is not None else before
        after: dict[str, Any] = {**snapshot, "reset": r.ok, "reset_failed": not ok, "target": target,
                                 "persistence": persistence, "verification": verification}
        return AgentReply(id=cmd.id, ok=ok, changed=r.ok, detail=detail, before=before, after=after), True

    async def _verify_reset(self, ident: GpuIdentity, control: GpuControl | None) -> dict[str, Any]:
        """What the reset left: the same UUID answering at the GPU's PCI address (read afresh through NVML),
        not lost, no page retirement or row remap pending, no remap failure."""
        problems: list[str] = []
        uuid_after: str | None = None
        if control is not None and ident.pci_bus_id:
            fresh = await asyncio.to_thread(control.identity_at, ident.pci_bus_id)
            if fresh is None:
                problems.append(f"no GPU answers at {ident.pci_bus_id} after the reset")
            else:
                uuid_after = fresh.uuid
                if ident.uuid and fresh.uuid != ident.uuid:
                    problems.append(f"a different GPU answers at {ident.pci_bus_id}: {fresh.uuid}, was {ident.uuid}")
        backend = self.gpus
        assert backend is not None
        snap = await asyncio.to_thread(backend.snapshot, ident.index)
        if uuid_after is None and not problems:
            uuid_after = snap.identity.uuid
            if ident.uuid and uuid_after != ident.uuid:
                problems.append(f"GPU {ident.index} answers with UUID {uuid_after}, was {ident.uuid}")
        if snap.lost:
            problems.append("the GPU is lost after the reset")
        if snap.retired_pages_pending:
            problems.append("page retirement still pending")
        rr = snap.remapped_rows
        if rr is not None and rr.pending:
            problems.append("row remap still pending")
        if rr is not None and rr.failure:
            problems.append("row remap failure")
        return {"passed": not problems, "problems": problems, "uuid_before": ident.uuid, "uuid_after": uuid_after,
                "pci_bus_id": ident.pci_bus_id, "lost": snap.lost,
                "retired_pages_pending": snap.retired_pages_pending,
                "remap_pending": rr.pending if rr is not None else None, "snapshot": snap.to_dict()}

    async def _collect_bug_report(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        r = await self.host.bug_report()
        if r is None:
            raise _Refused("refused: no bug-report command is configured on this agent (--bug-report-command)")
        out = r.detail[-BUG_REPORT_DETAIL_CHARS:]
        return AgentReply(id=cmd.id, ok=r.ok, detail=out, after={"collected": r.ok, "output": out}), False

    async def _kill_orphans(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        if self.pods is None or self.gpus is None:
            raise _Refused("orphan detection is not available on this agent")
        only_pids = {int(p) for p in cmd.params.get("pids", [])}

        async def orphans_now() -> list[Any]:
            snaps = await self._snapshots()
            if cmd.gpu is not None:
                target = await self._resolve(cmd.gpu)
                snaps = [s for s in snaps if s.identity == target.identity]
            assert self.pods is not None
            found = find_orphans(snaps, self.pods)
            return [o for o in found if not only_pids or o.pid in only_pids]

        orphans = await orphans_now()
        before = {"orphans": [{"pid": o.pid, "gpu": o.gpu.index, "used_bytes": o.used_bytes,
                               "pod_uid": o.pod_uid} for o in orphans]}
        if not orphans:
            return AgentReply(id=cmd.id, ok=True, detail="no orphaned GPU processes", before=before,
                              after=before), False
        results = [(o.pid, await self.host.kill_process(o.pid)) for o in orphans]
        wait_s = float(cmd.params.get("wait_s", self.kill_wait_s))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        remaining = await orphans_now()
        while remaining and loop.time() < deadline:
            await asyncio.sleep(0.2)
            remaining = await orphans_now()
        after = {"orphans": [{"pid": o.pid, "gpu": o.gpu.index, "used_bytes": o.used_bytes,
                              "pod_uid": o.pod_uid} for o in remaining],
                 "killed": [pid for pid, r in results if r.ok]}
        failed = [f"{pid}: {r.detail}" for pid, r in results if not r.ok]
        ok = not remaining and not failed
        if ok:
            detail = f"killed {len(results)} orphaned process(es): " + ", ".join(str(p) for p, _ in results)
        else:
            detail = "; ".join(failed + ([f"pid(s) {', '.join(str(o.pid) for o in remaining)} still hold "
                                          f"GPU memory after SIGKILL"] if remaining else []))
        return AgentReply(id=cmd.id, ok=ok, changed=any(r.ok for _, r in results), detail=detail,
                          before=before, after=after), True

    async def _health_check(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        snaps = [await self._resolve(cmd.gpu)] if cmd.gpu is not None else await self._snapshots()
        gpus: dict[str, Any] = {}
        failures: list[str] = []
        checks = cmd.params.get("checks")
        memory = self.memory_check is not None and (not isinstance(checks, list) or "memory" in checks)
        for snap in snaps:
            failed = self.gpu_failures(snap)
            if memory and self.memory_check is not None and not snap.lost:
                failed += self.memory_check(snap)
            gpus[str(snap.index)] = {"uuid": snap.identity.uuid, "passed": not failed, "failed": failed}
            failures.extend(f"GPU {snap.index}: {f}" for f in failed)
        after: dict[str, Any] = {"gpus": gpus}
        extra = await self.host.health_command()
        if extra is not None:
            after["command"] = {"ok": extra.ok, "detail": extra.detail}
            if not extra.ok:
                failures.append(f"health command failed: {extra.detail}")
        if not snaps and extra is None:
            raise _Refused("nothing to check: no GPU backend and no health command configured")
        ok = not failures
        detail = f"{len(snaps)} GPU(s) healthy" if ok else "; ".join(failures)
        return AgentReply(id=cmd.id, ok=ok, detail=detail, after=after), False

    def gpu_failures(self, snap: GpuSnapshot) -> list[str]:
        """What makes ``snap`` unhealthy (empty: it passes)."""
        if snap.lost:
            return ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"]
        failed = []
        if snap.ecc.dbe_volatile:
            failed.append(f"{snap.ecc.dbe_volatile} uncorrectable (DBE) ECC error(s) since the last reset")
        rr = snap.remapped_rows
        if rr is not None and rr.pending:
            failed.append("row remapping pending (needs a GPU reset)")
        if rr is not None and rr.failure:
            failed.append("row remapping failure (replace the GPU)")
        if snap.retired_pages_pending:
            failed.append("page retirement pending")
        if snap.temperature_c is not None and snap.temperature_c >= self.temperature_limit_c:
            failed.append(f"temperature {snap.temperature_c} C >= {self.temperature_limit_c} C")
        return failed

    async def _reboot_node(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        r = await self.host.reboot_node()
        if r is None:
            raise _Refused("refused: no reboot hook is configured on this agent (--reboot-command)")
        self._isolated.clear()
        self._save_isolation()
        return self._result(cmd, r, {}, {"rebooted": r.ok})

    async def _status(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        snaps = await self._snapshots()
        lists = await self._holder_lists(snaps)  # one List for every GPU of the reply
        known = bool(snaps) and all(h is not None for h in lists)
        gpus = [{**s.to_dict(), "holders": h} for s, h in zip(snaps, lists, strict=True)]
        after: dict[str, Any] = {"node": self.node, "gpus": gpus, "isolated": sorted(self._isolated),
                                 "holders_known": known}
        note = "" if known or not snaps else f"; {self._unknown_why()}"
        detail = f"{len(snaps)} GPU(s)"
        if cmd.gpu is not None:
            target = await self._resolve(cmd.gpu)
            held = next((h for s, h in zip(snaps, lists, strict=True) if s.identity == target.identity), None)
            after = {**after, "holders": held or [], "holders_known": held is not None}
            note = "" if held is not None else f"; {self._unknown_why()}"
            detail += f"; GPU {target.index} is held by {len(after['holders'])} container(s)"
        after["refusals"] = dict(self.refusals)
        if self.status_extra is not None:
            after.update(self.status_extra())
        return AgentReply(id=cmd.id, ok=True, detail=detail + note, after=after), False
