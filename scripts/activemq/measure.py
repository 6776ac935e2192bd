#!/usr/bin/env python3
"""Measures what a STOMP client needs to know to run gearshift on ActiveMQ Classic.

Runs against the private broker of scripts/setup-activemq (start it first) and
prints one line per fact; docs/activemq.md is written from this output.

    scripts/activemq/measure.py                 # everything but the slow parts
    scripts/activemq/measure.py --all           # + heart-beat timing (~90 s),
                                                #   pre-created queues (second broker),
                                                #   a broker restart
    scripts/activemq/measure.py connect acks    # only these sections

Every destination carries a fresh random word, so runs do not see each other.
"""

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stomp_raw import Closed, Conn, credentials, open_conn, port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(ROOT, "scripts", "setup-activemq")


def out(section, text):
    print("%-10s %s" % (section, text), flush=True)


def word():
    return uuid.uuid4().hex[:8]


def send(conn, dest, body, **headers):
    """SEND with a receipt; returns the answer frame."""
    conn.send(dest, body, receipt="r-" + word(), **headers)
    return conn.recv(5, want=("RECEIPT", "ERROR"))


def sub(conn, dest, sub_id, ack="auto", extra=()):
    conn.subscribe(dest, sub_id, ack=ack, extra=list(extra) + [("receipt", "s-" + sub_id)])
    f = conn.recv(5, want="RECEIPT")
    assert f is not None, "no RECEIPT for SUBSCRIBE %s" % dest
    return f


def bodies(frames):
    return [f.body.decode() for f in frames]


def frame_summary(f):
    if f is None:
        return "nothing"
    return "%s %s body=%r" % (f.command, f.headers, f.body[:120])


# ---------------------------------------------------------------------------
def s_connect():
    login, pw = credentials()

    def attempt(**kw):
        c = Conn(port())
        try:
            f = c.connect(**kw)
        except Closed:
            return "closed without a frame"
        closed = c.wait_closed(1.5) if f is not None and f.command == "ERROR" else None
        c.close()
        if f is None:
            return "no answer"
        what = "%s %s" % (f.command, {k: v for k, v in f.headers.items() if k != "session"})
        if f.command == "ERROR":
            what += " body=%r" % f.body[:80]
            what += "; connection closed" if closed is not None else "; connection open"
        return what

    for label, kw in [
        ("host:localhost", dict(host="localhost")),
        ("host:gearshift-test (brokerName)", dict(host="gearshift-test")),
        ("host:/ (RabbitMQ's vhost)", dict(host="/")),
        ("host:no.such.vhost", dict(host="no.such.vhost")),
        ("no host header", dict(host=None)),
        ("no accept-version", dict(version=None)),
        ("accept-version:1.0,1.1", dict(version="1.0,1.1")),
        ("accept-version:1.3", dict(version="1.3")),
        ("heart-beat:1000,1000", dict(heart_beat="1000,1000")),
        ("heart-beat:0,500", dict(heart_beat="0,500")),
        ("heart-beat:500,0", dict(heart_beat="500,0")),
    ]:
        out("connect", "%s -> %s" % (label, attempt(login=login, passcode=pw, **kw)))
    out("connect", "wrong password -> %s" % attempt(login=login, passcode="wrong"))
    out("connect", "no login -> %s" % attempt(login=None, passcode=None))
    c = open_conn(extra=[("client-id", "cid-" + word())])
    out("connect", "client-id:X -> session header = %s" % c.connected.headers["session"])
    c.disconnect()


# ---------------------------------------------------------------------------
def _beats(period_ms, secs, client_every):
    c = Conn(port())
    login, pw = credentials()
    f = c.connect(login, pw, heart_beat="%d,%d" % (period_ms, period_ms))
    t0 = f.at
    nxt = t0 + client_every if client_every else None
    last = t0
    closed = None
    end = t0 + secs
    while time.monotonic() < end:
        wait = end - time.monotonic()
        if nxt:
            wait = min(wait, max(0.0, nxt - time.monotonic()))
        try:
            c.recv(wait)
        except Closed:
            closed = c.closed_at
            break
        if nxt and time.monotonic() >= nxt:
            c.beat()
            last = time.monotonic()
            nxt += client_every
    c.close()
    b = [x - t0 for x in c.beats]
    gaps = [y - x for x, y in zip(b, b[1:])]
    return b, gaps, (closed - t0 if closed else None), (closed - last if closed else None)


def s_heartbeat():
    for p in (500, 1000, 2000):
        b, gaps, closed, _ = _beats(p, 6 * p / 1000 + 0.2, p / 1000)
        out("heartbeat", "period %d ms, client beats every period: broker's first beat %.3f s "
            "after CONNECTED, then every %.3f-%.3f s (%d beats); dropped: %s"
            % (p, b[0], min(gaps), max(gaps), len(b), closed))
    for p in (500, 1000, 2000):
        b, _, closed, _ = _beats(p, 5 * p / 1000, 0)
        out("heartbeat", "period %d ms, silent client: dropped %.3f s after CONNECTED (%.2f periods)"
            % (p, closed, closed / (p / 1000)))
    # Beats for a while, then silence: time from the last byte to the drop.
    for phase in (0.0, 0.5):
        c = Conn(port())
        login, pw = credentials()
        t0 = c.connect(login, pw, heart_beat="1000,1000").at
        nxt, last = t0 + 1.0, t0
        try:
            while time.monotonic() < t0 + 4 + phase:
                c.recv(max(0.0, min(nxt, t0 + 4 + phase) - time.monotonic()))
                if time.monotonic() >= nxt:
                    c.beat()
                    last = time.monotonic()
                    nxt += 1.0
            gone = c.wait_closed(6)
            out("heartbeat", "period 1000 ms, beats for %.1f s then silence: dropped %.3f s after the "
                "client's last byte" % (4 + phase, c.closed_at - last if gone is not None else -1))
        except Closed:
            out("heartbeat", "dropped while beating")
        c.close()
    res = {}

    def slow(every):
        _, _, closed, _ = _beats(1000, 20, every)
        res[every] = "dropped at %.3f s" % closed if closed else "kept for 20 s"

    threads = [threading.Thread(target=slow, args=(e,)) for e in (1.05, 1.1, 1.2, 1.3, 1.5, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in sorted(res):
        out("heartbeat", "period 1000 ms, client beats every %.2f s: %s" % (e, res[e]))


# ---------------------------------------------------------------------------
def s_virtual():
    u = word()
    vt = "/topic/VirtualTopic.gs%s" % u
    pub = open_conn()
    send(pub, vt + ".event.n1", "before-any-consumer-queue", persistent="true")
    c = open_conn()
    sub(c, "/queue/Consumer.broker.VirtualTopic.gs%s.event.>" % u, "s1", "client-individual")
    got = c.drain(1)
    out("virtual", "published before the consumer queue's first SUBSCRIBE, then subscribed: %s"
        % bodies(got))
    send(pub, vt + ".event.n1", "while-subscribed", persistent="true")
    got = c.drain(1)
    out("virtual", "while subscribed to Consumer.broker.VirtualTopic.<p>.event.> : %s"
        % [(f.body.decode(), f.headers) for f in got])
    for f in got:
        c.ack(f)
    c.disconnect()
    send(pub, vt + ".event.n2", "while-away", persistent="true")
    c = open_conn()
    sub(c, "/queue/Consumer.broker.VirtualTopic.gs%s.event.>" % u, "s1", "client-individual")
    got = c.drain(1)
    out("virtual", "published while the consumer was away, then re-subscribed: %s" % bodies(got))
    for f in got:
        c.ack(f)
    c.disconnect()
    # Created by SUBSCRIBE + UNSUBSCRIBE, never consumed while publishing.
    for q, key in (("Consumer.node-n9.VirtualTopic.gs%s.cmd.n9" % u, "cmd.n9"),
                   ("Consumer.b2.VirtualTopic.gs%s.decision.>" % u, "decision.scale_up.d.p")):
        c = open_conn()
        sub(c, "/queue/" + q, "x")
        c.unsubscribe("x", extra=[("receipt", "u")])
        c.recv(2)
        c.disconnect()
        send(pub, vt + "." + key, "after-subscribe-unsubscribe", persistent="true")
        c = open_conn()
        sub(c, "/queue/" + q, "x")
        out("virtual", "queue %s created by SUBSCRIBE+UNSUBSCRIBE keeps a later publish: %s"
            % (q.replace(u, "<p>"), bodies(c.drain(1))))
        c.disconnect()
    c = open_conn()
    sub(c, "/queue/Consumer.b3.VirtualTopic.gs%s.report.*.n1" % u, "x")
    for k in ("report.d1.n1", "report.d1.n2", "report.d1.x.n1"):
        send(pub, vt + "." + k, k)
    out("virtual", "'*' in a consumer queue (report.*.n1) receives: %s" % bodies(c.drain(1)))
    c.disconnect()
    c = open_conn()
    sub(c, "/queue/Consumer.ov.VirtualTopic.gs%s.event.>" % u, "wild")
    sub(c, "/queue/Consumer.ov.VirtualTopic.gs%s.event.n1" % u, "exact")
    send(pub, vt + ".event.n1", "overlap")
    out("virtual", "one consumer name, queues event.> and event.n1 both subscribed: deliveries "
        "(body, subscription) %s" % [(f.body.decode(), f.headers["subscription"]) for f in c.drain(1)])
    c.disconnect()
    for owner in ("admin.>", "admin.request"):
        c = open_conn()
        sub(c, "/queue/Consumer.owner.VirtualTopic.gs%s.%s" % (u, owner), "x")
        c.unsubscribe("x", extra=[("receipt", "u")])
        c.recv(2)
        c.disconnect()
        send(pub, vt + ".admin.request", "for-" + owner, persistent="true")
        c = open_conn()
        sub(c, "/queue/Consumer.*.VirtualTopic.gs%s.>" % u, "thief")
        out("virtual", "owner's queue Consumer.owner.VirtualTopic.<p>.%s holds a message; another "
            "client subscribing /queue/Consumer.*.VirtualTopic.<p>.> receives: %s"
            % (owner, bodies(c.drain(1))))
        c.disconnect()
    w = open_conn()
    sub(w, "/topic/VirtualTopic.gs%s.>" % u, "w")
    send(pub, vt + ".explain.d.p", "to-watcher")
    out("virtual", "a plain topic subscriber on /topic/VirtualTopic.<p>.> gets: %s"
        % [(f.body.decode(), f.headers["destination"]) for f in w.drain(1)])
    w.disconnect()
    q = open_conn()
    sub(q, "/queue/gs%s.event.n1" % u, "q")
    send(pub, "/topic/gs%s.event.n1" % u, "topic-to-queue")
    out("virtual", "SEND /topic/X reaches a subscriber of /queue/X: %s" % bodies(q.drain(1)))
    q.disconnect()
    p = open_conn()
    sub(p, "/queue/Consumer.b4.VirtualTopic.gs%s.report.>" % u, "p")
    send(pub, vt + ".report._none.node-1%2Eexample%2Ecom", "pct")
    f = p.recv(2)
    out("virtual", "percent-encoded key: destination=%s original-destination=%s"
        % (f.headers["destination"], f.headers["original-destination"]))
    p.disconnect()
    pub.disconnect()


# ---------------------------------------------------------------------------
def s_precreate():
    """A second broker whose activemq.xml lists consumer queues (<destinations>)."""
    state = "/tmp/gearshift-activemq-precreate-%d" % os.getpid()
    env = dict(os.environ, ACTIVEMQ_STATE_DIR=state, ACTIVEMQ_STOMP_PORT="61633",
               ACTIVEMQ_OPENWIRE_PORT="61636",
               ACTIVEMQ_QUEUES="Consumer.broker.VirtualTopic.gspre.event.> "
                               "Consumer.node-n1.VirtualTopic.gspre.cmd.n1")
    subprocess.run([SETUP], env=env, check=True)
    try:
        saved = dict(os.environ)
        os.environ.update(ACTIVEMQ_STATE_DIR=state, ACTIVEMQ_STOMP_PORT="61633")
        pub = open_conn()
        for d in ("event.n1", "cmd.n1"):
            send(pub, "/topic/VirtualTopic.gspre." + d, "pre-" + d, persistent="true")
        pub.disconnect()
        c = open_conn()
        sub(c, "/queue/Consumer.broker.VirtualTopic.gspre.event.>", "a")
        sub(c, "/queue/Consumer.node-n1.VirtualTopic.gspre.cmd.n1", "b")
        out("precreate", "queues listed in <destinations>, published before any SUBSCRIBE: %s"
            % [(f.body.decode(), f.headers["destination"]) for f in c.drain(1)])
        c.disconnect()
        os.environ.clear()
        os.environ.update(saved)
    finally:
        subprocess.run([SETUP, "stop"], env=env, check=False)
        subprocess.run(["rm", "-rf", state], check=False)


# ---------------------------------------------------------------------------
def s_durable():
    u = word()
    topic = "/topic/gsd%s.event.>" % u
    pub = open_conn()
    ev = "/topic/gsd%s.event." % u
    send(pub, ev + "n1", "before-first-subscribe", persistent="true")
    cid = [("client-id", "broker-" + u)]
    name = [("activemq.subscriptionName", "events")]
    c = open_conn(extra=cid)
    sub(c, topic, "d", "client-individual", name)
    send(pub, ev + "n1", "while-connected", persistent="true")
    got = c.drain(1)
    out("durable", "durable wildcard subscription, connected: %s; published before its first "
        "SUBSCRIBE: lost" % bodies(got))
    for f in got:
        c.ack(f)
    c2 = Conn(port())
    login, pw = credentials()
    f = c2.connect(login, pw, extra=cid)
    closed = c2.wait_closed(1.5)
    c2.close()
    out("durable", "second connection with the same client-id: %s %r; closed: %s"
        % (f.command, f.headers.get("message"), closed is not None))
    c.disconnect()
    send(pub, ev + "n2", "while-away", persistent="true")
    send(pub, ev + "n3.deeper", "while-away-deeper", persistent="true")
    c = open_conn(extra=cid)
    sub(c, topic, "d", "client-individual", name)
    got = c.drain(1)
    out("durable", "published while away, after re-subscribing: %s" % bodies(got))
    c.close()
    t, refused = time.monotonic(), 0
    while True:
        try:
            c = open_conn(extra=cid)
            break
        except RuntimeError:
            refused += 1
            time.sleep(0.005)
    out("durable", "reconnect with the same client-id right after a socket close: refused %d times "
        "(\"already connected\"), accepted after %.0f ms" % (refused, (time.monotonic() - t) * 1000))
    sub(c, topic, "d", "client-individual", name)
    got = c.drain(1)
    out("durable", "unacknowledged before the close, redelivered: %s"
        % [(f.body.decode(), f.headers.get("redelivered")) for f in got])
    for f in got:
        c.ack(f)
    c.unsubscribe("d", extra=name + [("receipt", "u")])
    f = c.recv(2)
    out("durable", "UNSUBSCRIBE with activemq.subscriptionName while active: %s %r"
        % (f.command, f.headers.get("message")))
    c.unsubscribe("d", extra=[("receipt", "u1")])
    c.recv(2)
    c.unsubscribe("d", extra=name + [("receipt", "u2")])
    f = c.recv(2)
    out("durable", "plain UNSUBSCRIBE, then UNSUBSCRIBE with the name: %s (subscription removed)"
        % f.command)
    c.disconnect()
    c = open_conn()
    sub(c, "/topic/gsd%s.x" % u, "n", extra=[("activemq.subscriptionName", "nocid")])
    c.disconnect()
    send(pub, "/topic/gsd%s.x" % u, "nocid-away", persistent="true")
    c = open_conn()
    sub(c, "/topic/gsd%s.x" % u, "n", extra=[("activemq.subscriptionName", "nocid")])
    out("durable", "activemq.subscriptionName without client-id keeps messages: %s"
        % bool(c.drain(1)))
    c.disconnect()
    pub.disconnect()


# ---------------------------------------------------------------------------
def s_exclusive():
    u = word()
    q = "/queue/gsx%s.leader" % u
    pub = open_conn()
    ex = [("activemq.exclusive", "true"), ("activemq.prefetchSize", "1")]
    a = open_conn()
    sub(a, q, "a", "client-individual", ex)
    b = open_conn()
    sub(b, q, "b", "client-individual", ex)
    for i in range(8):
        send(pub, q, "m%d" % i)
    out("exclusive", "two exclusive consumers, prefetch 1, nothing acked: first got %s, second %s"
        % (bodies(a.drain(0.5)), bodies(b.drain(0.5))))
    times = []
    for _ in range(5):
        t = time.monotonic()
        a.close()
        f = b.recv(5)
        times.append((time.monotonic() - t) * 1000)
        b.ack(f)
        a, b = b, open_conn()
        sub(b, q, "b", "client-individual", ex)
    out("exclusive", "hand-over when the active consumer's socket closes: %s ms (redelivered:%s)"
        % (", ".join("%.1f" % x for x in times), f.headers.get("redelivered")))
    a.close()
    b.close()
    q2 = "/queue/gsx%s.frozen" % u
    a = open_conn(heart_beat="1000,1000")
    sub(a, q2, "a", "client-individual", [("activemq.exclusive", "true")])
    b = open_conn()
    sub(b, q2, "b", "client-individual", [("activemq.exclusive", "true")])
    send(pub, q2, "f1")
    a.recv(2)
    t = time.monotonic()
    f = b.recv(10)
    out("exclusive", "active consumer frozen (heart-beat 1000 ms, stops reading and beating): "
        "hand-over after %.3f s" % (time.monotonic() - t))
    a.close()
    b.close()
    q3 = "/queue/gsx%s.mixed" % u
    n = open_conn()
    sub(n, q3, "n")
    e = open_conn()
    sub(e, q3, "e", extra=[("activemq.exclusive", "true")])
    for i in range(3):
        send(pub, q3, "x%d" % i)
    out("exclusive", "plain consumer first, exclusive second: plain got %s, exclusive got %s"
        % (bodies(n.drain(0.5)), bodies(e.drain(0.5))))
    n.close()
    e.close()
    pub.disconnect()


# ---------------------------------------------------------------------------
def s_composite():
    u = word()
    s = open_conn()
    sub(s, "/queue/gsc%s.node.n1" % u, "q")
    sub(s, "/topic/VirtualTopic.gsc%s.>" % u, "t")
    sub(s, "/queue/Consumer.w.VirtualTopic.gsc%s.>" % u, "v")
    p = open_conn()
    f = send(p, "/queue/gsc%s.node.n1,/topic/VirtualTopic.gsc%s.cmd.n1" % (u, u), "composite",
             persistent="true")
    out("composite", "SEND /queue/A,/topic/VirtualTopic.B -> %s; deliveries (subscription, "
        "destination, original-destination): %s" % (f.command, [
            (x.headers["subscription"], x.headers["destination"],
             x.headers.get("original-destination")) for x in s.drain(1)]))
    send(p, "/queue/gsc%s.node.n1, /topic/VirtualTopic.gsc%s.cmd.n1" % (u, u), "space")
    out("composite", "with a space after the comma, delivered to: %s"
        % [x.headers["subscription"] for x in s.drain(1)])
    s.disconnect()
    p.disconnect()


# ---------------------------------------------------------------------------
def s_auth():
    def show(label, fn):
        c = open_conn("outsider")
        fn(c)
        f = c.recv(2)
        closed = c.wait_closed(1.5) if f is not None else None
        c.close()
        out("auth", "%s -> %s; connection %s" % (
            label, frame_summary(f), "closed" if closed is not None else "stays open"))

    show("outsider SUBSCRIBE /queue/Consumer.broker.VirtualTopic.gearshift.event.> receipt:sub-1",
         lambda c: c.subscribe("/queue/Consumer.broker.VirtualTopic.gearshift.event.>", "s1",
                               extra=[("receipt", "sub-1")]))
    show("outsider SUBSCRIBE /topic/VirtualTopic.gearshift.> (no receipt)",
         lambda c: c.subscribe("/topic/VirtualTopic.gearshift.>", "s1"))
    show("outsider SEND /topic/VirtualTopic.gearshift.report.d.n receipt:send-1",
         lambda c: c.send("/topic/VirtualTopic.gearshift.report.d.n", "x", receipt="send-1"))
    c = open_conn("outsider")
    sub(c, "/queue/outsider.q%s" % word(), "ok")
    c.subscribe("/queue/gearshift.x", "bad", extra=[("receipt", "b")])
    f = c.recv(2)
    send(c, "/queue/outsider.q", "after")
    out("auth", "after a refused SUBSCRIBE the same connection still works: %s"
        % ("yes" if c.closed_at is None else "no"))
    c.close()
    c = open_conn()
    c.send("/nosuch/x", "x", receipt="w")
    out("auth", "SEND to an unknown prefix /nosuch/x -> %s" % frame_summary(c.recv(2)))
    c.close()


# ---------------------------------------------------------------------------
def s_reply():
    u = word()
    svc = "/queue/gsr%s.admin" % u
    srv = open_conn()
    sub(srv, svc, "s")
    req = open_conn()
    sub(req, "/temp-queue/reply-1", "r")
    req.send(svc, "request", receipt="x", reply_to="/temp-queue/reply-1", correlation_id="c-1")
    req.recv(2)
    f = srv.recv(2)
    out("reply", "requester sends reply-to:/temp-queue/reply-1; responder sees reply-to:%s"
        % f.headers["reply-to"])
    a = send(srv, f.headers["reply-to"], "reply", correlation_id=f.headers["correlation-id"])
    g = req.recv(2)
    out("reply", "responder SENDs to that header verbatim -> %s; requester gets %r with "
        "destination:%s correlation-id:%s" % (a.command, g.body, g.headers["destination"],
                                             g.headers.get("correlation-id")))
    rt = f.headers["reply-to"]
    req.disconnect()
    time.sleep(0.2)
    a = send(srv, rt, "late")
    out("reply", "reply to a temp queue whose connection has ended -> %s; connection %s"
        % (frame_summary(a), "closed" if srv.wait_closed(0.5) is not None else "stays open"))
    for hdr in ("/queue/gearshift.reply.abc", "gearshift.reply.abc"):
        r = open_conn()
        r.send(svc, "q", receipt="x", reply_to=hdr)
        r.recv(2)
        out("reply", "reply-to:%s arrives as reply-to:%s" % (hdr, srv.recv(2).headers["reply-to"]))
        r.disconnect()
    srv.disconnect()


# ---------------------------------------------------------------------------
def s_size():
    u = word()
    q = "/queue/gsbig%s" % u
    c = open_conn()
    t = time.monotonic()
    f = send(c, q, b"x" * (5 * 1024 * 1024), persistent="true")
    sub(c, q, "s")
    m = c.recv(10, want="MESSAGE")
    out("size", "5 MiB SEND -> %s in %.0f ms; delivered with content-length %s"
        % (f.command, (time.monotonic() - t) * 1000, m.headers.get("content-length")))
    c.disconnect()
    c = open_conn()
    hdr = "SEND\ndestination:%s\nreceipt:big\ncontent-length:104857601\n\n" % q
    c.sock.sendall(hdr.encode() + b"y" * (1 << 20))
    try:
        f = c.recv(5)
    except Closed:
        f = None
    closed = c.wait_closed(3) if c.closed_at is None else 0
    c.close()
    out("size", "SEND with content-length:104857601 (maxDataLength + 1), after 1 MiB of body -> %s; "
        "connection closed after %s s" % (frame_summary(f), closed))


# ---------------------------------------------------------------------------
def s_acks():
    u = word()
    q = "/queue/gsa%s" % u
    p = open_conn()
    for i in range(5):
        send(p, q, "m%d" % i, persistent="true")
    c = open_conn()
    sub(c, q, "s", "client-individual", [("activemq.prefetchSize", "2")])
    fs = c.drain(0.7)
    out("acks", "activemq.prefetchSize:2, nothing acked: %s" % bodies(fs))
    c.ack(fs[1])
    out("acks", "after ACK id:<ack header> of the second: %s" % bodies(c.drain(0.7)))
    c.ack(fs[0], "NACK")
    out("acks", "after NACK of the first: %s" % bodies(c.drain(0.7)))
    c.close()
    c = open_conn()
    sub(c, q, "s", "client-individual")
    rest = c.drain(0.7)
    out("acks", "after the connection closed, a new consumer gets (body, redelivered): %s"
        % [(f.body.decode(), f.headers.get("redelivered")) for f in rest])
    for f in rest:
        c.ack(f)
    c.disconnect()
    d = open_conn()
    sub(d, "/queue/ActiveMQ.DLQ", "d", "client-individual")
    dlq = [f for f in d.drain(1) if f.headers.get("original-destination") == q]
    out("acks", "ActiveMQ.DLQ holds the NACKed (persistent) message: %s" % bodies(dlq))
    for f in d.frames:
        if f.command == "MESSAGE" and f.headers.get("original-destination") == q:
            d.ack(f)
    d.disconnect()
    send(p, q + ".np", "np")
    c = open_conn()
    sub(c, q + ".np", "s", "client-individual")
    f = c.recv(2, want="MESSAGE")
    c.send_frame("NACK", [("id", f.headers["ack"]), ("requeue", "true"), ("receipt", "n")])
    c.recv(2)
    again = c.drain(0.7)
    c.disconnect()
    out("acks", "NACK requeue:true of a non-persistent message: redelivered %s (dropped: "
        "non-persistent messages do not go to the DLQ)" % bodies(again))
    for i in range(4):
        send(p, q + ".pc", "n%d" % i)
    c = open_conn()
    sub(c, q + ".pc", "s", "client-individual", [("prefetch-count", "1")])
    out("acks", "prefetch-count:1 alone (RabbitMQ's header), nothing acked: %s" % bodies(c.drain(0.7)))
    c.close()
    for i in range(3):
        send(p, q + ".u", "u%d" % i, persistent="true")
    c = open_conn()
    sub(c, q + ".u", "s", "client-individual", [("activemq.prefetchSize", "3")])
    fs = c.drain(0.5)
    c.unsubscribe("s", extra=[("receipt", "u")])
    c.recv(2)
    c.send_frame("ACK", [("id", fs[0].headers["ack"]), ("receipt", "k")])
    f = c.recv(2)
    c2 = open_conn()
    sub(c2, q + ".u", "s2")
    out("acks", "UNSUBSCRIBE with 3 unacked, then ACK of one -> %s; another consumer gets %s"
        % (f.command, [(x.body.decode(), x.headers.get("redelivered")) for x in c2.drain(0.7)]))
    c.close()
    c2.disconnect()
    for i in range(3):
        send(p, q + ".rs", "r%d" % i, persistent="true")
    c = open_conn()
    sub(c, q + ".rs", "s", "client-individual")
    fs = c.drain(0.5)
    c.ack(fs[1])
    c.unsubscribe("s", extra=[("receipt", "u")])
    c.recv(2, want="RECEIPT")
    sub(c, q + ".rs", "s", "client-individual")
    out("acks", "same connection: r1 acked, UNSUBSCRIBE, SUBSCRIBE again -> %s"
        % [(x.body.decode(), x.headers.get("redelivered")) for x in c.drain(0.7)])
    c.disconnect()
    c = open_conn()
    c.send_frame("ACK", [("id", "nope"), ("receipt", "ak")])
    f = c.recv(2)
    out("acks", "ACK of an unknown id -> %s; connection %s"
        % (frame_summary(f), "closed" if c.wait_closed(1) is not None else "stays open"))
    c.close()
    p.disconnect()


# ---------------------------------------------------------------------------
def s_frames():
    u = word()
    q = "/queue/gsf%s" % u
    c = open_conn()
    c.send_frame("SEND", [("destination", q), ("receipt", "1")], b"text-no-cl", content_length=False)
    c.recv(2)
    c.send_frame("SEND", [("destination", q), ("receipt", "2")], b"with\0nul")
    c.recv(2)
    c.send_frame("SEND", [("destination", q), ("receipt", "3"), ("content-type", "application/json"),
                          ("persistent", "true")], b'{"a":1}')
    c.recv(2)
    sub(c, q, "s")
    for f in c.drain(0.7):
        out("frames", "MESSAGE %r headers %s" % (f.body, f.headers))
    out("frames", "every frame received ended with \\0\\n: %s (%d frames, %d bare EOLs)"
        % (all(f.raw_end == b"\n" for f in c.frames), len(c.frames), len(c.beats)))
    for i, pers in enumerate([False, True, False, True, False, False, True]):
        if pers:
            send(c, q + ".ord", "%dp" % i, persistent="true")
        else:
            send(c, q + ".ord", "%dn" % i)
    sub(c, q + ".ord", "o")
    out("frames", "queued before SUBSCRIBE in the order 0n 1p 2n 3p 4n 5n 6p (p: persistent), "
        "delivered as: %s" % " ".join(bodies(c.drain(1))))
    t = time.monotonic()
    for i in range(50):
        send(c, q + ".lat", "p", persistent="true")
    tp = (time.monotonic() - t) / 50 * 1000
    t = time.monotonic()
    for i in range(50):
        send(c, q + ".lat", "n")
    tn = (time.monotonic() - t) / 50 * 1000
    out("frames", "SEND+RECEIPT round trip: persistent %.2f ms, non-persistent %.2f ms" % (tp, tn))
    c.disconnect()


# ---------------------------------------------------------------------------
def s_latency():
    """Request/reply round trips: a service queue there, a temp queue back."""
    u = word()
    svc = "/queue/gsl%s" % u
    srv = open_conn()
    req = open_conn()
    for c in (srv, req):
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sub(srv, svc, "s")
    sub(req, "/temp-queue/r", "r")
    stop = []

    def serve():
        while not stop:
            f = srv.recv(0.2)
            if f is not None and f.command == "MESSAGE":
                srv.send(f.headers["reply-to"], "pong",
                         correlation_id=f.headers.get("correlation-id", ""))

    t = threading.Thread(target=serve)
    t.start()
    rtts = []
    for i in range(200):
        t0 = time.monotonic()
        req.send(svc, "ping", reply_to="/temp-queue/r", correlation_id=str(i))
        req.recv(2, want="MESSAGE")
        rtts.append((time.monotonic() - t0) * 1000)
        time.sleep(0.01)
    stop.append(1)
    t.join()
    rtts.sort()
    out("latency", "request/reply (queue there, temp queue back), 200 runs: median %.2f ms, "
        "p90 %.2f ms, max %.2f ms, over 30 ms: %d"
        % (rtts[100], rtts[180], rtts[-1], sum(1 for r in rtts if r > 30)))
    srv.disconnect()
    req.disconnect()


# ---------------------------------------------------------------------------
def s_restart():
    u = word()
    c = open_conn()
    for q in ("Consumer.rst.VirtualTopic.gs%s.event.>" % u,):
        sub(c, "/queue/" + q, "x")
        c.unsubscribe("x", extra=[("receipt", "u")])
        c.recv(2)
    send(c, "/queue/gs%s.plain" % u, "persistent", persistent="true")
    send(c, "/queue/gs%s.plain" % u, "non-persistent")
    send(c, "/topic/VirtualTopic.gs%s.event.n1" % u, "vt-before-restart", persistent="true")
    c.disconnect()
    subprocess.run([SETUP, "stop"], check=True)
    subprocess.run([SETUP], check=True)
    c = open_conn()
    send(c, "/topic/VirtualTopic.gs%s.event.n2" % u, "vt-after-restart", persistent="true")
    sub(c, "/queue/gs%s.plain" % u, "a")
    sub(c, "/queue/Consumer.rst.VirtualTopic.gs%s.event.>" % u, "b")
    out("restart", "after a broker restart: %s" % bodies(c.drain(1.5)))
    c.disconnect()


SECTIONS = {
    "connect": s_connect, "virtual": s_virtual, "durable": s_durable,
    "exclusive": s_exclusive, "composite": s_composite, "auth": s_auth, "reply": s_reply,
    "size": s_size, "acks": s_acks, "frames": s_frames, "latency": s_latency,
    "heartbeat": s_heartbeat, "precreate": s_precreate, "restart": s_restart,
}
SLOW = ("heartbeat", "precreate", "restart")


def main(argv):
    names = [a for a in argv if not a.startswith("--")]
    if not names:
        names = [n for n in SECTIONS if "--all" in argv or n not in SLOW]
    for n in names:
        SECTIONS[n]()


if __name__ == "__main__":
    main(sys.argv[1:])
