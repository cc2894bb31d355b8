"""What a job's program really is: flexmig never runs a shell, nor ``env`` (which runs whatever it is told).

A name proves nothing: ``/home/alice/tool`` may be a symlink to ``/bin/bash``, ``rbash`` is bash under another name,
and a hard link to a shell has a name of its own. So a program is judged by its resolved target (every symlink
followed, relative ones against their own directory): refused when that target's name is a shell's or ``env``'s,
or when it is the very file (device and inode) of a shell this machine knows (the standard names in ``/bin``,
``/usr/bin`` and ``/usr/local/bin``, and every login shell in ``/etc/shells``). The check runs when a spec is read
and again right before each launch, which then executes the resolved file itself, so a link swapped in between
gains nothing.

A copy of a shell under another name is a different file and passes; it runs as the job's own user, with the
arguments of the spec, like any other program of that user's. Scripts (``#!/bin/sh``) are programs too: their text
is the job's code, not input that flexmig interprets.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SHELL_NAMES", "resolve_program", "runnable_program", "shell_reason"]

#: Names of shells and shell launchers, judged on the resolved program's own name.
SHELL_NAMES = frozenset(
    {
        "sh", "ash", "dash", "bash", "rbash", "zsh", "ksh", "ksh93", "mksh", "lksh", "pdksh", "oksh", "yash", "posh",
        "csh", "tcsh", "fish", "xonsh", "elvish", "nu", "busybox", "toybox", "env",
    }
)  # fmt: skip
_DIRS = ("/bin", "/usr/bin", "/usr/local/bin")
_ETC_SHELLS = Path("/etc/shells")


def resolve_program(program: str) -> str:
    """The file ``program`` (an absolute path) finally names, every symlink followed."""
    return os.path.realpath(program)


def _known_shell_files() -> dict[tuple[int, int], str]:
    """(device, inode) -> path of every shell this machine has, read afresh (shells get installed)."""
    paths = [str(Path(d) / n) for d in _DIRS for n in SHELL_NAMES]
    try:
        lines = _ETC_SHELLS.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    paths += [ln.strip() for ln in lines if ln.strip().startswith("/")]
    out: dict[tuple[int, int], str] = {}
    for p in paths:
        try:
            st = Path(p).stat()
        except OSError:
            continue
        out.setdefault((st.st_dev, st.st_ino), os.path.realpath(p))
    return out


def shell_reason(program: str) -> str | None:
    """Why ``program`` (an absolute path) must not run, or None: it resolves to a shell, or to ``env``.

    A program that does not exist is not judged here (running it fails with its own clear error).
    """
    return _judge(program, resolve_program(program))


def runnable_program(program: str) -> str:
    """The resolved file to execute for ``program``, judged as :func:`shell_reason` does; OSError if it is a
    shell. Resolving once and executing what was judged leaves no gap for a link to change in between."""
    real = resolve_program(program)
    why = _judge(program, real)
    if why is not None:
        raise OSError(why)
    return real


def _judge(program: str, real: str) -> str | None:
    shown = program if real == program else f"{program} (which is {real})"
    name = Path(real).name
    if name in SHELL_NAMES or name.rstrip("0123456789.") in SHELL_NAMES - {"env"}:
        what = "env, which runs any program" if name == "env" else "a shell"
        return f"program {shown} is {what}; flexmig never runs a shell"
    try:
        st = Path(real).stat()
    except OSError:
        return None
    same = _known_shell_files().get((st.st_dev, st.st_ino))
    if same is not None:
        what = "env, which runs any program" if Path(same).name == "env" else "a shell"
        return f"program {shown} is {what} (the same file as {same}); flexmig never runs a shell"
    return None
