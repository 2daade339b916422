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
# LeaderWorkerSet (kubernetes-sigs/lws api/leaderworkerset/v1): the prefix of the
# labels and annotations its controller and pod webhook put on pods
LWS = "leaderworkerset.sigs.k8s.io"
# labels: every pod
LWS_NAME = f"{LWS}/name"
LWS_GROUP_INDEX = f"{LWS}/group-index"
LWS_GROUP_KEY = f"{LWS}/group-key"  # sha1 of "<namespace>/<leader pod>"
LWS_WORKER_INDEX = f"{LWS}/worker-index"  # 0: the leader
LWS_REVISION = f"{LWS}/template-revision-hash"
# labels: pods of a group with a subGroupPolicy (not a LeaderExcluded leader)
LWS_SUBGROUP_INDEX = f"{LWS}/subgroup-index"
LWS_SUBGROUP_KEY = f"{LWS}/subgroup-key"  # sha1 of "<leader pod>/<subgroup index>"
# annotations: every pod (exclusive ones copied from the LeaderWorkerSet's own)
LWS_SIZE = f"{LWS}/size"
LWS_EXCLUSIVE = f"{LWS}/exclusive-topology"
LWS_LEADER_NAME = f"{LWS}/leader-name"  # workers only
LWS_SUBGROUP_POLICY = f"{LWS}/subgroup-policy-type"  # LeaderWorker or LeaderExcluded
LWS_SUBGROUP_SIZE = f"{LWS}/subgroup-size"
LWS_SUBGROUP_EXCLUSIVE = f"{LWS}/subgroup-exclusive-topology"
LWS_SUBDOMAIN_POLICY = f"{LWS}/subdomainPolicy"  # leaders, UniquePerReplica only
# annotation on the leader StatefulSet, not its pods
LWS_REPLICAS = f"{LWS}/replicas"
# DisaggregatedSet (the LWS project's API group, api/disaggregatedset/v1): the labels
# its controller puts on each role's LeaderWorkerSet and its pod templates
DS = "disaggregatedset.x-k8s.io"
DS_NAME, DS_ROLE, DS_SLICE, DS_REVISION = f"{DS}/name", f"{DS}/role", f"{DS}/slice", \
    f"{DS}/revision"
