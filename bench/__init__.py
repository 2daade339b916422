"""Benchmarks: one command each, printing a table and writing JSON (and a PNG)."""
