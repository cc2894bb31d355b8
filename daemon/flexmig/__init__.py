"""flexmig: a node daemon for NVIDIA Multi-Instance GPU machines.

Layers (imports point down only): cli/daemon -> export -> act -> plan -> detect -> telemetry -> nvml -> sim -> mig.
`mig`, `detect` and `plan` are pure: no I/O, time passed in. Only `nvml` imports pynvml.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
