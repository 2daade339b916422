"""The shared topology model: domains, nodes, devices, distances and costs;
hardware profiles, label dialects, sysfs discovery, and the well-known
workload labels (``workloads``)."""
