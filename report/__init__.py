"""Idle-time report: reads a run directory's logs (never imports the runtime)."""
