"""The default Slurm layout (``[slurm] layout = auto``), without daemons: Slurm's version x slurm.conf's instance
nodes -> the per-instance mode the node's Slurm supports, or one refusal line; the older switches stay explicit
choices, contradictions are configuration errors, and the per-node paths follow the chosen layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexmig.config import SlurmConfig
from flexmig.config.load import parse_config
from flexmig.errors import ConfigError, SlurmError
from flexmig.mig.catalogue import model_by_key
from flexmig.slurm.layout import SlurmLayout, choose_layout, declared_instance_nodes, with_layout
from flexmig.slurm.slots import slot_lines

H200 = model_by_key("h200")
STATIC = "\n".join(
    [
        "ClusterName=c",
        "SlurmdPidFile=/run/slurmd-%n.pid",
        *slot_lines("n1", H200, 2, port_base=6830, cpus_per_slice=8, hostname="n1", addr="n1"),
        "NodeName=other-gpu0-0-1g18gb State=FUTURE Gres=gpu:1g.18gb:1",
        "PartitionName=mig Nodes=ALL",
    ]
)


def choose(version: str, conf: str = "", cfg: SlurmConfig | None = None) -> SlurmLayout:
    slurm = cfg or SlurmConfig(enabled=True)
    return choose_layout(slurm, version, len(declared_instance_nodes(conf, "n1")), host="n1", conf="/etc/slurm.conf")


@pytest.mark.parametrize(
    ("version", "conf", "kind", "static"),
    [
        ("slurm-wlm 22.05.8", STATIC, "instance", True),  # 22.05 with this host's static lines
        ("slurm-wlm 24.11.5", STATIC, "instance", True),  # the administrator's static lines win on any version
        ("slurm-wlm 23.11.0", "", "instance", False),  # dynamic instance nodes from 23.11
        ("slurm-wlm 24.11.5", "NodeName=other-gpu0-0-1g18gb State=FUTURE\n", "instance", False),
        ("slurm 25.05.0-0rc1", "", "instance", False),
    ],
)
def test_auto_picks_the_per_instance_mode_the_slurm_supports(version: str, conf: str, kind: str, static: bool) -> None:
    layout = choose(version, conf)
    assert (layout.kind, layout.static) == (kind, static)
    assert "per MIG instance" in layout.line and version.rsplit(maxsplit=1)[-1] in layout.line
    assert "\n" not in layout.line


@pytest.mark.parametrize("version", ["slurm-wlm 22.05.8", "slurm-wlm 23.02.7", "", "garbage"])
def test_auto_refuses_in_one_line_what_cannot_work_naming_the_lines_and_the_command(version: str) -> None:
    other = "NodeName=other-gpu0-0-1g18gb State=FUTURE Gres=gpu:1g.18gb:1\nNodeName=n1 CPUs=8\n"
    with pytest.raises(SlurmError) as err:
        choose(version, other)
    line = str(err.value)
    assert "\n" not in line and line.startswith("[slurm] layout = auto: ")
    assert "/etc/slurm.conf declares none for n1" in line and "State=FUTURE NodeName= lines" in line
    assert "`flexmig slurm conf --node-per-instance --static --host n1 --model MODEL --gpus N`" in line
    assert 'layout = "node"' in line and line.endswith("nothing was changed")


def test_the_declared_instance_nodes_are_this_hosts_own_static_ones() -> None:
    names = declared_instance_nodes(STATIC, "n1")
    assert len(names) == len(slot_lines("n1", H200, 2, port_base=1, cpus_per_slice=1, hostname="n1", addr="n1"))
    assert "n1-gpu0-0-7g141gb" in names and "n1-gpu1-6-1g18gb" in names
    assert declared_instance_nodes(STATIC, "n") == ()  # another host whose name is a prefix
    assert declared_instance_nodes("# NodeName=n1-gpu0-0-1g18gb State=FUTURE\n", "n1") == ()  # a comment
    ranged = declared_instance_nodes("nodename=n1-gpu0-[0-1]-1g18gb State=FUTURE\n", "n1")
    assert ranged == ("n1-gpu0-0-1g18gb", "n1-gpu0-1-1g18gb")


@pytest.mark.parametrize(
    ("keys", "kind", "static"),
    [
        ("node_per_gpu = true", "gpu", False),
        ("node_per_instance = true", "instance", False),
        ('node_per_instance = true\ninstance_nodes = "static"', "instance", True),
        ('layout = "node"', "node", False),
        ('layout = "gpu"', "gpu", False),
        ('layout = "instance"\ninstance_nodes = "static"', "instance", True),
        ('layout = "gpu"\nnode_per_gpu = true', "gpu", False),
    ],
)
def test_explicit_choices_are_taken_as_they_are_on_22_05(keys: str, kind: str, static: bool) -> None:
    per_node = "" if "node\"" in keys else _per_node_paths()
    cfg = parse_config(f"[slurm]\nenabled = true\n{keys}\n{per_node}").slurm
    layout = choose("slurm-wlm 22.05.8", "", cfg)  # the version is for auto only (explicit ones check it later)
    assert (layout.kind, layout.static) == (kind, static)


def _per_node_paths() -> str:
    return (
        'slurmd_pid_file = "/run/slurmd-{node}.pid"\nslurmd_env = "/run/fm/slurmd-{node}.env"\n'
        'gres_map = "/run/fm/map-{node}.json"\nslurmd_unit = "slurmd@{node}.service"\n'
    )


@pytest.mark.parametrize(
    ("keys", "culprit"),
    [
        ('layout = "node"\nnode_per_gpu = true', "slurm.layout"),
        ('layout = "gpu"\nnode_per_instance = true', "slurm.layout"),
        ('layout = "node"\ninstance_nodes = "static"', "slurm.instance_nodes"),
        ('layout = "whole"', "slurm.layout"),
        ('layout = "auto"\nslurmd_conf = "Port=7000"', "slurm.slurmd_conf"),
    ],
)
def test_contradictions_are_configuration_errors_naming_the_key(keys: str, culprit: str) -> None:
    with pytest.raises(ConfigError, match=culprit.replace(".", r"\.")):
        parse_config(f"[slurm]\nenabled = true\n{keys}\n{_per_node_paths()}")


def test_the_default_paths_become_per_node_ones_for_an_instance_layout() -> None:
    cfg = SlurmConfig(enabled=True)
    static = with_layout(cfg, SlurmLayout("instance", True, "static"))
    assert (static.node_per_instance, static.instance_nodes, static.node_per_gpu) == (True, "static", False)
    assert static.slurmd_pid_file == Path("/run/slurmd-{node}.pid")  # SlurmdPidFile=/run/slurmd-%n.pid
    assert static.gres_map == Path("/run/flexmig/slurm/gres-map-{node}.json")  # the TaskProlog's --map
    assert static.slurmd_env == Path("/run/flexmig/slurm/slurmd-{node}.env")
    assert static.slurmd_unit == "slurmd-static@{node}.service"  # systemd/slurmd-static@.service
    assert with_layout(cfg, SlurmLayout("instance", False, "dynamic")).slurmd_unit == "slurmd@{node}.service"
    assert with_layout(cfg, SlurmLayout("node")) == SlurmConfig(enabled=True, layout="node")  # nothing else changes
    hook = SlurmConfig(enabled=True, slurmd_control="hook", slurmd_hook=("/bin/true",))
    assert with_layout(hook, SlurmLayout("instance", True)).slurmd_unit == "slurmd.service"  # not used with a hook


@pytest.mark.parametrize(
    ("cfg", "culprit"),
    [
        (SlurmConfig(enabled=True, slurmd_pid_file=Path("/var/run/slurmd.pid")), "slurmd_pid_file"),
        (SlurmConfig(enabled=True, slurmd_unit="my-slurmd.service"), "slurmd_unit"),
        (SlurmConfig(enabled=True, slurmd_conf="CPUs=8"), "slurmd_conf"),
    ],
)
def test_a_path_without_node_or_static_nodes_with_slurmd_conf_is_refused_in_one_line(
    cfg: SlurmConfig, culprit: str
) -> None:
    with pytest.raises(SlurmError) as err:
        with_layout(cfg, SlurmLayout("instance", True, "one static node of slurm.conf per MIG instance"))
    line = str(err.value)
    assert line.startswith(f"[slurm] {culprit}") and line.endswith("nothing was changed") and "\n" not in line
