"""One real kubelet node (kubelet + containerd + runc) beside the kwok nodes
of a local cluster (DESIGN §10): started, watched and torn down from here."""
