"""Real processes and clients that tests and benchmarks both stand on, so
tests need not import the benchmark package: simulated model servers and
routers (ours or a peer) as subprocesses on loopback ports, with their
metrics and CPU time at hand (``procs``); the GPU driver on a kwok node of
its own, with its service account and claims (``dra_gpu``); and the
kubelet's side of the DRA gRPC calls (``dra_kubelet``)."""
