"""``toposerve scale run``: bring up a local cluster of a scenario's size,
submit its workload under each scheduler setup, measure and report."""
