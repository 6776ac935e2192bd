#!/usr/bin/env python3
"""Watch the gearshift bus from Python, following docs/protocol.md only.

Connects over AMQP (pika) or STOMP (stomp.py), binds the given routing patterns
on the `gearshift` exchange, verifies each message's Ed25519 signature against
the trusted public keys (with the `cryptography` package), and prints one JSON
line per message:

    {"routing_key": ..., "kind": ..., "from": ..., "verified": true|false,
     "reason": ..., "body": {...}}

It first prints {"ready": true} once its bindings exist, and exits 0 when it
has seen every kind named with --want (or the first message when --want is
empty), or 1 on timeout.

Examples:
    gearshift_watch.py --amqp amqp://guest:guest@127.0.0.1:5672/%2f \\
        --bind 'report.#' --bind 'decision.#' --trust node:node.pub --trust broker:broker.pub \\
        --want report --want decision
    gearshift_watch.py --stomp 127.0.0.1:61613 --bind 'report.#' --want report
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


def run_stomp(w):
    import stomp

    host, port = w.args.stomp.rsplit(":", 1)
    conn = stomp.Connection([(host, int(port))], heartbeats=(10000, 10000))
    prefix = "/exchange/gearshift/"

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            dest = frame.headers.get("destination", "")
            # RabbitMQ percent-encodes the routing key in MESSAGE destinations
            # (docs/protocol.md, section 6): `%2E` in a key arrives as `%252E`.
            key = urllib.parse.unquote(dest[len(prefix):]) if dest.startswith(prefix) else dest
            w.handle(key, frame.body)

    conn.set_listener("watch", Listener())
    conn.connect(w.args.login, w.args.passcode, wait=True, headers={"host": w.args.vhost})
    for i, pattern in enumerate(w.args.bind):
        # A receipt per SUBSCRIBE tells us the binding exists before we say "ready".
        receipt = f"sub-{i}"
        got = threading.Event()

        class R(stomp.ConnectionListener):
            def on_receipt(self, frame):
                if frame.headers.get("receipt-id") == receipt:
                    got.set()

        conn.set_listener(receipt, R())
        conn.subscribe(prefix + pattern, id=str(i), ack="auto", headers={"receipt": receipt})
        if not got.wait(10):
            raise SystemExit(f"no RECEIPT for SUBSCRIBE {pattern}")
        conn.remove_listener(receipt)
    print(json.dumps({"ready": True, "transport": "stomp"}), flush=True)
    w.done.wait(w.args.timeout)
    conn.disconnect()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--amqp", help="amqp://user:pass@host:port/vhost")
    g.add_argument("--stomp", help="host:port of a RabbitMQ STOMP listener")
    p.add_argument("--login", default="guest")
    p.add_argument("--passcode", default="guest")
    p.add_argument("--vhost", default="/")
    p.add_argument("--bind", action="append", default=[], help="routing pattern, repeatable")
    p.add_argument("--trust", action="append", default=[], help="role:path-to-public-key.pem, repeatable")
    p.add_argument("--want", action="append", default=[], help="exit once these kinds were seen verified")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    if not args.bind:
        args.bind = ["report.#", "decision.#", "explain.#", "event.#"]
    w = Watcher(args)
    (run_amqp if args.amqp else run_stomp)(w)
    if not w.done.is_set():
        print(json.dumps({"timeout": True, "seen": sorted(w.seen)}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
