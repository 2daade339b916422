"""One real kubelet node (kubelet + containerd + runc) beside the kwok nodes
of a local cluster (docs/design.md §9): started, watched and torn down from here."""
