"""flexmig.metrics: the Prometheus side. Every metric family declared once (:mod:`flexmig.metrics.families`),
the snapshot collector and its per-area extensions, and the bounded ``/metrics`` HTTP server."""
