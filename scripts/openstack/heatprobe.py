"""Helpers shared by probe_heat.py and probe_heat_members.py (stacks of templates/groups.yaml,
member listings, waiting for updates and for a scaling policy's signal to settle)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ostest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "templates", "groups.yaml")) as f:
    TEMPLATE = f.read()
OUT = os.path.join(ostest.STATE, "probes")


def members(c, nested):
    """[(name, physical_resource_id, status)] of a nested stack, oldest first."""
    res = c.resources(nested)
    res.sort(key=lambda r: (r.get("creation_time") or "", r["resource_name"]))
    return [(r["resource_name"], r["physical_resource_id"], r["resource_status"]) for r in res]


def fmt(ms):
    return ", ".join("%s(%s)" % (n, s) for n, _, s in ms)


def fmtp(ms):
    return ", ".join("%s[%s](%s)" % (n, p.rsplit("-", 1)[-1], s) for n, p, s in ms)


def new_stack(c, prefix, **params):
    sid = c.create_stack(ostest.unique(prefix), TEMPLATE, params)
    c.wait_stack(sid, timeout=180)
    return sid


def wait_nested(c, nested, before, timeout=120):
    s, seen = c.wait_stack(nested, timeout=timeout, want=("UPDATE_COMPLETE",), after=before)
    return s, seen


def settle(c, sid, timeout=120):
    """Polls until the stack is no longer IN_PROGRESS; returns (statuses seen, reason)."""
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = c.stack(sid)
        if not seen or seen[-1] != s["stack_status"]:
            seen.append(s["stack_status"])
        if not s["stack_status"].endswith("IN_PROGRESS") and len(seen) > 1:
            return seen, s["stack_status_reason"]
        time.sleep(0.5)
    return seen, "still in progress after %ds" % timeout


def ev_line(e):
    return "%s %s %s: %s" % (e.get("event_time"), e.get("resource_name"),
                             e.get("resource_status"), e.get("resource_status_reason"))


def watch(c, sid, secs):
    """Polls every 0.2 s for `secs`; returns the distinct (status, reason) seen."""
    seen = []
    deadline = time.time() + secs
    while time.time() < deadline:
        s = c.stack(sid)
        cur = (s["stack_status"], s["stack_status_reason"])
        if not seen or seen[-1] != cur:
            seen.append(cur)
        time.sleep(0.2)
    return seen


def policy_events(c, sid, policy, since=0):
    ev = c.events(sid, policy)
    return [ev_line(e) for e in ev][since:]


def group_events(c, sid, group):
    ev = c.events(sid, group)
    return [ev_line(e) for e in ev]


def settle_signal(c, t, sid, asg, policy, send, what, quiet=25):
    """Sends one signal, then watches the policy's events and the ASG.

    Heat handles a policy signal in an engine thread after answering 200,
    and writes the policy's SIGNAL_COMPLETE event only after the resize
    finished; an ignored signal (NoActionRequired) writes no event at all.
    So: accepted = a new policy event within `quiet` seconds.
    """
    n_ev = len(c.events(sid, policy))
    size0 = len(members(c, asg))
    t.note(what)
    t0 = time.time()
    r = send()
    new = []
    while time.time() - t0 < quiet:
        new = policy_events(c, sid, policy, n_ev)
        if new:
            break
        time.sleep(0.3)
    size1 = len(members(c, asg))
    t.note("-> HTTP %d; %s after %.1f s; ASG %d -> %d members%s" % (
        r.status_code, "accepted" if new else "IGNORED (no policy event)",
        time.time() - t0, size0, size1,
        ("; new policy event:\n\n```\n%s\n```" % "\n".join(new)) if new else ""))
    return bool(new)


def asg_metadata(c, t, sid, what):
    r = c.raw("GET", c.heat("stacks/%s/resources/asg/metadata" % sid), record=False)
    t.note("%s: `GET stacks/{sid}/resources/asg/metadata` -> %d `%s`" % (
        what, r.status_code, r.text.strip()))
