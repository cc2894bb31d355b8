"""``flexmig.hook.protocol``: :mod:`flexmig_hook.protocol` (the protocol's names and acknowledgement) under the
daemon package's name."""

from __future__ import annotations

from flexmig_hook.protocol import (
    ACK_MAX_BYTES,
    ACK_MAX_PATH,
    ACK_MAX_STEP,
    ALLOWED_SIGNALS,
    ENV_ACK_PATH,
    ENV_ACK_WAIT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_SIGNAL,
    ENV_DIST_BACKEND,
    ENV_GENERATION,
    ENV_JOB,
    ENV_JOB_ID,
    ENV_RESUME,
    ENV_RESUME_STEP,
    ENV_SLOT,
    Ack,
    AckError,
    parse_signal,
    read_ack,
)

__all__ = [
    "ACK_MAX_BYTES",
    "ACK_MAX_PATH",
    "ACK_MAX_STEP",
    "ALLOWED_SIGNALS",
    "ENV_ACK_PATH",
    "ENV_ACK_WAIT",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_SIGNAL",
    "ENV_DIST_BACKEND",
    "ENV_GENERATION",
    "ENV_JOB",
    "ENV_JOB_ID",
    "ENV_RESUME",
    "ENV_RESUME_STEP",
    "ENV_SLOT",
    "Ack",
    "AckError",
    "parse_signal",
    "read_ack",
]
