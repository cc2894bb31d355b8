"""The testbed's layout by default and by ``--layout``, and what each simulated host of ``--hosts N`` has of its own
(no daemon started: the names, addresses, paths and flexmigd configuration of each host)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from flexmig.errors import SlurmError
from flexmig.mig.catalogue import model_by_key
from flexmig.slurm.testbed import Testbed as Bed
from flexmig.slurm.testbed_layout import choose_layout

OLD, NEW = "slurm-wlm 22.05.8", "slurm-wlm 24.11.5"


def test_by_default_the_testbed_runs_one_node_per_mig_instance_as_the_slurm_can_have_them() -> None:
    old = choose_layout("instance", OLD)
    assert (old.node_per_instance, old.static_nodes, old.node_per_gpu) == (True, True, False)
    assert "static" in old.line and "22.05.8" in old.line
    new = choose_layout("instance", NEW, hosts=4)
    assert (new.node_per_instance, new.static_nodes, new.node_per_gpu) == (True, False, False)
    assert "dynamic" in new.line and "24.11.5" in new.line


def test_a_layout_the_slurm_cannot_run_is_refused_naming_the_option() -> None:
    with pytest.raises(SlurmError, match=r"^--layout gpu: .*23\.11.*22\.05\.8"):
        choose_layout("gpu", OLD)
    with pytest.raises(SlurmError, match=r"^--layout node --hosts 2: .*SlurmdPort"):
        choose_layout("node", OLD, hosts=2)
    with pytest.raises(SlurmError, match=r"^--layout 'disk'"):
        choose_layout("disk", NEW)
    with pytest.raises(SlurmError, match="cannot read Slurm's version"):
        choose_layout("instance", "slurmd: error: no slurm.conf")
    assert choose_layout("gpu", NEW).node_per_gpu
    assert choose_layout("node", OLD).line.startswith("layout: one dynamic Slurm node per host")
    assert not choose_layout("node", NEW, hosts=2).node_per_instance


def test_each_host_has_its_name_address_files_and_flexmigd_configuration(tmp_path: Path) -> None:
    tb = Bed(tmp_path, model_by_key("h200"), 1, node="fm", hosts=2, node_per_instance=True, static_nodes=True,
                 gpu_port_base=20000, port_bases={1: 20100})  # fmt: skip
    assert [tb.host_node(h) for h in range(2)] == ["fm-h1", "fm-h2"]
    assert [tb.host_addr(h) for h in range(2)] == ["127.0.0.1", "127.0.0.2"]
    assert tb.host_paths(1).gres_conf == tmp_path / "hosts" / "h2" / "etc" / "gres.conf"
    names = tb.node_names()
    assert len(names) == 2 * (18 + 12) and names[0] == "fm-h1-gpu0-0-1g18gb" and "fm-h2-gpu0-0-7g141gb" in names
    assert names[-1] == "fm-h2-gpu0-x2-3g71gb"  # and each host's pool nodes (12 a GPU on an H200)
    conf = tomllib.loads(tb.flexmigd_config(metrics_port=9400, host=1))
    slurm = conf["slurm"]
    assert conf["node_name"] == slurm["node"] == "fm-h2"
    assert slurm["conf"] == str(tmp_path / "hosts" / "h2" / "etc" / "slurm.conf")
    assert slurm["slurmd_port_base"] == 20100 and slurm["instance_nodes"] == "static"
    assert slurm["checkpoint_dir"] == str(tmp_path / "ckpt" / "{user}" / "{job_id}")  # one tree for every host
    assert conf["control"]["socket"] == str(tmp_path / "hosts" / "h2" / "flexmig" / "control.sock")


def test_one_host_keeps_the_names_and_paths_of_a_single_node_testbed(tmp_path: Path) -> None:
    tb = Bed(tmp_path, model_by_key("h200"), 1, node="fm")
    assert tb.host_node() == "fm" and tb.host_paths().gres_conf == tb.paths.gres_conf
    conf = tomllib.loads(tb.flexmigd_config(metrics_port=9400))
    assert conf["slurm"]["slurmd_conf"] == "NodeAddr=127.0.0.1 CPUs=16"
    assert conf["slurm"]["gres_map"] == str(tb.paths.gres_map(""))
    with pytest.raises(SlurmError, match="--hosts 0: must be 1-16"):
        Bed(tmp_path, model_by_key("h200"), 1, hosts=0)
