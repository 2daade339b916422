"""Well-known label and annotation names of the workloads toposerve places
and routes: ours, llm-d's, LeaderWorkerSet's and DisaggregatedSet's. One
place, so the extender, the router and the scale runner read the same keys
(see docs/design.md, "Contracts")."""

from __future__ import annotations

# ours
GROUP = "toposerve.io/group"
GROUP_SIZE = "toposerve.io/group-size"
ROLE = "toposerve.io/role"
LEVEL = "toposerve.io/topology-level"
PREFERRED_LEVEL = "toposerve.io/preferred-topology-level"
# llm-d: a model server's role in P/D serving (prefill, decode, both)
LLMD_ROLE = "llm-d.ai/role"
# LeaderWorkerSet: the prefix of its pod labels and annotations
LWS = "leaderworkerset.sigs.k8s.io"
LWS_NAME = f"{LWS}/name"
LWS_GROUP_KEY = f"{LWS}/group-key"
LWS_GROUP_INDEX = f"{LWS}/group-index"
LWS_WORKER_INDEX = f"{LWS}/worker-index"
LWS_REVISION = f"{LWS}/template-revision-hash"
LWS_SIZE = f"{LWS}/size"
LWS_EXCLUSIVE = f"{LWS}/exclusive-topology"
LWS_SUBGROUP_KEY = f"{LWS}/subgroup-key"
LWS_SUBGROUP_SIZE = f"{LWS}/subgroup-size"
LWS_SUBGROUP_EXCLUSIVE = f"{LWS}/subgroup-exclusive-topology"
# DisaggregatedSet (the LWS project's API group): its pod labels
DS = "disaggregatedset.x-k8s.io"
DS_NAME, DS_ROLE, DS_SLICE, DS_REVISION = f"{DS}/name", f"{DS}/role", f"{DS}/slice", \
    f"{DS}/revision"
