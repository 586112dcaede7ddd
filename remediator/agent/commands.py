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
``reset_gpu``      ``nvidia-smi --gpu-reset -i <index>``; refused (``ok=False``) while any compute process
                   holds the GPU, when the process list cannot be read, or when the GPU is lost
``kill_orphans``   SIGKILL to every process holding GPU memory whose pod is gone (``cmd.gpu``/``params.pids``
                   narrow it), then waits up to ``params.wait_s`` (5 s) for them to go; ``ok`` when none is left
``health_check``   NVML checks (not lost, no volatile DBE, no pending/failed row remap, no pending page
                   retirement, temperature below the limit) plus the configured command (``dcgmi diag -r 1``)
``reboot_node``    the configured reboot hook (simulated node: a simulated reboot); refused if none
``status``         every GPU's snapshot with its holders, the isolated GPUs, and the agent's counters;
                   with ``cmd.gpu``, that GPU's holders as ``after.holders`` too
=================  ==========================================================================================

Holders: the containers the kubelet's device manager gave the GPU to, ``[{namespace, name, uid,
container}]``, from the agent's ``PodResourcesView`` (the GPU backend when it is one, as the simulated node
is). ``after.holders_known`` is False, and the detail says so, where the agent has no such source (a real
node until the kubelet PodResources API is read, issue 10): then ``holders`` is empty and means "unknown",
not "free". The service evicts exactly the holders, by UID.

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
says ``refused: <reason>``, a warning is logged, and ``refusals`` counts it by reason (shown by ``status``
and the agent's stats). Every reply, refusals included, is signed with the agent's key (``signer``) and
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

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from remediator.agent.host import GpuBackend, GpuSnapshot, HostRunner, PodResourcesView, PodView, RunResult
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
NO_HOLDER_SOURCE = ("which pods hold the GPU is unknown: this agent reads no PodResources source (the kubelet "
                    "PodResources API is not wired in yet)")


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
        self.pod_resources = pod_resources if pod_resources is not None else (
            gpus if isinstance(gpus, PodResourcesView) else None)
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
        return await nc.subscribe(agent_cmd_subject(self.node), cb=self.on_message)

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

    async def _holders(self, snap: GpuSnapshot) -> list[dict[str, Any]] | None:
        """The containers holding ``snap``'s GPU; None when this agent cannot tell."""
        source = self.pod_resources
        if source is None:
            return None
        found = await asyncio.to_thread(source.gpu_holders, snap.identity)
        return None if found is None else [h.to_dict() for h in found]

    async def _with_holders(self, snap: GpuSnapshot, after: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """``after`` with ``holders``/``holders_known``, and a note for the detail when they are unknown."""
        holders = await self._holders(snap)
        note = "" if holders is not None else f"; {NO_HOLDER_SOURCE}"
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

    async def _reset_gpu(self, cmd: AgentCommand) -> tuple[AgentReply, bool]:
        snap = await self._resolve(cmd.gpu)
        if snap.lost:
            raise _Refused(f"refused: GPU {snap.index} is lost (fallen off the bus); a reset cannot reach it, "
                           "the node needs a power cycle")
        if snap.processes is None:
            raise _Refused(f"refused: the compute processes on GPU {snap.index} cannot be read, so a reset "
                           "could kill work")
        if snap.processes:
            pids = ", ".join(str(p.pid) for p in snap.processes)
            raise _Refused(f"refused: {len(snap.processes)} compute process(es) hold GPU {snap.index} "
                           f"(pid {pids}); drain the GPU first")
        before = snap.to_dict()
        r = await self.host.reset_gpu(snap.identity)
        after = (await self._resolve(cmd.gpu)).to_dict() if r.ok else before
        return self._result(cmd, r, before, after)

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
        for snap in snaps:
            failed = self.gpu_failures(snap)
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
        gpus = [{**s.to_dict(), "holders": await self._holders(s)} for s in snaps]
        after: dict[str, Any] = {"node": self.node, "gpus": gpus, "isolated": sorted(self._isolated),
                                 "holders_known": self.pod_resources is not None}
        note = "" if self.pod_resources is not None else f"; {NO_HOLDER_SOURCE}"
        detail = f"{len(snaps)} GPU(s)"
        if cmd.gpu is not None:
            target = await self._resolve(cmd.gpu)
            after, note = await self._with_holders(target, after)
            detail += f"; GPU {target.index} is held by {len(after['holders'])} container(s)"
        after["refusals"] = dict(self.refusals)
        if self.status_extra is not None:
            after.update(self.status_extra())
        return AgentReply(id=cmd.id, ok=True, detail=detail + note, after=after), False
