"""HTTP ingest (DESIGN.md §5): the Alertmanager webhook and the generic event endpoint.

Where it sits: at the front of the pipeline. ``app.create_app`` validates what arrives, turns each GPU
alert into a ``FaultEvent`` (``alerts.alert_to_event``) and answers only after JetStream has persisted every
event on FAULTS; the dispatcher takes it from there.
"""
