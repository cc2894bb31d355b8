"""What the tests share (not test modules): the rigs and harnesses that run real parts for them.

Each module is named after what it runs or provides:

- ``actuator``: a live actuator with its control server on a simulated node, in a background thread (``LiveNode``).
- ``commands``: MQTT commands against a real mosquitto: passwords and ACL, an operator client, a running listener.
- ``daemon``: an in-process flexmigd on a simulated node: start it, wait for sweeps, scrape its /metrics.
- ``flexmigd``: flexmigd with its actuator as a subprocess (``ActNode``), and bounded waits on it.
- ``freshhome``: the fresh home directory CI runs the suite in (``.ci/fresh-home``), and what it held at the start.
- ``dashboards``: the dashboard generator and catalogue, the committed JSON panel by panel, promtool's parse check.
- ``jobs``: the ``flexmig`` CLI, the example jobs' specs, the torch example's training log, killing a job's ranks.
- ``mosquitto``: a real mosquitto on a free loopback port, and the bounded waits the MQTT tests share.
- ``prometheus``: flexmigd as a subprocess and a real Prometheus scraping it.
- ``reaper``: reaping the exited orphans that the test run, a child subreaper, adopts (and nobody else's child).
- ``toml``: Python values rendered as TOML text, for the fuzzers that write hostile files.
- ``slurm``: a real single-node Slurm (munged, slurmctld, slurmd) around a simulated MIG node with the actuator and
  flexmig's Slurm agent (``SlurmRig``), and why it cannot run on a machine (``skip_reason``).
- ``systemd``: ``systemd-analyze verify``/``security`` of a unit, and ``support.*`` modules run under ``setpriv`` or
  ``unshare`` (``act_privileges``: act's process operations; ``beside_dcgm``: flexmigd beside dcgm-exporter).
- ``wheels``: the wheels built from a copy of the checkout, and fresh virtual environments to install them in.

Tests import them as ``support.<module>``: pytest puts ``tests/`` on ``sys.path`` (rootdir conftest, no
``tests/__init__.py``).
"""
