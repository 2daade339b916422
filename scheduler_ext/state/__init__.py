"""The extender's view of the cluster: pods, nodes, claims and slices as its
watches show them (``watch``), kept in one cache (``cache``), and the facts
placement reads from it (``facts``)."""
