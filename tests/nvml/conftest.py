"""The nvml room: every test installs the simulated library in this process; it is uninstalled after each one."""

from support.simnode import uninstall_after  # noqa: F401  (an autouse fixture, registered by this import)
