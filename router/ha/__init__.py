"""Router replicas and workers that share one view: the routing state
they tell each other (decisions, in-flight counts, snapshots) over a bus
(Redis, or a pod's local one), and the replicas' roles: all serving, or a
hot-standby pair on a Lease (router-ha.md)."""
