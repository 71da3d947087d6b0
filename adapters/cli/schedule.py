"""CLI commands (being written)."""
