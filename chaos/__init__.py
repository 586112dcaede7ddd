"""chaos."""
