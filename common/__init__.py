"""Plumbing every package shares (config validation, console output); it imports none of them."""
