"""The bridge's routes, one router per group of operations: probes, nodes, jobs."""
