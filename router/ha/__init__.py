"""Hot standby: leader election on a Lease, and the routing state the
replicas share (router-ha.md)."""
