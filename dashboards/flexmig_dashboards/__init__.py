"""flexmig's Grafana dashboards and Prometheus alert rules, as code.

:mod:`~flexmig_dashboards.metrics` lists every metric they read; :mod:`~flexmig_dashboards.promql` builds the
shared PromQL (selectors on the dashboard variables, DCGM overlays, slice maps); :mod:`~flexmig_dashboards.panels`
wraps grafanalib; :mod:`~flexmig_dashboards.alerts` defines the rules. ``dashboards/build.py`` writes the files.
"""
