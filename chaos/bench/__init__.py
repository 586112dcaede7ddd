"""Benchmarks behind ``remediator bench``: each module has ``run(...) -> dict`` whose keys are the figures.

Where it sits: beside the chaos harness, outside the service package: the benchmarks drive the service, the
agent and the classifier from outside, as the drills do, and some load the simulated cluster
(``chaos.sim``). ``remediator.cli.bench`` imports a benchmark only when it runs, calls ``run`` and prints
the dict (as one JSON document with ``--json``); nothing here talks to NATS unless the benchmark is about
NATS, and nothing on the service's path imports it.
"""
