"""The node agent: one per GPU node, publishing what it sees to ``faults.agent.<node>`` and answering
node-local commands on ``agent.<node>.cmd``.

Where it sits: on the producing side of the bus, beside Alertmanager (DESIGN.md §1, §5). ``main.Agent``
composes the kernel-log watcher (``kmsg``, ``journal``), the NVML poller (``nvml_poller``), the orphan check
(``orphans``), the container-log scanner (``podlogs``), the command responder (``commands``) and the
publisher with its durable spool (``publisher``, ``spool``); ``host`` holds the interfaces the real node
and the simulated node (``chaos.sim.gpu_node``) both implement. Nothing in this package imports ``chaos``
or ``pynvml``.
"""
