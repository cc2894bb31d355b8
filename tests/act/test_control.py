"""The control socket: owner-only, JSON lines, validated and size-limited; and ``flexmig jobs`` over it."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from flexmig import sim
from flexmig.act.client import ControlClient, ControlError, ControlRequestError
from flexmig.act.control import MAX_JSON_DEPTH, ControlServer
from flexmig.act.events import MemorySink
from flexmig.act.service import Actuator
from flexmig.errors import ConfigError, PlanRejectedError
from flexmig.jobspec import JobPolicy
from flexmig.nvml import Nvml, NvmlWorker

pytestmark = pytest.mark.integration


async def echo(args: Mapping[str, Any]) -> Any:
    return {"echo": dict(args)}


async def boom(args: Mapping[str, Any]) -> Any:
    raise RuntimeError("handler bug")


async def refuse(args: Mapping[str, Any]) -> Any:
    raise PlanRejectedError("mode is 'observe'")


async def talk(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 20)
    out = []
    try:
        for line in lines:
            try:
                writer.write(line)
                await writer.drain()
            except ConnectionError:
                break  # the server hung up, as it does after refusing an oversized request
            answer = await asyncio.wait_for(reader.readline(), 10)
            if not answer:
                break
            out.append(json.loads(answer))
    finally:
        writer.close()
    return out


def serve(path: Path, scenario: Any, **kw: Any) -> Any:
    async def main() -> Any:
        server = ControlServer(path, {"echo": echo, "boom": boom, "refuse": refuse}, **kw)
        await server.start()
        try:
            return await scenario(server)
        finally:
            await server.close()

    return asyncio.run(main())


def test_the_socket_is_owner_only_and_removed_on_close(tmp_path: Path) -> None:
    path = tmp_path / "run" / "control.sock"

    async def scenario(server: ControlServer) -> None:
        st = path.stat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.geteuid()

    serve(path, scenario)
    assert not path.exists()


def test_requests_and_answers_are_json_lines_on_one_connection(tmp_path: Path) -> None:
    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        return await talk(
            server.path,
            b'{"op": "echo", "args": {"a": 1}}\n',
            b'{"op": "echo"}\n',
            b'{"op": "refuse"}\n',
        )

    answers = serve(tmp_path / "c.sock", scenario)
    assert answers[0] == {"ok": True, "result": {"echo": {"a": 1}}}
    assert answers[1] == {"ok": True, "result": {"echo": {}}}
    assert answers[2] == {"ok": False, "error": "mode is 'observe'", "type": "PlanRejectedError"}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"not json\n", "not JSON"),
        (b"[1]\n", "must be a JSON object"),
        (b'{"op": "rm -rf"}\n', "unknown operation 'rm -rf'"),
        (b'{"op": "echo", "args": [1]}\n', "'args' must be a JSON object"),
        (b'{"op": "echo", "cmd": "x"}\n', "unknown request fields: cmd"),
        (b"\xff\xfe\n", "not JSON"),
    ],
)
def test_malformed_requests_get_an_error_answer_and_the_server_keeps_serving(
    tmp_path: Path, line: bytes, why: str
) -> None:
    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        return await talk(server.path, line, b'{"op": "echo"}\n')

    bad, good = serve(tmp_path / "c.sock", scenario)
    assert bad["ok"] is False and why in bad["error"] and bad["type"] == "RequestError"
    assert good["ok"] is True


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 30_000])
def test_deeply_nested_json_gets_a_clear_error_answer_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    nested = b"[" * depth + b"]" * depth  # 30 000 levels: under the size limit, far past Python's recursion limit

    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        return await talk(server.path, b'{"op": "echo", "args": {"x": ' + nested + b"}}\n", b'{"op": "echo"}\n')

    with caplog.at_level("DEBUG"):
        bad, good = serve(tmp_path / "c.sock", scenario)
    assert bad == {
        "ok": False,
        "error": f"request nests deeper than {MAX_JSON_DEPTH} levels",
        "type": "RequestError",
    }
    assert good["ok"] is True, "the server keeps serving"
    assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"


def test_nesting_up_to_the_limit_is_accepted(tmp_path: Path) -> None:
    depth = MAX_JSON_DEPTH - 2  # the request object and its args are two levels
    nested = b"[" * depth + b"]" * depth

    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        return await talk(server.path, b'{"op": "echo", "args": {"x": ' + nested + b"}}\n")

    (answer,) = serve(tmp_path / "c.sock", scenario)
    assert answer["ok"] is True


def test_connections_beyond_the_cap_are_answered_and_closed_and_the_held_ones_keep_working(tmp_path: Path) -> None:
    async def scenario(server: ControlServer) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
        held = [await asyncio.open_unix_connection(str(server.path)) for _ in range(4)]
        while len(server._conns) < 4:  # noqa: ASYNC110 - polling the server's state is the point
            await asyncio.sleep(0.01)
        refused = await talk(server.path, b'{"op": "echo"}\n')
        reader, writer = held[0]
        writer.write(b'{"op": "echo"}\n')
        answers = [json.loads(await asyncio.wait_for(reader.readline(), 10))]
        for _, w in held:
            w.close()
        while server._conns:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        again = await talk(server.path, b'{"op": "echo"}\n')
        return refused, answers, again

    refused, answers, again = serve(tmp_path / "c.sock", scenario, max_connections=4)
    assert refused == [
        {"ok": False, "error": "too many connections to the control socket (4); try again", "type": "BusyError"}
    ]
    assert answers[0]["ok"] is True and again[0]["ok"] is True


def test_a_handler_bug_is_an_internal_error_answer_not_a_dead_socket(tmp_path: Path) -> None:
    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        return await talk(server.path, b'{"op": "boom"}\n', b'{"op": "echo"}\n')

    bad, good = serve(tmp_path / "c.sock", scenario)
    assert bad["type"] == "InternalError" and "handler bug" in bad["error"]
    assert good["ok"] is True


def test_an_oversized_request_is_refused_and_the_connection_closed(tmp_path: Path) -> None:
    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        big = b'{"op": "echo", "args": {"x": "' + b"a" * 5000 + b'"}}\n'
        return await talk(server.path, big, b'{"op": "echo"}\n')

    answers = serve(tmp_path / "c.sock", scenario, max_request_bytes=1024)
    assert answers == [{"ok": False, "error": "request longer than 1024 bytes", "type": "RequestError"}]


def test_a_stale_socket_is_replaced_but_a_live_one_or_a_file_is_not(tmp_path: Path) -> None:
    path = tmp_path / "c.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()

    async def scenario(server: ControlServer) -> None:
        with pytest.raises(ConfigError, match="another process is serving"):
            await ControlServer(path, {}).start()
        assert (await talk(path, b'{"op": "echo"}\n'))[0]["ok"]

    serve(path, scenario)
    other = tmp_path / "file"
    other.write_text("precious")
    with pytest.raises(ConfigError, match="not a socket"):
        asyncio.run(ControlServer(other, {}).start())
    assert other.read_text() == "precious"


def test_serve_runs_in_a_task_group_until_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "c.sock"

    async def main() -> None:
        ready = asyncio.Event()
        server = ControlServer(path, {"echo": echo})
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(server.serve(ready.set))
            await asyncio.wait_for(ready.wait(), 10)
            answer = await asyncio.to_thread(ControlClient(path, timeout_s=10).call, "echo", x=1)
            assert answer == {"echo": {"x": 1}}
            task.cancel()

    asyncio.run(main())
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_other_users_cannot_connect(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    path = tmp_path / "c.sock"
    code = (
        "import os, socket, sys\n"
        f"os.setgid({pwd.getpwnam('nobody').pw_gid}); os.setuid({pwd.getpwnam('nobody').pw_uid})\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({str(path)!r})\n"
        "except PermissionError:\n"
        "    sys.exit(13)\n"
    )

    async def scenario(server: ControlServer) -> int:
        proc = await asyncio.create_subprocess_exec("/usr/bin/python3", "-c", code)
        return await asyncio.wait_for(proc.wait(), 30)

    assert serve(path, scenario) == 13


def test_client_errors_carry_the_daemons_message(tmp_path: Path) -> None:
    async def scenario(server: ControlServer) -> None:
        client = ControlClient(server.path, timeout_s=10)
        with pytest.raises(ControlError, match="mode is 'observe'"):
            await asyncio.to_thread(client.call, "refuse")
        with pytest.raises(ControlRequestError, match="unknown operation"):
            await asyncio.to_thread(client.call, "nope")

    serve(tmp_path / "c.sock", scenario)
    with pytest.raises(ControlError, match="cannot reach the flexmig daemon"):
        ControlClient(tmp_path / "absent.sock").call("echo")


# --------------------------------------------------------------------------------- flexmig jobs (CLI)
def test_flexmig_jobs_talks_to_the_actuator_and_refuses_to_act_in_observe_mode(tmp_path: Path) -> None:
    async def cli(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(tmp_path / "c.sock"), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return int(proc.returncode or 0), out.decode()

    async def main() -> None:
        node = sim.install("h200:1g.18gb@0")
        nvml = Nvml.open()
        off = NvmlWorker()
        act = Actuator.build(
            mode="observe", nvml=nvml, offload=off.call, devices=sim.SimProcessTable(node),
            journal_path=tmp_path / "j.sqlite3", logs_dir=tmp_path / "logs", policy=JobPolicy((tmp_path,)),
            events=MemorySink(),
        )  # fmt: skip
        await act.start()
        server = act.control_server(tmp_path / "c.sock")
        await server.start()
        try:
            assert await cli("list") == (0, "no jobs\n")
            assert await cli("list", "--json") == (0, "[]\n")
            spec = tmp_path / "j.toml"
            spec.write_text('name = "j"\n')
            status, out = await cli("submit", str(spec))
            assert status == 1 and "mode is 'observe'" in out
            status, out = await cli("migrate", "nosuch")
            assert status == 2 and "no job named 'nosuch'" in out
            status, out = await cli("resplit", "nosuch", "--ranks", "2")
            assert status == 2 and "no job named 'nosuch'" in out
        finally:
            await server.close()
            await act.close()
            off.shutdown()
            nvml.close()
            sim.uninstall()

    asyncio.run(main())


def test_jobs_submit_refuses_a_fifo_a_proc_file_and_a_huge_file_unread_and_keeps_serving(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo, 0o644)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"")
    huge.chmod(0o644)
    os.truncate(huge, 1 << 40)  # sparse: a terabyte by its size, nothing on disk
    proc_file = Path(f"/proc/{os.getpid()}/status")

    async def main() -> list[str]:
        node = sim.install("h200:1g.18gb@0")
        nvml = Nvml.open()
        off = NvmlWorker()
        act = Actuator.build(
            mode="advise", nvml=nvml, offload=off.call, devices=sim.SimProcessTable(node),
            journal_path=tmp_path / "j.sqlite3", logs_dir=tmp_path / "logs", policy=JobPolicy((tmp_path,)),
            events=MemorySink(),
        )  # fmt: skip
        await act.start()
        server = act.control_server(tmp_path / "c.sock")
        await server.start()
        client = ControlClient(server.path, timeout_s=10)
        errors = []
        try:
            for path in (fifo, huge, proc_file):
                with pytest.raises(ControlError) as info:
                    await asyncio.to_thread(client.call, "jobs.submit", path=str(path))
                errors.append(str(info.value))
            assert await asyncio.to_thread(client.call, "jobs.list") == []  # still serving
        finally:
            await server.close()
            await act.close()
            off.shutdown()
            nvml.close()
            sim.uninstall()
        return errors

    fifo_error, huge_error, proc_error = asyncio.run(main())
    assert fifo_error.startswith(f"{fifo}: ") and "not a regular file" in fifo_error
    assert huge_error == f"{huge}: job spec larger than 65536 bytes (1099511627776 bytes)"
    assert proc_error.startswith(f"{proc_file}: refused: holds other than the 0 bytes")


def test_a_request_naming_a_key_twice_is_refused_naming_the_key_and_runs_nothing(tmp_path: Path) -> None:
    """JSON parsers disagree on which of two equal keys wins (Python's takes the last): a request that says
    ``"name"`` twice could mean one job to a checker and another to the handler, so it is refused."""
    calls: list[Mapping[str, Any]] = []

    async def record(args: Mapping[str, Any]) -> Any:
        calls.append(args)
        return {}

    async def scenario(server: ControlServer) -> list[dict[str, Any]]:
        server.add("jobs.stop", record)
        return await talk(
            server.path,
            b'{"op": "jobs.stop", "args": {"name": "theirs", "name": "mine"}}\n',
            b'{"op": "jobs.stop", "op": "echo", "args": {}}\n',
        )

    twice, op_twice = serve(tmp_path / "c.sock", scenario)
    assert twice["ok"] is False and twice["type"] == "RequestError", twice
    assert "key 'name' appears twice" in twice["error"], twice
    assert "key 'op' appears twice" in op_twice["error"], op_twice
    assert calls == [], "nothing ran"
