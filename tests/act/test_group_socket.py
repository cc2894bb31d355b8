"""The control socket opened to a group (``[control] socket_mode = 0o660``), attacked by a member of that group: a
real user made with ``useradd`` in a group made with ``groupadd`` (both removed after) talks to the real control
server of the real actuator (on a simulated node) from processes of their own, under the system's Python.

Both tests failed on the code before issue #44's fixes: root read a root-only file named as a job spec and the
error answer held its values; 32 idle connections of the member locked everyone out, root's CLI included.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.act.control import ControlServer
from support.hostile import SYSTEM_PYTHON, Rig, base_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes a user and a group for the test")

SECRET = "hunter2xyzzy"

# A member's client: connect, send each argument as one request line, print each answer line.
ASK = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(30); s.connect(sys.argv[1]); f = s.makefile("rb")
for req in sys.argv[2:]:
    s.sendall(req.encode() + b"\\n")
    print(f.readline().decode().strip(), flush=True)
"""

# A member's attack: hold N connections that never send a request; say how many, then wait for stdin's end.
HOLD = """
import socket, sys
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); held.append(s)
print("holding", len(held), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def member() -> Iterator[tuple[pwd.struct_passwd, grp.struct_group]]:
    """A fresh group and an unprivileged user in it, removed after."""
    tag = uuid.uuid4().hex[:8]
    group, user = f"fmg{tag}", f"fmm{tag}"
    subprocess.run(["groupadd", "--system", group], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "-G", group, user],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        try:
            yield pwd.getpwnam(user), grp.getgrnam(group)
        finally:
            subprocess.run(["userdel", user], check=False, capture_output=True, timeout=60)
    finally:
        subprocess.run(["groupdel", group], check=False, capture_output=True, timeout=60)


@pytest.fixture
def base() -> Iterator[Path]:
    with base_dir() as d:
        yield d


def as_member(who: tuple[pwd.struct_passwd, grp.struct_group], script: str, *args: str) -> list[str]:
    user, group = who
    out = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", script, *args], user=user.pw_uid, group=user.pw_gid,
        extra_groups=[group.gr_gid], capture_output=True, text=True, timeout=60, check=True, cwd="/",
    )  # fmt: skip
    return str(out.stdout).splitlines()


async def group_socket(rig: Rig, group: grp.struct_group, **kw: object) -> ControlServer:
    server = ControlServer(rig.base / "control.sock", rig.act.jobs.handlers(), mode=0o660, **kw)  # type: ignore[arg-type]
    await server.start()
    os.chown(server.path, 0, group.gr_gid)
    return server


def spec_text(base: Path, name: str, user: str) -> str:
    return (
        f'name = "{name}"\nargv = ["/bin/sleep", "600"]\nuser = "{user}"\nworking_dir = "{base}"\n'
        f'checkpoint_dir = "{base}/{name}.ckpt"\n[need]\nprofile = "1g.18gb"\n'
    )


def submit(path: Path) -> str:
    return json.dumps({"op": "jobs.submit", "args": {"path": str(path)}})


@needs_root
def test_a_group_member_cannot_make_root_read_a_file_they_cannot_read_and_never_sees_its_contents(base: Path) -> None:
    async def scenario(who: tuple[pwd.struct_passwd, grp.struct_group]) -> None:
        user, group = who
        secret = base / "secret.toml"
        secret.write_text(f'name = "{SECRET} value"\n')
        secret.chmod(0o600)  # root's alone, in a root directory: every check of a spec file passes
        mine = base / "mine.toml"
        mine.write_text(spec_text(base, "theirs", user.pw_name))
        mine.chmod(0o644)
        async with Rig(base) as rig:
            server = await group_socket(rig, group)
            try:
                (denied,) = [json.loads(x) for x in await asyncio.to_thread(as_member, who, ASK, str(server.path),
                                                                              submit(secret))]  # fmt: skip
                assert not denied["ok"], denied
                assert SECRET not in denied["error"], f"root read the file for them: {denied['error']}"
                assert f"uid {user.pw_uid} cannot read this job spec" in denied["error"], denied
                (took,) = [json.loads(x) for x in await asyncio.to_thread(as_member, who, ASK, str(server.path),
                                                                            submit(mine))]  # fmt: skip
                assert took["ok"], f"a spec the member can read is taken as before: {took}"
                assert rig.record("theirs").state == "running"
            finally:
                await server.close()

    with member() as who:
        asyncio.run(scenario(who))


@needs_root
def test_idle_connections_of_a_group_member_never_lock_root_out_and_are_closed_after_the_first_request_bound(
    base: Path,
) -> None:
    async def scenario(who: tuple[pwd.struct_passwd, grp.struct_group]) -> None:
        async with Rig(base) as rig:
            server = await group_socket(rig, who[1], idle_timeout_s=2.0)
            user, group = who
            holder = await asyncio.create_subprocess_exec(
                SYSTEM_PYTHON, "-I", "-c", HOLD, str(server.path), "40", user=user.pw_uid, group=user.pw_gid,
                extra_groups=[group.gr_gid], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/",
            )  # fmt: skip
            try:
                assert holder.stdout is not None
                line = await asyncio.wait_for(holder.stdout.readline(), 60)
                assert line.strip() == b"holding 40", line
                await rig.until("the member's connections were taken", lambda: server._conns)
                reader, writer = await asyncio.open_unix_connection(str(server.path))  # root's CLI
                writer.write(b'{"op": "jobs.list"}\n')
                answer = json.loads(await asyncio.wait_for(reader.readline(), 30))
                writer.close()
                assert answer["ok"], f"root was locked out by idle connections: {answer}"
                assert sum(c.uid == user.pw_uid for c in server._conns.values()) <= 8
                # A connection that never sends a request is closed after the first-request bound.
                await rig.until("idle connections closed", lambda: not server._conns, timeout_s=30)
            finally:
                if holder.stdin is not None:
                    holder.stdin.close()
                await asyncio.wait_for(holder.wait(), 30)
                await server.close()

    with member() as who:
        asyncio.run(scenario(who))
