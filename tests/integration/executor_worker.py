"""A stand-alone executor replica for the kill-and-resume test: ``python -m tests.integration.executor_worker``.

Reads its settings from ``REMEDIATOR_*`` (NATS URL, kubeconfig, replica id, lock TTL) and runs
``Executor.run`` until SIGTERM; the test SIGKILLs it in the middle of a playbook.
"""

from __future__ import annotations

import asyncio
import signal

from playbooks.catalog import PlaybookCatalog
from remediator import bus
from remediator.adapters.agent import AgentClient
from remediator.adapters.kube import AsyncKube
from remediator.audit import AuditLog
from remediator.executor import Executor
from remediator.settings import Settings
from remediator.signing import service_signer


async def main() -> None:
    s = Settings()
    assert s.nats_url
    nc, js = await bus.connect(s.nats_url, name=s.replica_id)
    kube = AsyncKube.from_settings(s, poll_interval_s=0.1)
    signer = service_signer(None, s.signing_seed_file)  # the rig's key, as the agents trust it
    ex = Executor(nc, js, s, kube, AuditLog(js, s.replica_id, signer=signer), PlaybookCatalog.load(),
                  AgentClient(nc, signer=signer))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await ex.run(stop)
    await nc.drain()
    kube.close()


if __name__ == "__main__":
    asyncio.run(main())
