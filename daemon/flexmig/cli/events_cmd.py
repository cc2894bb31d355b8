"""``flexmig events``: print a node's events live, from its MQTT broker, each event once.

Subscribes to ``flexmig/v1/<node>/events/#`` (all nodes by default) and to the nodes' ``status``; QoS 1
redeliveries are dropped by event ID. With ``--client-id`` the broker keeps a persistent session, so events
published while this command was disconnected are delivered when it reconnects.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from flexmig.detect.findings import finding_docs
from flexmig.mqtt.events import Event, format_time
from flexmig.mqtt.subscriber import SubscriberSettings, follow_events
from flexmig.tasks import cancel_and_wait

__all__ = ["register", "summary"]


def register(sub: Any) -> None:
    """Add the ``events`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "events", help="print MQTT events of flexmig nodes live", description=__doc__
    )
    p.add_argument("--broker", default="127.0.0.1:1883", metavar="HOST:PORT", help="MQTT broker (default %(default)s)")
    p.add_argument("--node", default="+", help="node name, or + for every node (default)")
    p.add_argument("--json", action="store_true", help="print each event as one JSON line, as published")
    p.add_argument("--prefix", default="flexmig/v1", help="topic prefix (default %(default)s)")
    p.add_argument("--client-id", help="persistent session under this MQTT client ID (the broker queues events)")
    p.add_argument("--username", help="broker user name")
    p.add_argument("--password-file", type=Path, help="file whose first line is the broker password")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--tls-ca", type=Path, help="CA bundle that signed the broker's certificate")
    p.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS)")
    p.add_argument("--tls-key", type=Path, help="client private key (mutual TLS)")
    p.add_argument("--count", type=int, metavar="N", help="exit after N events (status 1 if --timeout comes first)")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="exit after S seconds (status 1 if the broker was never reached)",
    )
    p.set_defaults(func=run)


def summary(event: Event) -> str:
    """One line for people: the reason when the event has one (with where docs/detection.md explains a finding's),
    else its main figures."""
    p = event.payload
    if isinstance(p.get("reason"), str):
        kind = event.kind.value
        if kind.startswith(("fragmentation_", "underuse_")):
            return f"{p['reason']} ({finding_docs(kind)})"
        return str(p["reason"])
    if "profile" in p:
        return f"{p.get('profile')} at GPU {p.get('gpu')} slice {p.get('start')} ({p.get('uuid') or 'no UUID yet'})"
    if "action" in p:
        extra = f": {p['error']}" if "error" in p else ""
        return f"{p.get('action')} {p.get('target')} after {p.get('duration_s')} s{extra}"
    return json.dumps(dict(p), separators=(",", ":"))


def run(args: argparse.Namespace) -> int:
    """Follow events until interrupted, ``--count`` events, or ``--timeout``."""
    settings = SubscriberSettings(
        broker=args.broker,
        node=args.node,
        topic_prefix=args.prefix,
        client_id=args.client_id,
        username=args.username,
        password_file=args.password_file,
        tls=args.tls or bool(args.tls_ca or args.tls_cert),
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    settings.address()  # a malformed --broker is an error now, not a retry loop
    settings.topics()
    return asyncio.run(_follow(settings, args))


async def _follow(settings: SubscriberSettings, args: argparse.Namespace) -> int:
    done = asyncio.Event()
    seen = 0
    reached = False
    failure: str | None = None

    def on_event(event: Event) -> None:
        nonlocal seen
        if args.json:
            print(event.to_json(), flush=True)
        else:
            print(f"{format_time(event.at)}  {event.node}  {event.kind.value:<20} {summary(event)}", flush=True)
        seen += 1
        if args.count is not None and seen >= args.count:
            done.set()

    def on_status(node: str, status: str) -> None:
        if not args.json:
            print(f"# {node} is {status}", flush=True)

    def on_problem(text: str) -> None:
        nonlocal failure
        if not reached and text.startswith("MQTT broker "):
            # Not reached yet: one line now, none again at the timeout (which then only sets the status).
            if failure is None:
                until = f" until --timeout {args.timeout:g} s" if args.timeout is not None else ""
                error = text.split(": ", 1)[-1].removesuffix("; reconnecting")
                line = f"cannot reach the MQTT broker {settings.broker}: {error}; retrying{until}"
                print(f"flexmig events: {line}", file=sys.stderr, flush=True)
            failure = text
            return
        print(f"flexmig events: {text}", file=sys.stderr, flush=True)

    def on_connected() -> None:
        nonlocal reached
        reached = True

    task = asyncio.create_task(
        follow_events(settings, on_event, on_status=on_status, on_problem=on_problem, on_connected=on_connected)
    )
    waiter = asyncio.create_task(done.wait())
    try:
        await asyncio.wait({task, waiter}, timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait((task, waiter))
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    if not reached:
        if failure is None:  # the timeout came before the first attempt had an answer
            print(
                f"flexmig events: the MQTT broker {settings.broker} did not answer within {args.timeout:g} s",
                file=sys.stderr,
            )
        return 1
    return 1 if args.count is not None and seen < args.count else 0
