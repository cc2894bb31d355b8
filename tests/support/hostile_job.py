"""A job that misbehaves on purpose, as a job's user could (not a test module; run by tests as a rank).

``hostile_job.py MODE [ARG]``, standard library only (it runs as an unprivileged user under /usr/bin/python3). It
steps a counter and answers the checkpoint signal (``FLEXMIG_CHECKPOINT_SIGNAL``) as MODE says:

* ``ack-bytes FILE``: acknowledge with the raw bytes of FILE, and keep running;
* ``ack-bytes-exit FILE``: write them as its acknowledgement, then exit 0 on its own (no request needed);
* ``ack-then-dir``: checkpoint and acknowledge properly; when asked again (the daemon re-asks ranks that have not
  exited), put a directory where the acknowledgement was, then exit 0;
* ``finish``: exit 0 when asked, without acknowledging (its work was done);
* ``stray``: first start a child that leaves the process group (``setsid``) and sleeps, writing its pid to
  ``$FLEXMIG_CHECKPOINT_DIR/../stray.pid``; then checkpoint and acknowledge properly when asked, and exit 0;
* ``stray-clean``: the same, but the child then runs ``/bin/sleep`` with an empty environment (no job markers
  left to find it by);
* ``handoff SOCKET``: hand its standard output and error (its log pipe) to the process listening on the Unix socket
  SOCKET (``SCM_RIGHTS``), as any process may to another of its user's, then behave as ``finish``;
* ``mute-standby``: started as a standby rank (``FLEXMIG_STANDBY_FD``), never say ready nor read the world, and
  sleep; as an ordinary rank, checkpoint and acknowledge when asked, and exit 0;
* ``ack-and-rmdir``: checkpoint and acknowledge; when asked again (the acknowledgement has been read), remove its
  checkpoint directory and exit 0, so that the daemon makes it again for the next generation (the race test's job);
* ``ack-and-swap-parent TARGET``: the same, and then it also puts a symlink to TARGET in place of the checkpoint
  directory's parent (its own directory), so that a daemon that follows links makes the next checkpoint directory
  inside TARGET, and hands it over.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

asked = 0


def on_signal(_sig: int, _frame: object) -> None:
    global asked  # noqa: PLW0603 - a signal handler has nowhere else to leave its mark
    asked += 1


def checkpoint(step: int) -> None:
    ckpt = Path(os.environ["FLEXMIG_CHECKPOINT_DIR"]) / f"step-{step}.ckpt"
    ckpt.write_text(json.dumps({"step": step}))
    ack = Path(os.environ["FLEXMIG_ACK_PATH"])
    tmp = ack.with_name(ack.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, "checkpoint": str(ckpt)}))
    tmp.replace(ack)


def main() -> int:
    mode = sys.argv[1]
    sig = signal.Signals[os.environ.get("FLEXMIG_CHECKPOINT_SIGNAL", "SIGUSR1")]
    signal.signal(sig, on_signal)
    ack = Path(os.environ["FLEXMIG_ACK_PATH"])
    if mode == "ack-bytes-exit":
        ack.write_bytes(Path(sys.argv[2]).read_bytes())
        return 0
    if mode == "mute-standby":
        if "FLEXMIG_STANDBY_FD" in os.environ:
            while True:
                signal.pause()
        mode = "ack-exit"
    if mode == "handoff":
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sys.argv[2])
            socket.send_fds(s, [b"fds"], [1, 2])
        mode = "finish"
    if mode in ("stray", "stray-clean"):
        pid = os.fork()
        if pid == 0:
            os.setsid()
            out = Path(os.environ["FLEXMIG_CHECKPOINT_DIR"]).parent / "stray.pid"
            (tmp := out.with_suffix(".tmp")).write_text(str(os.getpid()))
            tmp.rename(out)  # whole: the test reads it as soon as it exists
            if mode == "stray-clean":
                os.execve("/bin/sleep", ["sleep", "600"], {})
            while True:  # lingers until the job is stopped (SIGKILL), as an escaped child does
                signal.pause()
    step = 0
    answered = 0
    while True:
        step += 1
        time.sleep(0.01)
        if asked == answered:
            continue
        answered = asked
        if mode == "ack-bytes":
            ack.write_bytes(Path(sys.argv[2]).read_bytes())
        elif mode == "finish":
            return 0
        elif mode == "ack-then-dir":
            if answered == 1:
                checkpoint(step)
                continue
            ack.rename(ack.with_name("moved-away.json"))
            ack.mkdir()
            return 0
        elif mode in ("ack-and-rmdir", "ack-and-swap-parent"):
            if answered == 1:
                checkpoint(step)
                continue
            ckpt = Path(os.environ["FLEXMIG_CHECKPOINT_DIR"])
            for p in ckpt.iterdir():
                p.unlink()
            ckpt.rmdir()
            if mode == "ack-and-swap-parent":
                ckpt.parent.rename(ckpt.parent.with_name(ckpt.parent.name + ".old"))
                ckpt.parent.symlink_to(sys.argv[2])
            return 0
        elif mode in ("stray", "stray-clean", "ack-exit"):
            checkpoint(step)
            return 0


if __name__ == "__main__":
    sys.exit(main())
