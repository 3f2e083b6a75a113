"""Environments an agent acts in (for trajectory generation and live evaluation)."""
