"""Benchmarks behind ``remediator bench``: each module has ``run(...) -> dict`` whose keys are the figures.

Where it sits: beside the commands. ``remediator.commands.bench`` calls ``run`` and prints the dict (as one
JSON document with ``--json``); nothing here talks to NATS unless the benchmark is about NATS.
"""
