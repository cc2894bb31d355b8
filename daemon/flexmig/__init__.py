"""flexmig: a node daemon for NVIDIA Multi-Instance GPU machines.

The layers, top to bottom (a subpackage or top-level module of ``flexmig`` each). A module imports from its own
layer and from the lines below its own, never from a sibling on its line or from a line above::

    flexmigd
    cli daemon actuatord
    simenv
    wiring
    service
    status
    metrics mqtt
    slurm
    act
    jobspec replay
    telemetry
    config
    nvml
    plan
    detect
    sim
    mig
    storage
    clocks hook security sdnotify signals tasks
    errors

Three rules more:

* only ``wiring`` and the faces (``cli``, ``daemon``, ``actuatord``, ``simenv``) import ``sim``: the simulated
  libnvidia-ml sits below pynvml, and the wiring alone chooses the real node or the simulated one, so no other layer
  knows which (``simenv`` is the process-level face: a whole process on a simulated node, from its environment);
* only ``nvml`` and ``sim`` import ``pynvml``;
* ``mig``, ``detect`` and ``plan`` are pure (no I/O, time passed in): of flexmig they import only each other, down
  the order, and ``errors``; of the rest, only standard-library modules without I/O or a clock.

``tests/repo/test_layers.py`` reads this table and holds every module to it, function-local imports included.
``docs/architecture.md`` shows it with what each layer holds, the daemon's components in the order they start, and
where a control operation is declared.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
