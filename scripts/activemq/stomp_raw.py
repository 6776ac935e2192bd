"""A small STOMP 1.2 client on raw sockets, for measuring a broker's behaviour.

Standard library only. It keeps every received byte with its arrival time, so
heart-beats (bare EOLs between frames) and frame endings (`\\0\\n`) can be
measured exactly, which client libraries hide.
"""

import socket
import time

EOL = b"\n"


def escape(value):
    """STOMP 1.2 header value escaping (not used in CONNECT/CONNECTED)."""
    return (value.replace("\\", "\\\\").replace("\r", "\\r")
            .replace("\n", "\\n").replace(":", "\\c"))


def unescape(value):
    out, i = [], 0
    table = {"\\": "\\", "n": "\n", "r": "\r", "c": ":"}
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value) and value[i + 1] in table:
            out.append(table[value[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class Frame:
    """One received frame: command, headers (first occurrence wins), body."""

    def __init__(self, command, headers, body, raw_end, at):
        self.command = command
        self.headers = headers
        self.body = body
        self.raw_end = raw_end  # the bytes that followed the NUL (b"\n" or b"")
        self.at = at  # monotonic arrival time of the frame's last byte

    def __repr__(self):
        body = self.body if len(self.body) <= 200 else self.body[:200] + b"..."
        return "Frame(%s, %r, %r)" % (self.command, self.headers, body)


class Closed(Exception):
    """The broker closed the connection."""


class Conn:
    """One STOMP connection. Every wait is bounded."""

    def __init__(self, port, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.buf = b""
        self.beats = []  # monotonic times of heart-beat EOLs received
        self.frames = []  # every Frame received, in order
        self.pending = []  # frames skipped by recv(want=...), returned later
        self.closed_at = None
        self.t0 = time.monotonic()

    # ---- sending -------------------------------------------------------
    def send_frame(self, command, headers=(), body=b"", escape_headers=True,
                   content_length=True):
        if isinstance(body, str):
            body = body.encode()
        lines = [command]
        hdrs = list(headers.items()) if isinstance(headers, dict) else list(headers)
        if content_length and body and not any(k == "content-length" for k, _ in hdrs):
            hdrs.append(("content-length", str(len(body))))
        for k, v in hdrs:
            if escape_headers and command not in ("CONNECT", "STOMP"):
                k, v = escape(k), escape(v)
            lines.append("%s:%s" % (k, v))
        data = ("\n".join(lines) + "\n\n").encode() + body + b"\0"
        self.sock.sendall(data)

    def beat(self):
        self.sock.sendall(EOL)

    def connect(self, login, passcode, heart_beat="0,0", host="localhost",
                version="1.2", extra=(), timeout=5):
        headers = []
        if version is not None:
            headers.append(("accept-version", version))
        if host is not None:
            headers.append(("host", host))
        if login is not None:
            headers.append(("login", login))
            headers.append(("passcode", passcode))
        if heart_beat is not None:
            headers.append(("heart-beat", heart_beat))
        headers.extend(extra)
        self.send_frame("CONNECT", headers)
        return self.recv(timeout)

    def send(self, destination, body, **headers):
        h = [("destination", destination)]
        h += [(k.replace("_", "-"), v) for k, v in headers.items()]
        self.send_frame("SEND", h, body)

    def subscribe(self, destination, sub_id, ack="auto", extra=()):
        h = [("destination", destination), ("id", sub_id), ("ack", ack)]
        h += list(extra)
        self.send_frame("SUBSCRIBE", h)

    def unsubscribe(self, sub_id, extra=()):
        self.send_frame("UNSUBSCRIBE", [("id", sub_id)] + list(extra))

    def ack(self, frame, command="ACK"):
        self.send_frame(command, [("id", frame.headers["ack"])])

    def disconnect(self, receipt="bye", timeout=3):
        try:
            self.send_frame("DISCONNECT", [("receipt", receipt)])
            f = self.recv(timeout)
        except (Closed, OSError):
            f = None
        self.close()
        return f

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # ---- receiving -----------------------------------------------------
    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return False
        except OSError:
            data = b""
        if not data:
            if self.closed_at is None:
                self.closed_at = time.monotonic()
            raise Closed()
        self.buf += data
        return True

    def _parse_one(self, now, final=False):
        """Consumes heart-beats and at most one frame from the buffer.

        Returns a Frame, None (incomplete), or "need-more" when a frame is
        complete but the byte after its NUL has not arrived yet (`final`
        parses it anyway, as a frame without a trailing EOL).
        """
        while True:
            if self.buf.startswith(b"\r\n"):
                self.buf = self.buf[2:]
            elif self.buf[:1] == b"\n":
                self.buf = self.buf[1:]
            else:
                break
            self.beats.append(now)
        head_end = self.buf.find(b"\n\n")
        if head_end < 0:
            return None
        head = self.buf[:head_end].decode("utf-8", "replace").replace("\r", "")
        lines = head.split("\n")
        command = lines[0]
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if command != "CONNECTED":
                k, v = unescape(k), unescape(v)
            headers.setdefault(k, v)
        body_start = head_end + 2
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(self.buf) < body_start + n + 1:
                return None
            end = body_start + n
        else:
            end = self.buf.find(b"\0", body_start)
            if end < 0:
                return None
        body = self.buf[body_start:end]
        if len(self.buf) < end + 2 and not final:
            return "need-more"
        raw_end = b"\n" if self.buf[end + 1:end + 2] == b"\n" else b""
        self.buf = self.buf[end + 1 + len(raw_end):]
        f = Frame(command, headers, body, raw_end, now)
        self.frames.append(f)
        return f

    def recv(self, timeout=5, want=None):
        """The next frame (of command `want`, or one of a tuple of commands,
        when given), or None at timeout. Skipped frames wait in `pending`."""
        deadline = time.monotonic() + timeout
        wanted = (lambda c: True) if want is None else (
            (lambda c: c in want) if isinstance(want, tuple) else (lambda c: c == want))
        for i, f in enumerate(self.pending):
            if wanted(f.command):
                return self.pending.pop(i)
        while True:
            r = self._parse_one(time.monotonic())
            if r == "need-more":
                # Wait a little for the byte after NUL so that a trailing EOL
                # is told apart from a heart-beat.
                if not self._fill(min(deadline, time.monotonic() + 0.05)):
                    r = self._parse_one(time.monotonic(), final=True)
                else:
                    continue
            if isinstance(r, Frame):
                if wanted(r.command):
                    return r
                self.pending.append(r)
                continue
            if not self._fill(deadline):
                return None

    def drain(self, timeout):
        """Every frame that arrives within `timeout` seconds."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                f = self.recv(max(0.0, deadline - time.monotonic()))
            except Closed:
                break
            if f is None:
                break
            out.append(f)
        return out

    def wait_closed(self, timeout):
        """Seconds until the broker closes the connection, or None."""
        deadline = time.monotonic() + timeout
        start = time.monotonic()
        try:
            while time.monotonic() < deadline:
                self.recv(max(0.0, deadline - time.monotonic()))
        except Closed:
            return self.closed_at - start
        return None


def state_dir():
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.environ.get("ACTIVEMQ_STATE_DIR", os.path.join(root, "target", "activemq"))


def credentials(user="gearshift"):
    import os
    name = "password" if user == "gearshift" else "password.outsider"
    with open(os.path.join(state_dir(), name)) as f:
        return user, f.read().strip()


def port():
    import os
    return int(os.environ.get("ACTIVEMQ_STOMP_PORT", "61623"))


def open_conn(user="gearshift", heart_beat="0,0", extra=(), host="localhost"):
    c = Conn(port())
    login, pw = credentials(user)
    f = c.connect(login, pw, heart_beat=heart_beat, extra=extra, host=host)
    if f is None or f.command != "CONNECTED":
        raise RuntimeError("CONNECT failed: %r" % (f,))
    c.connected = f
    return c
