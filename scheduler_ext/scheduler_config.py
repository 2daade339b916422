"""The ``KubeSchedulerConfiguration`` that wires the extender into a
kube-scheduler (``toposerve extender scheduler-config``)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from toposerve.kubeapi.names import is_subdomain

# the extender's call timeout: a millisecond at least (finer would print as 0s)
# and an hour at most
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 3600.0


def go_seconds(seconds: float) -> str:
    """``seconds`` as a Go duration kube-scheduler parses: decimals, never an
    exponent (5s, 2.5s, 0.001s; Python's 1e-05s is refused)."""
    return re.sub(r"\.?0+$", "", f"{seconds:.6f}") + "s"


def scheduler_config(url: str, *, weight: int = 1, timeout_s: float = 5.0,
                     scheduler_name: str | None = None, qps: int | None = None,
                     kubeconfig: str | None = None,
                     percentage_of_nodes_to_score: int | None = 100,
                     ungrouped_scheduler_name: str | None = None,
                     ungrouped_percentage: int = 0) -> dict[str, Any]:
    """``url``: the extender's URL prefix (``http://127.0.0.1:8888``); the
    scheduler posts to ``<url>/filter``, ``/prioritize`` and ``/preempt``.
    ``qps``: the scheduler's own client rate limit (the local cluster's
    benchmarks raise it, docs/design.md §7). ``percentage_of_nodes_to_score``:
    100 (every feasible node) unless the extender runs with
    ``placement.sampledNodes``; None: the scheduler's adaptive default.
    ``ungrouped_scheduler_name``: a second profile of the same scheduler for
    pods of no group, scoring ``ungrouped_percentage`` of the feasible
    nodes (0: the adaptive default, as the stock scheduler): such a pod
    needs no domain chosen over every node, only to keep off what the
    groups were promised, which the extender checks on any sample; the
    profiles share one cache, so neither hands out what the other holds.
    Raises ValueError for a name no pod could select, or one used twice
    (the scheduler would refuse to start)."""
    for flag, name in (("--scheduler-name", scheduler_name),
                       ("--ungrouped-scheduler-name", ungrouped_scheduler_name)):
        if name is not None and not is_subdomain(name):
            raise ValueError(f"{flag} {name!r}: a pod's spec.schedulerName is a DNS subdomain "
                             "(lower-case letters, digits, '-' and '.'), so no pod could "
                             "select this profile")
    if ungrouped_scheduler_name and \
            ungrouped_scheduler_name == (scheduler_name or "default-scheduler"):
        raise ValueError(f"--ungrouped-scheduler-name {ungrouped_scheduler_name!r} is already "
                         "the groups' profile's (--scheduler-name, default-scheduler when "
                         "not given); give it another name")
    extender = {
        "urlPrefix": url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "weight": weight,
        "enableHTTPS": url.startswith("https://"),
        # names only: the extender keeps its own node cache from watches
        "nodeCacheCapable": True,
        # claims, not container resources, carry the accelerators: every pod is sent
        "managedResources": [],
        # an extender that is down or slow never stops ordinary pods
        "ignorable": True,
        "httpTimeout": go_seconds(timeout_s),
    }
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
    }
    if percentage_of_nodes_to_score is not None:
        # 100: the extender sees every feasible node, not a sample
        cfg["percentageOfNodesToScore"] = percentage_of_nodes_to_score
    cfg["extenders"] = [extender]
    if scheduler_name or ungrouped_scheduler_name:
        cfg["profiles"] = [{"schedulerName": scheduler_name or "default-scheduler"}]
    if ungrouped_scheduler_name:
        cfg["profiles"].append({"schedulerName": ungrouped_scheduler_name,
                                "percentageOfNodesToScore": ungrouped_percentage})
    conn: dict[str, Any] = {}
    if kubeconfig:
        conn["kubeconfig"] = kubeconfig
    if qps:
        conn.update(qps=qps, burst=qps)
    if conn:
        cfg["clientConnection"] = conn
    return cfg


def render(cfg: dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
