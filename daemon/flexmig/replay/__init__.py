"""Trace replay: Alibaba GPU-trace jobs on a simulated MIG node, in simulated time, under five policies."""
