"""Kube-scheduler HTTP extender for topology-aware group placement (later issues)."""
