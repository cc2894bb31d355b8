"""The stdlib checkpoint hook: environment, signal flag, atomic acknowledgement, and the daemon's ack reader."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pytest import MonkeyPatch

from flexmig import hook
from flexmig.hook import Ack, AckError, HookEnv, atomic_write_json, atomic_writer, parse_signal, read_ack
from flexmig.hook.protocol import (
    ACK_MAX_BYTES,
    HANDOVER_MAX_BYTES,
    READY_LINE,
    HandoverError,
    decode_handover,
    encode_handover,
    first_step_path,
    read_first_step,
)


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "FLEXMIG_JOB": "train",
        "FLEXMIG_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "FLEXMIG_ACK_PATH": str(tmp_path / "ack.json"),
        **extra,
    }


def test_hook_env_reads_every_variable_of_the_protocol(tmp_path: Path) -> None:
    env = HookEnv.from_environ(
        env_for(
            tmp_path,
            FLEXMIG_RESUME=str(tmp_path / "ckpt/step-7.pt"),
            FLEXMIG_RESUME_STEP="7",
            FLEXMIG_CHECKPOINT_SIGNAL="SIGUSR2",
            RANK="3",
            WORLD_SIZE="4",
        )
    )
    assert env.job == "train"
    assert env.checkpoint_dir == tmp_path / "ckpt"
    assert env.ack_path == tmp_path / "ack.json"
    assert env.resume == tmp_path / "ckpt/step-7.pt" and env.resume_step == 7
    assert env.signal == signal.SIGUSR2
    assert (env.rank, env.world_size) == (3, 4)


def test_first_start_has_no_resume_point_and_defaults_to_sigusr1(tmp_path: Path) -> None:
    env = HookEnv.from_environ(env_for(tmp_path))
    assert env.resume is None and env.resume_step is None
    assert env.signal == signal.SIGUSR1 and env.rank == 0


def test_outside_flexmig_the_hook_writes_no_acknowledgement(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    h = hook.install({}, handler=False)
    assert h.job is None and h.env.ack_path is None
    h.acknowledge(5, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["SIGKILL", "SIGTERM", "9", "NOPE", ""])
def test_signals_the_daemon_keeps_for_itself_cannot_be_checkpoint_signals(bad: str) -> None:
    with pytest.raises(ValueError, match="is not one of"):
        parse_signal(bad)


@pytest.mark.parametrize("text", ["SIGUSR1", "usr1", "10", " SIGUSR1 "])
def test_checkpoint_signal_accepts_name_short_name_and_number(text: str) -> None:
    assert parse_signal(text) == signal.SIGUSR1


def test_a_malformed_hook_variable_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="FLEXMIG_CHECKPOINT_SIGNAL"):
        HookEnv.from_environ(env_for(tmp_path, FLEXMIG_CHECKPOINT_SIGNAL="SIGKILL"))
    with pytest.raises(ValueError, match="RANK"):
        HookEnv.from_environ(env_for(tmp_path, RANK="zero"))


def test_the_signal_handler_only_raises_the_flag(tmp_path: Path) -> None:
    h = hook.install(env_for(tmp_path))
    try:
        assert not h.should_checkpoint()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert h.should_checkpoint()
        assert h.should_checkpoint(), "the request stays until cleared"
        h.clear()
        assert not h.should_checkpoint()
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_rank_0_acknowledges_with_step_and_absolute_checkpoint_path(tmp_path: Path) -> None:
    h = hook.install(env_for(tmp_path), handler=False)
    h.acknowledge(41, tmp_path / "ckpt" / "step-41.pt")
    data = json.loads((tmp_path / "ack.json").read_text())
    assert data == {"step": 41, "checkpoint": str(tmp_path / "ckpt" / "step-41.pt")}
    assert read_ack(tmp_path / "ack.json") == Ack(41, str(tmp_path / "ckpt" / "step-41.pt"))


def test_other_ranks_never_write_the_acknowledgement(tmp_path: Path) -> None:
    h = hook.install(env_for(tmp_path, RANK="1", WORLD_SIZE="2"), handler=False)
    h.acknowledge(41, tmp_path / "x.pt")
    assert not (tmp_path / "ack.json").exists()


def test_atomic_write_leaves_no_temporary_file_and_replaces_the_old_content(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_write_json(target, {"v": 1})
    atomic_write_json(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert target.stat().st_mode & 0o777 == 0o600


def test_a_writer_that_fails_leaves_the_old_file_untouched(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"half a checkpoint")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_no_acknowledgement_yet_reads_as_none(tmp_path: Path) -> None:
    assert read_ack(tmp_path / "ack.json") is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"step": -1, "checkpoint": "/x"}', "non-negative"),
        (b'{"step": true, "checkpoint": "/x"}', "non-negative"),
        (b'{"step": 3}', "checkpoint"),
        (b'{"step": 3, "checkpoint": ""}', "checkpoint"),
    ],
)
def test_malformed_acknowledgements_are_refused_with_the_reason(tmp_path: Path, content: bytes, why: str) -> None:
    (tmp_path / "ack.json").write_bytes(content)
    with pytest.raises(AckError, match=why):
        read_ack(tmp_path / "ack.json")


def test_an_acknowledgement_that_is_a_symlink_is_refused_unread(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text('{"step": 1, "checkpoint": "/etc/shadow"}')
    (tmp_path / "ack.json").symlink_to(secret)
    with pytest.raises(AckError, match="symbolic link"):
        read_ack(tmp_path / "ack.json")


def test_an_oversized_acknowledgement_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ack.json").write_bytes(b" " * (ACK_MAX_BYTES + 1))
    with pytest.raises(AckError, match="larger than"):
        read_ack(tmp_path / "ack.json")


@pytest.mark.integration
def test_the_hook_module_needs_nothing_beyond_the_standard_library(tmp_path: Path) -> None:
    # A training script imports flexmig.hook in an environment without flexmig's dependencies: block them.
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"psutil", "pynvml", "torch", "prometheus_client", "aiomqtt", "rich"}:
                    raise ImportError("blocked " + name)
                return None
        sys.meta_path.insert(0, Block())
        from flexmig import hook
        h = hook.install({})
        print("ok", h.should_checkpoint())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok False"


# ------------------------------------------------------------------------------------------------- standby ranks
STANDBY_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import flexmig_hook as hook
    h = hook.install()
    print(json.dumps({"rank": h.rank, "world": h.env.world_size, "resume": str(h.resume), "step": h.env.resume_step,
                      "master": os.environ.get("MASTER_PORT"), "standby": h.from_standby,
                      "fd_left": "FLEXMIG_STANDBY_FD" in os.environ}))
    """
)


def _standby_child(tmp_path: Path) -> tuple[subprocess.Popen[str], socket.socket]:
    ours, theirs = socket.socketpair()
    env = {**os.environ, **env_for(tmp_path), "FLEXMIG_STANDBY_FD": str(theirs.fileno())}
    proc = subprocess.Popen(
        [sys.executable, "-c", STANDBY_CHILD], env=env, pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    theirs.close()
    ours.settimeout(60)
    return proc, ours


@pytest.mark.integration
def test_a_standby_rank_says_ready_and_install_returns_with_the_world_it_is_handed(tmp_path: Path) -> None:
    proc, chan = _standby_child(tmp_path)
    try:
        assert chan.recv(64) == READY_LINE, "the rank says it is ready once it reaches install()"
        world = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_PORT": "29512", "FLEXMIG_RESUME": "/c/step-7.pt",
                 "FLEXMIG_RESUME_STEP": "7"}  # fmt: skip
        chan.sendall(encode_handover(world))
        out, err = proc.communicate(timeout=60)
    finally:
        chan.close()
        proc.kill()
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got == {"rank": 1, "world": 3, "resume": "/c/step-7.pt", "step": 7, "master": "29512", "standby": True,
                   "fd_left": False}  # fmt: skip


@pytest.mark.integration
def test_a_standby_rank_whose_channel_closes_ends_without_running_the_job(tmp_path: Path) -> None:
    proc, chan = _standby_child(tmp_path)
    assert chan.recv(64) == READY_LINE
    chan.close()  # the move was cancelled, or the daemon died
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == ""
    assert "closed the channel before a handover" in err


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"env": {"LD_PRELOAD": "/tmp/x.so"}}', "LD_PRELOAD"),
        (b'{"env": {"RANK": 1}}', "string"),
        (b'{"env": []}', "'env' object"),
        (b"rank=1", "not JSON"),
        (b'{"env": {"RANK": "' + b"1" * HANDOVER_MAX_BYTES + b'"}}', "larger than"),
    ],
)
def test_a_handover_sets_only_the_world_and_the_checkpoint(data: bytes, why: str) -> None:
    with pytest.raises(HandoverError, match=why):
        decode_handover(data)


def test_the_daemon_never_encodes_a_handover_a_rank_would_refuse() -> None:
    with pytest.raises(HandoverError, match="PATH"):
        encode_handover({"PATH": "/tmp"})
    assert decode_handover(encode_handover({"RANK": "0"}).rstrip(b"\n")) == {"RANK": "0"}


@pytest.mark.integration
def test_exit_flushes_what_was_printed_and_skips_the_interpreters_teardown(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import atexit, sys
        import flexmig_hook as hook
        atexit.register(lambda: print("teardown ran"))
        h = hook.install({})
        sys.stdout.write("saved and acknowledged")
        h.exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout == "saved and acknowledged"


def test_the_acknowledgement_says_when_the_last_step_before_it_ended(tmp_path: Path) -> None:
    h = hook.install(env_for(tmp_path), handler=False)
    h.request()
    before = time.time()
    assert h.should_checkpoint()  # the step boundary at which the job sees the request
    after = time.time()
    h.acknowledge(7, tmp_path / "ckpt" / "step-7.pt")
    ack = read_ack(tmp_path / "ack.json")
    assert ack is not None and ack.step_done_s is not None and before <= ack.step_done_s <= after


def test_a_resumed_generation_reports_its_first_step_once_and_a_first_start_never(tmp_path: Path) -> None:
    report = first_step_path(tmp_path / "ack.json")
    first = hook.install(env_for(tmp_path, FLEXMIG_GENERATION="1"), handler=False)
    first.should_checkpoint()
    assert not report.exists(), "a first start resumes nothing: no move to measure"
    resumed = hook.install(
        env_for(tmp_path, FLEXMIG_GENERATION="3", FLEXMIG_RESUME=str(tmp_path / "c.pt")), handler=False
    )
    before = time.time()
    resumed.should_checkpoint()
    got = read_first_step(report)
    assert got is not None and got.generation == 3 and before <= got.step_done_s <= time.time()
    report.unlink()
    resumed.should_checkpoint()
    assert not report.exists(), "only the first step is reported"
    other = hook.install(
        env_for(tmp_path, FLEXMIG_GENERATION="3", FLEXMIG_RESUME=str(tmp_path / "c.pt"), RANK="1"), handler=False
    )
    other.should_checkpoint()
    assert not report.exists(), "rank 0 reports for the job"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"step": 1, "checkpoint": "/x", "step_done_s": "soon"}', "'step_done_s' must be a time"),
        (b'{"step": 1, "checkpoint": "/x", "step_done_s": -1}', "'step_done_s' must be a time"),
        (b'{"step": 1, "checkpoint": "/x", "step_done_s": 1e300}', "'step_done_s' must be a time"),
    ],
)
def test_a_bad_step_time_in_an_acknowledgement_is_refused(tmp_path: Path, content: bytes, why: str) -> None:
    (tmp_path / "ack.json").write_bytes(content)
    with pytest.raises(AckError, match=why):
        read_ack(tmp_path / "ack.json")


def test_a_first_step_report_is_read_within_the_acknowledgements_bounds(tmp_path: Path) -> None:
    p = tmp_path / "r"
    p.write_bytes(b'{"generation": true, "step_done_s": 5}')
    with pytest.raises(AckError, match="'generation' must be a non-negative integer"):
        read_first_step(p)
    p.write_bytes(b'{"generation": 2}')
    with pytest.raises(AckError, match="no 'step_done_s'"):
        read_first_step(p)
    p.unlink()
    p.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(AckError, match="symbolic link"):
        read_first_step(p)
    assert read_first_step(tmp_path / "none") is None


def test_acknowledging_prunes_the_older_checkpoints_of_the_series_beyond_keep(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for step in (1, 2, 3, 4, 9):
        for rank in (0, 1):
            (ckpt / f"rank{rank}-step{step:09d}.json").write_text("{}")
    (ckpt / "checkpoint-3").mkdir()
    (ckpt / "checkpoint-3" / "model.bin").write_text("x")
    (ckpt / "notes-1.txt").write_text("mine")
    h = hook.install(env_for(tmp_path, FLEXMIG_CHECKPOINT_KEEP="2"), handler=False)
    h.acknowledge(4, ckpt / "rank0-step000000004.json")
    left = sorted(p.name for p in ckpt.iterdir())
    assert left == sorted(
        [
            "checkpoint-3",  # another series
            "notes-1.txt",
            *[f"rank{r}-step{s:09d}.json" for s in (3, 4, 9) for r in (0, 1)],  # 4 acknowledged, 3 kept, 9 newer
        ]
    )
    for step in (5, 10):
        (ckpt / f"checkpoint-{step}").mkdir()
    h.acknowledge(10, ckpt / "checkpoint-10")
    assert not (ckpt / "checkpoint-3").exists(), "a directory of the series goes with its contents"
    assert (ckpt / "checkpoint-5").exists() and (ckpt / "checkpoint-10").exists(), "keep 2: the acked one, one more"
    unbounded = hook.install(env_for(tmp_path, FLEXMIG_CHECKPOINT_KEEP="0"), handler=False)
    unbounded.acknowledge(9, ckpt / "rank0-step000000009.json")
    assert (ckpt / "rank0-step000000003.json").exists(), "keep 0: every checkpoint stays"
