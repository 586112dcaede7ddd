"""The chaos harness: the simulated cluster, the drills and the demo that run the real system on one machine,
and the benchmarks beside them.

Where it sits: on top of everything, never under it: nothing on the service's path (``serve``, ``agent`` on a
real node) imports this package; the commands that need it (``demo``, ``drill``, ``sim``, ``bench``, and
``agent --sim-gpus``) load it when they run. The map, bottom up:

* ``chaos.sim``: the simulated Kubernetes API and GPU nodes (its own package docstring maps it);
* ``chaos.faults``: ``Fault``, ``FaultResult`` and the ``Injector`` base that declares a fault's kind and
  code;
* ``chaos.replica``: a service replica that can die like a process; ``chaos.kubelet``: what each simulated
  GPU node knows of its pods; ``chaos.world``: the running bus, cluster, GPU nodes, agents and service a
  drill acts on (``environment``, ``World``);
* ``chaos.injectors``: the faults, through Alertmanager webhooks or the agents; ``chaos.actions``: the
  machinery around them breaking (NATS, the Kubernetes API, the service, an agent, people);
* ``chaos.follow``: what came of each fault, read from the audit trail; ``chaos.checks``: what must be true
  of the cluster and GPUs per fault; ``chaos.expectations``: the drill-wide verdicts;
* ``chaos.schema``: the drill file's schema; ``chaos.catalog``: the drill files (``drills/*.yaml``, and
  ``demo.yaml``, the demo's); ``chaos.runner``: builds the world, plays a drill, settles, judges;
  ``chaos.demo``: the demo's report;
* ``chaos.bench``: the benchmarks behind ``remediator bench``.
"""
