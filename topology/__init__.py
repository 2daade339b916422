"""The shared topology model: domains, nodes, devices, distances and costs."""
