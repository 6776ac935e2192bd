#!/usr/bin/env python3
"""Watch the gearshift bus from Python, following docs/protocol.md only.

Connects over AMQP (pika) or STOMP 1.2 (stomp.py; RabbitMQ or ActiveMQ, told
apart by the CONNECTED frame's `server` header), binds the given routing patterns
on the `gearshift` exchange (ActiveMQ: the `VirtualTopic.gearshift.` topics), verifies each message's Ed25519 signature against
the trusted public keys (with the `cryptography` package), and prints one JSON
line per message:

    {"routing_key": ..., "kind": ..., "from": ..., "verified": true|false,
     "reason": ..., "body": {...}}

Bodies are printed as received: a decision of a broker agent that leads among
several carries its leader `epoch` (docs/protocol.md section 11); of two
epochs, believe the higher one.

It first prints {"ready": true} once its bindings exist, and exits 0 when it
has seen every kind named with --want (or the first message when --want is
empty), or 1 on timeout.

Examples:
    gearshift_watch.py --amqp amqp://guest:guest@127.0.0.1:5672/%2f \\
        --bind 'report.#' --bind 'decision.#' --trust node:node.pub --trust broker:broker.pub \\
        --want report --want decision
    gearshift_watch.py --stomp 127.0.0.1:61613 --bind 'report.#' --want report
    gearshift_watch.py --bus "$(cat target/activemq/url)" --bind 'decision.#' --want decision
"""

import argparse
import base64
import datetime
import hashlib
import json
import sys
import threading
import time
import urllib.parse

# Roles that may sign each kind (docs/protocol.md, section 7).
ROLES = {
    "report": {"node"},
    "cmd.deactivate": {"broker", "operator"},
    "cmd.activate": {"broker", "operator"},
    "cmd.evacuate": {"broker", "operator"},
    "cmd.remove": {"broker", "operator"},
    "cmd.heat_signal": {"broker", "operator"},
    "cmd.inventory": {"broker", "operator"},
    "cmd.ping": {"broker", "operator", "client"},
    "event.ack": {"node"},
    "event.progress": {"node"},
    "event.done": {"node"},
    "event.failed": {"node"},
    "event.refused": {"node"},
    "pong": {"node", "broker"},
    "decision": {"broker"},
    "explain": {"broker"},
    "placement.request": {"client", "operator", "broker"},
    "placement.reply": {"broker"},
    "admin.request": {"operator", "broker"},
    "admin.reply": {"broker"},
}
WINDOW = datetime.timedelta(minutes=5)


def load_trusted(specs):
    """--trust role:path.pem -> {keyid: (role, public key)} (section 3)."""
    if not specs:
        return {}
    from cryptography.hazmat.primitives import serialization

    trusted = {}
    for spec in specs:
        role, path = spec.split(":", 1)
        with open(path, "rb") as f:
            key = serialization.load_pem_public_key(f.read())
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        trusted[hashlib.sha256(raw).hexdigest()[:16]] = (role, key)
    return trusted


def parse_ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


def verify(env, trusted):
    """Returns (verified, reason) following docs/protocol.md section 3."""
    env = dict(env)
    sig = env.pop("sig", None)
    if not sig:
        return False, "unsigned"
    try:
        alg, keyid, b64 = sig.split(":", 2)
    except ValueError:
        return False, "malformed_signature"
    if alg != "ed25519":
        return False, "malformed_signature"
    if keyid not in trusted:
        return False, "unknown_key"
    role, key = trusted[keyid]
    signed = json.dumps(env, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    try:
        key.verify(base64.b64decode(b64), signed)
    except Exception:  # cryptography raises InvalidSignature
        return False, "bad_signature"
    if role not in ROLES.get(env.get("kind"), set()):
        return False, "wrong_role"
    now = datetime.datetime.now(datetime.timezone.utc)
    if env.get("expires") and parse_ts(env["expires"]) <= now:
        return False, "expired"
    if abs(now - parse_ts(env["ts"])) > WINDOW:
        return False, "stale"
    return True, "ok"


class Watcher:
    def __init__(self, args):
        self.args = args
        self.trusted = load_trusted(args.trust)
        self.want = set(args.want)
        self.seen = set()
        self.done = threading.Event()
        self.lock = threading.Lock()

    def handle(self, routing_key, payload):
        try:
            env = json.loads(payload)
            if env.get("v") != 1:
                raise ValueError("not protocol v1")
        except Exception as e:  # a watcher never dies on a bad message
            out = {"routing_key": routing_key, "error": f"not a gearshift v1 envelope: {e}"}
            print(json.dumps(out), flush=True)
            return
        if self.trusted:
            ok, reason = verify(env, self.trusted)
        else:
            ok, reason = False, "no trusted keys given"
        out = {
            "routing_key": routing_key,
            "kind": env.get("kind"),
            "from": env.get("from"),
            "corr": env.get("corr"),
            "verified": ok,
            "reason": reason,
            "body": env.get("body"),
        }
        with self.lock:
            print(json.dumps(out, ensure_ascii=False), flush=True)
            if ok or not self.trusted:
                self.seen.add(env.get("kind"))
            if (self.want and self.want <= self.seen) or (not self.want and self.seen):
                self.done.set()


def run_amqp(w):
    import pika

    params = pika.URLParameters(w.args.amqp)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare("gearshift", exchange_type="topic", durable=True)
    q = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue
    for pattern in w.args.bind:
        ch.queue_bind(q, "gearshift", routing_key=pattern)

    def on_message(_ch, method, _props, body):
        w.handle(method.routing_key, body)

    ch.basic_consume(q, on_message, auto_ack=True)
    print(json.dumps({"ready": True, "transport": "amqp"}), flush=True)
    deadline = time.monotonic() + w.args.timeout
    while not w.done.is_set() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    conn.close()


def stomp_destinations(flavor):
    """(subscription destination of a pattern, routing key of a MESSAGE) per
    broker (docs/protocol.md, section 6)."""
    if flavor == "activemq":
        prefix = "/topic/VirtualTopic.gearshift."

        def dest(pattern):
            # `#` becomes `>` (only as the last word); `*` is the same.
            return prefix + (pattern[:-1] + ">" if pattern.endswith("#") else pattern)

        def key(headers):
            # A consumer queue's MESSAGE names the queue in `destination`;
            # the key is then in `original-destination`. Keys arrive as sent.
            orig = headers.get("original-destination", "")
            d = orig if orig.startswith(prefix) and "," not in orig else headers.get("destination", "")
            return d[len(prefix):] if d.startswith(prefix) else d

        return dest, key
    prefix = "/exchange/gearshift/"

    def key(headers):
        d = headers.get("destination", "")
        # RabbitMQ percent-encodes the routing key in MESSAGE destinations:
        # `%2E` in a key arrives as `%252E`.
        return urllib.parse.unquote(d[len(prefix):]) if d.startswith(prefix) else d

    return (lambda pattern: prefix + pattern), key


def run_stomp(w):
    import stomp

    a = w.args
    # STOMP 1.2, as gearshift speaks it; RabbitMQ reads `host` as its vhost,
    # ActiveMQ ignores it.
    conn = stomp.Connection12(
        [(a.stomp_host, a.stomp_port)], heartbeats=(10000, 10000), vhost=a.vhost
    )
    server = {}

    class Listener(stomp.ConnectionListener):
        def on_connected(self, frame):
            server["name"] = frame.headers.get("server", "")

        def on_message(self, frame):
            w.handle(key_of(frame.headers), frame.body)

    key_of = None
    conn.set_listener("watch", Listener())
    conn.connect(a.login, a.passcode, wait=True)
    # The broker names itself in CONNECTED: its flavor, unless --bus named one.
    detected = "activemq" if server.get("name", "").startswith("ActiveMQ") else "rabbitmq"
    flavor = a.flavor or detected
    if a.flavor and a.flavor != detected and server.get("name"):
        raise SystemExit(f"the bus URL says flavor={a.flavor} but the server is {server['name']}")
    dest_of, key_of = stomp_destinations(flavor)
    for i, pattern in enumerate(a.bind):
        # A receipt per SUBSCRIBE tells us the binding exists before we say "ready".
        receipt = f"sub-{i}"
        got = threading.Event()

        class R(stomp.ConnectionListener):
            def on_receipt(self, frame):
                if frame.headers.get("receipt-id") == receipt:
                    got.set()

        conn.set_listener(receipt, R())
        conn.subscribe(dest_of(pattern), id=str(i), ack="auto", headers={"receipt": receipt})
        if not got.wait(10):
            raise SystemExit(f"no RECEIPT for SUBSCRIBE {pattern}")
        conn.remove_listener(receipt)
    print(json.dumps({"ready": True, "transport": "stomp", "flavor": flavor}), flush=True)
    w.done.wait(a.timeout)
    conn.disconnect()


def apply_bus_url(args):
    """--bus URL (the agents' [bus] url) -> the transport's settings."""
    u = urllib.parse.urlsplit(args.bus)
    if u.scheme in ("amqp", "amqps"):
        args.amqp = args.bus
        return
    if u.scheme != "stomp":
        raise SystemExit(f"--bus: unsupported scheme {u.scheme!r} (amqp, amqps, stomp)")
    args.stomp_host, args.stomp_port = u.hostname or "127.0.0.1", u.port or 61613
    if u.username is not None:
        args.login = urllib.parse.unquote(u.username)
    if u.password is not None:
        args.passcode = urllib.parse.unquote(u.password)
    if u.path not in ("", "/"):
        args.vhost = urllib.parse.unquote(u.path[1:])
    flavor = urllib.parse.parse_qs(u.query).get("flavor", [None])[0]
    if flavor not in (None, "rabbitmq", "activemq"):
        raise SystemExit(f"--bus: unknown flavor {flavor!r} (rabbitmq or activemq)")
    args.flavor = flavor


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--bus", help="the agents' bus URL: amqp://user:pass@host:port/vhost or "
                   "stomp://user:pass@host:port[/vhost][?flavor=rabbitmq|activemq]")
    g.add_argument("--amqp", help="amqp://user:pass@host:port/vhost")
    g.add_argument("--stomp", help="host:port of a STOMP listener (RabbitMQ or ActiveMQ)")
    p.add_argument("--login", default="guest")
    p.add_argument("--passcode", default="guest")
    p.add_argument("--vhost", default="/")
    p.add_argument("--bind", action="append", default=[], help="routing pattern, repeatable")
    p.add_argument("--trust", action="append", default=[], help="role:path-to-public-key.pem, repeatable")
    p.add_argument("--want", action="append", default=[], help="exit once these kinds were seen verified")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    args.flavor = None
    if args.bus:
        apply_bus_url(args)
    elif args.stomp:
        host, port = args.stomp.rsplit(":", 1)
        args.stomp_host, args.stomp_port = host, int(port)
    if not args.bind:
        args.bind = ["report.#", "decision.#", "explain.#", "event.#"]
    w = Watcher(args)
    (run_amqp if args.amqp else run_stomp)(w)
    if not w.done.is_set():
        print(json.dumps({"timeout": True, "seen": sorted(w.seen)}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
