"""Jinja2 templates that install toposerve, and their renderer (later issues)."""
