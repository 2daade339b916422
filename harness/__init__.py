"""Real processes for tests and benchmarks alike: simulated model servers
and routers (ours or a peer), each a subprocess on a loopback port, with
their metrics and CPU time at hand (``procs``). Tests import it without
importing the benchmark package."""
