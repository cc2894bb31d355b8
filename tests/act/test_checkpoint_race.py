"""A job's user races the daemon for its checkpoint directory, and never makes root change another file.

The attack of issue #19: the job acknowledges its checkpoint, removes its checkpoint directory and exits, so that the
daemon makes the directory again for the next generation; meanwhile a racer of the same user swaps a symlink to a
root-owned file in and out of that name with ``renameat2(RENAME_EXCHANGE)`` in a tight loop. The daemon used to
``mkdir`` and then ``chown`` by name, and the ``chown`` followed the symlink: the user won root's file almost every
time. Here the real actuator runs real migrations of a real job of a user made for the test, with the racer (a small
Python program of that user's, through libc) running during each one, and the file must stay root's every time.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.hostile import SYSTEM_PYTHON, Rig, base_dir, scratch_user

pytestmark = [
    pytest.mark.integration,
    pytest.mark.fault,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attack is on root's files, by a user it makes"),
]

ROUNDS = 12
RACERS = 2  # two of them: on a loaded machine one may not be running when the daemon's window opens

RACER = r"""
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
stop = False
def done(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
while not stop and os.path.lexists("ckpt"):  # the job removes its directory once the daemon has read its ack
    pass
swaps = 0
deadline = time.monotonic() + 60
while not stop and time.monotonic() < deadline:
    if libc.renameat2(AT_FDCWD, b"ckpt", AT_FDCWD, b"swap", RENAME_EXCHANGE) == 0:
        swaps += 1
print(swaps, flush=True)
"""


@pytest.fixture
def user() -> Iterator[pwd.struct_passwd]:
    with scratch_user("fmr") as u:
        yield u


def owner(path: Path) -> int:
    return os.lstat(path).st_uid


def reset(work: Path, victim: Path) -> None:
    """The battlefield for one round: no checkpoint directory yet, the racer's symlink to root's file beside it."""
    for name in ("ckpt", "swap"):
        p = work / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            for q in p.iterdir():
                q.unlink()
            p.rmdir()
    (work / "swap").symlink_to(victim)


def test_a_symlink_racer_never_makes_root_hand_over_another_file_during_real_migrations(
    user: pwd.struct_passwd,
) -> None:
    with base_dir("fm-race-") as base:
        victim = base / "victim"
        victim.write_text("root's own file\n")
        victim.chmod(0o600)
        work = base / "work"
        work.mkdir()
        os.chown(work, user.pw_uid, user.pw_gid)
        (base / "racer.py").write_text(RACER)
        (base / "racer.py").chmod(0o644)
        results = asyncio.run(_rounds(base, work, victim, user))
    wins = [r for r in results if r[0] != 0]
    swaps = sum(r[1] for r in results)
    assert swaps > 0, f"the racer never swapped: the race did not take place ({results})"
    assert not wins, f"the racer made root hand over its file in {len(wins)} of {ROUNDS} migrations: {results}"


async def _racer(base: Path, work: Path, user: pwd.struct_passwd) -> asyncio.subprocess.Process:
    """One racer, as the job's user, in the job's directory."""
    return await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON, str(base / "racer.py"),
        cwd=work, user=user.pw_uid, group=user.pw_gid, extra_groups=[], stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _rounds(base: Path, work: Path, victim: Path, user: pwd.struct_passwd) -> list[tuple[int, int]]:
    results: list[tuple[int, int]] = []
    async with Rig(base) as rig:
        for _ in range(ROUNDS):
            reset(work, victim)
            spec = rig.hostile("ack-and-rmdir", user=user.pw_name, work=work, checkpoint_dir=work / "ckpt")
            answer = await rig.call("jobs.submit", path=str(spec))
            assert answer["ok"], answer
            await rig.until("the job runs", lambda: len(rig.alive()) == 1)
            racers = [await _racer(base, work, user) for _ in range(RACERS)]
            out = ""
            try:
                for racer in racers:
                    assert racer.stdout is not None
                    assert (await asyncio.wait_for(racer.stdout.readline(), 30)).strip() == b"ready"
                await rig.call("jobs.migrate", name="evil")  # moved, rolled back or failed: the file is what counts
            finally:
                for racer in racers:
                    racer.send_signal(signal.SIGTERM)
                for racer in racers:
                    out += " " + (await asyncio.wait_for(racer.communicate(), 30))[0].decode()
            results.append((owner(victim), sum(int(w) for w in out.split() if w.isdigit())))
            if owner(victim) != 0:  # the attack won: give the file back to root for the next round
                os.chown(victim, 0, 0)
            assert stat.S_IMODE(os.lstat(victim).st_mode) == 0o600
            rec = rig.record()
            if rec is not None and rec.state == "running":
                await rig.call("jobs.stop", name="evil", force=True)
    return results


def test_a_symlink_put_above_the_checkpoint_directory_never_makes_root_make_one_where_it_points(
    user: pwd.struct_passwd,
) -> None:
    """The same attack without a race: the job swaps its checkpoint directory's parent for a symlink to a root-owned
    directory. A daemon that makes the path by name (``mkdir(parents=True)``, then ``chown``) makes the next
    checkpoint directory inside root's directory and gives it to the user, every time."""
    with base_dir("fm-parent-") as base:
        guarded = base / "root-only"
        guarded.mkdir()
        work = base / "work"
        (work / "a").mkdir(parents=True)
        for d in (work, work / "a"):
            os.chown(d, user.pw_uid, user.pw_gid)

        async def scenario() -> dict[str, object]:
            async with Rig(base) as rig:
                ckpt = work / "a" / "ckpt"
                spec = rig.hostile(
                    "ack-and-swap-parent", str(guarded), user=user.pw_name, work=work, checkpoint_dir=ckpt
                )
                assert (await rig.call("jobs.submit", path=str(spec)))["ok"]
                answer: dict[str, object] = await rig.call("jobs.migrate", name="evil")
                return answer

        answer = asyncio.run(scenario())
        assert list(guarded.iterdir()) == [], f"root made {list(guarded.iterdir())} for the job's user ({answer})"
        assert owner(guarded) == 0
