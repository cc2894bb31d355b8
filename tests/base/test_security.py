"""File-permission rules for configuration and credentials, and secrets that never show."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import pytest

from flexmig.errors import ConfigError
from flexmig.security import (
    RedactingFilter,
    Secret,
    attach_redaction,
    check_file_permissions,
    read_secret_file,
    redact,
)


def make(path: Path, content: str | bytes = "x\n", mode: int = 0o600) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o400, 0o444])
def test_config_files_that_only_the_owner_can_write_are_accepted(tmp_path: Path, mode: int) -> None:
    check_file_permissions(make(tmp_path / "c", mode=mode), "config")


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o664, 0o666, 0o777])
def test_config_files_that_group_or_others_can_write_are_refused(tmp_path: Path, mode: int) -> None:
    path = make(tmp_path / "c", mode=mode)
    with pytest.raises(ConfigError, match=rf"refused: mode {mode:04o} lets group or others write it \(chmod go-w"):
        check_file_permissions(path, "config")


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400, 0o440])
def test_secrets_readable_by_owner_and_group_only_are_accepted(tmp_path: Path, mode: int) -> None:
    check_file_permissions(make(tmp_path / "s", mode=mode), "secret")


@pytest.mark.parametrize("mode", [0o604, 0o644, 0o601, 0o602])
def test_secrets_others_can_reach_are_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(ConfigError, match=r"lets (others read a credential|group or others write)"):
        check_file_permissions(make(tmp_path / "s", mode=mode), "secret")


def test_files_owned_by_an_untrusted_user_are_refused(tmp_path: Path) -> None:
    path = make(tmp_path / "c")
    owner = os.stat(path).st_uid
    check_file_permissions(path, "config", trusted_uids={owner})
    with pytest.raises(ConfigError, match=rf"owned by uid {owner}, must be owned by uid 4242"):
        check_file_permissions(path, "config", trusted_uids={4242})


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away")
def test_a_file_given_to_another_user_is_refused_by_default(tmp_path: Path) -> None:
    path = make(tmp_path / "c")
    os.chown(path, 4242, 4242)
    with pytest.raises(ConfigError, match=r"owned by uid 4242"):
        check_file_permissions(path, "config")


def test_symlinks_are_judged_by_their_target(tmp_path: Path) -> None:
    target = make(tmp_path / "t", mode=0o666)
    link = tmp_path / "l"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match=r"lets group or others write"):
        check_file_permissions(link, "config")


def test_missing_files_and_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such file"):
        check_file_permissions(tmp_path / "none", "secret")
    with pytest.raises(ConfigError, match=r"not a regular file"):
        check_file_permissions(tmp_path, "config")


def test_read_secret_file_takes_the_first_line(tmp_path: Path) -> None:
    secret = read_secret_file(make(tmp_path / "pw", "p@ss word\r\nignored\n"))
    assert secret.reveal() == "p@ss word"


def test_read_secret_file_refuses_before_reading_a_file_others_can_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_secret_file(make(tmp_path / "pw", "topsecret\n", 0o644))
    assert "topsecret" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "credential file is empty"),
        ("\nsecond\n", "credential file is empty"),
        (b"\xff\xfe\n", "not UTF-8"),
        ("x" * 5000, "larger than 4096 bytes"),
    ],
)
def test_read_secret_file_refuses_unusable_content(tmp_path: Path, content: str | bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_secret_file(make(tmp_path / "pw", content))


def test_a_secret_never_shows_in_repr_str_or_format() -> None:
    s = Secret("hunter2")
    rendered = [repr(s), str(s), f"{s}", f"{s!r}", "%s" % s, f"{[s]}", repr({"password": s})]  # noqa: UP031
    assert all("hunter2" not in r for r in rendered)
    assert s.reveal() == "hunter2"
    assert s == Secret("hunter2")
    assert s != Secret("other")


def test_a_secret_cannot_be_pickled() -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(Secret("hunter2"))


def test_redact_replaces_every_occurrence_longest_first() -> None:
    assert redact("user=a pass=abc abc", [Secret("abc"), "ab", ""]) == "user=a pass=*** ***"


def test_the_logging_filter_scrubs_secrets_from_messages_and_arguments(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("flexmig.test.redact")
    secret = Secret("s3cr3t")
    filt = RedactingFilter([secret])
    logger.addFilter(filt)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            logger.info("connecting with password %s", secret.reveal())
            logger.info("url mqtt://u:s3cr3t@broker")
            logger.info("nothing to hide %d", 5)
    finally:
        logger.removeFilter(filt)
    assert [r.getMessage() for r in caplog.records] == [
        "connecting with password ***",
        "url mqtt://u:***@broker",
        "nothing to hide 5",
    ]
    assert "s3cr3t" not in caplog.text


def handler_output(filt: RedactingFilter | None, log: logging.Logger) -> tuple[logging.Handler, list[str]]:
    """A handler on ``log`` that formats each record (traceback included) into a list, with ``filt`` on it."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    if filt is not None:
        handler.addFilter(filt)
    log.addHandler(handler)
    return handler, lines


def test_the_logging_filter_scrubs_secrets_from_tracebacks_and_stacks() -> None:
    log = logging.getLogger("thirdparty.redact")
    log.propagate = False
    handler, lines = handler_output(RedactingFilter([Secret("s3cr3t")]), log)
    try:
        try:
            raise ConnectionError("login refused for password s3cr3t")
        except ConnectionError:
            log.exception("connect failed")
        log.warning("here", stack_info=True, extra={"unused": "s3cr3t"})
    finally:
        log.removeHandler(handler)
        log.propagate = True
    assert "ConnectionError: login refused for password ***" in lines[0]
    assert "s3cr3t" not in "\n".join(lines)


def test_a_broken_log_call_is_left_to_the_handler_not_raised_by_the_filter() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "two %s %s", ("one",), None)
    assert RedactingFilter([Secret("s3cr3t")]).filter(record) is True


def test_attach_redaction_covers_every_handler_of_the_logger_and_can_learn_new_secrets() -> None:
    log = logging.getLogger("flexmig.test.attach")
    log.propagate = False
    log.setLevel(logging.INFO)
    outputs = [handler_output(None, log) for _ in range(2)]
    try:
        filt = attach_redaction(log, [Secret("first")])
        log.info("first second")
        filt.update([Secret("second")])
        log.info("first second")
    finally:
        for handler, _lines in outputs:
            log.removeHandler(handler)
        log.propagate = True
    for _handler, lines in outputs:
        assert lines == ["flexmig.test.attach: *** second", "flexmig.test.attach: first ***"]
