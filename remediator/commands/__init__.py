"""CLI subcommands, one module each; remediator.cli wires them lazily."""
