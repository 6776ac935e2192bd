"""Probes: how real Heat answers the requests gearshift's handlers and node agent send.

    probe_heat.py [scenario...]     (default: all; transcripts in <state>/probes/)

Scenarios (each on its own stack of templates/groups.yaml, deleted afterwards):
  basics      302s, resource listings, member names, finding a member, 404 bodies,
              PATCH answers (body `null`), alarm_url / signal_url shapes
  alarm       pre-signed alarm URL: good, tampered, missing signature, GET, with a token;
              signal_url with and without a token; signal bodies and their events
  busy        a signal while the group scales, at max_size, at min_size, in cooldown
  patch_busy  a stack PATCH while the stack is UPDATE_IN_PROGRESS
  unhealthy   mark-unhealthy + scale-down signal, mark-unhealthy + PATCH {"parameters": {}}
  asg_patch   a PATCH {"parameters": {}} after the ASG was resized by signals
  member_template  members that are nested templates (the server one level deeper)
  removal     ResourceGroup count-1 with removal_policies (list, string, physical id)
  replace     a parameter feeding every member's properties changes
  appcred     the same calls with a (restricted) application credential token
"""

import json
import os
import sys
import time

import requests

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


# ------------------------------------------------------------------ basics

def basics(c, t):
    sid = new_stack(c, "gs-basics")
    name, sid_id = sid.split("/")
    try:
        t.note("Stack lookup by name only and by id only (Heat answers 302 to the full form):")
        c.raw("GET", c.heat("stacks/" + name))
        c.raw("GET", c.heat("stacks/" + sid_id))
        rg = c.nested(sid, "group")
        c.raw("GET", c.heat("stacks/" + rg.split("/")[1]))
        t.note("`GET stacks/{name}/{id}` (parameters come back as strings):")
        r = c.raw("GET", c.heat("stacks/" + sid), record=False)
        st = r.json()["stack"]
        t.note("```\n" + json.dumps({k: st[k] for k in (
            "id", "stack_name", "stack_status", "stack_status_reason", "updated_time",
            "parameters", "parent", "links")}, indent=1, sort_keys=True) + "\n```")
        t.note("`GET stacks/{name}/{id}/resources?nested_depth=0` (top-level resources):")
        top = c.resources(sid)
        t.note("```\n" + "\n".join("%s %s physical=%s links=%s" % (
            r["resource_name"], r["resource_type"], r["physical_resource_id"],
            [l["rel"] for l in r["links"]]) for r in top) + "\n```")
        t.note("`...resources?nested_depth=2` (members of both nested stacks, with parent_resource):")
        deep = c.resources(sid, 2)
        t.note("```\n" + "\n".join("%s %s physical=%s parent_resource=%s stack=%s" % (
            r["resource_name"], r["resource_type"], r["physical_resource_id"],
            r.get("parent_resource"),
            next(l["href"] for l in r["links"] if l["rel"] == "stack").split("/stacks/")[1])
            for r in deep) + "\n```")
        asg = c.nested(sid, "asg")
        t.note("Member names: ResourceGroup nested stack `%s`: %s; AutoScalingGroup nested stack "
               "`%s`: %s" % (rg, fmt(members(c, rg)), asg, fmt(members(c, asg))))
        t.note("One member of the ResourceGroup and one of the ASG, shown (`GET "
               "stacks/{nested}/resources/{member}`): the `attributes` carry the member's "
               "outputs (TestResource `output` = its `value` property).")
        m0 = members(c, rg)[0][0]
        c.raw("GET", c.heat("stacks/%s/resources/%s" % (rg, m0)))
        a0 = members(c, asg)[0][0]
        c.raw("GET", c.heat("stacks/%s/resources/%s" % (asg, a0)))
        t.note("Finding a member by a property: list the nested stack, then match "
               "`physical_resource_id` (a Nova server's id for server members) or a shown "
               "attribute. Heat's resource list has no filter on properties; "
               "`GET .../resources?with_detail=true` adds `attributes`? :")
        c.raw("GET", c.heat("stacks/%s/resources?with_detail=true" % rg))
        t.note("Outputs: the policies' alarm_url and signal_url:")
        outs = c.outputs(sid)
        t.note("```\n" + "\n".join("%s = %s" % (k, ostest.short(str(v)))
                                   for k, v in sorted(outs.items())) + "\n```")
        t.note("Missing member, in the top stack (what the node agent's default "
               "stack/member would name) and in the nested stack:")
        body = {"mark_unhealthy": True, "resource_status_reason": "gearshift probe"}
        c.raw("PATCH", c.heat("stacks/%s/resources/node-1.example.com" % sid), body)
        c.raw("PATCH", c.heat("stacks/%s/resources/nosuch" % rg), body)
        c.raw("GET", c.heat("stacks/%s/resources/nosuch" % rg))
        c.raw("POST", c.heat("stacks/%s/resources/nosuch/signal" % sid), {"reason": "x"})
        c.raw("GET", c.heat("stacks/%s/%s" % (name, "00000000-0000-0000-0000-000000000000")))
        c.raw("GET", c.heat("stacks/nosuchstack"))
        t.note("Marking a ResourceGroup member unhealthy, and unmarking it:")
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (rg, m0)), body)
        c.raw("GET", c.heat("stacks/%s/resources/%s" % (rg, m0)), record=False)
        t.note("Status afterwards: %s" % fmt(members(c, rg)))
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (rg, m0)),
              {"mark_unhealthy": False, "resource_status_reason": "probe: healthy again"})
        t.note("Status afterwards: %s" % fmt(members(c, rg)))
        t.note("Other resource PATCH bodies: empty object, body `null`, unknown key:")
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (rg, m0)), {})
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (rg, m0)), data="null",
              headers={"Content-Type": "application/json"})
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (rg, m0)), {"mark_unhealthy": True,
                                                                     "foo": 1})
        t.note("Stack PATCH with unchanged parameters, and its body:")
        before = c.stack(sid)["updated_time"]
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}})
        s, seen = c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
        t.note("Stack statuses seen while polling: %s; RG members after: %s"
               % (seen, fmt(members(c, rg))))
        t.note("Stack PATCH bodies: `null`, an unknown key, a parameter of the wrong type, "
               "an undeclared parameter (each accepted one waited for):")
        for body in (None, {"parameters": {}, "bogus": 1}, {"parameters": {"count": "two"}},
                     {"parameters": {"gearshift_op": "x"}}, {"parameters": {"count": 2}}):
            if body is None:
                r = c.raw("PATCH", c.heat("stacks/" + sid), data="null",
                          headers={"Content-Type": "application/json"})
            else:
                r = c.raw("PATCH", c.heat("stacks/" + sid), body)
            if r.status_code == 202:
                t.note("-> stack settled as %s" % (settle(c, sid),))
    finally:
        c.delete_stack(sid)


# ------------------------------------------------------------------ alarm

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


def alarm(c, t):
    sid = new_stack(c, "gs-alarm", asg_max=20, asg_desired=1)
    try:
        asg = c.nested(sid, "asg")
        outs = c.outputs(sid)
        url = outs["scale_up_alarm_url"]
        t.note("alarm_url (scale_up) as the output gives it (signature shortened):\n\n```\n%s\n```"
               % ostest.short(url))
        from urllib.parse import urlsplit, parse_qsl, unquote
        u = urlsplit(url)
        t.note("Path `%s` (decoded: `%s`); query keys in order: `%s`" % (
            u.path, unquote(u.path), [k for k, _ in parse_qsl(u.query)]))
        t.note("signal_url (scale_up): `%s`" % outs["scale_up_signal_url"])
        sig = lambda body=None, **kw: (lambda: c.raw("POST", url, body, token=False, **kw))
        settle_signal(c, t, sid, asg, "scale_up", sig(), "POST alarm_url, no body, no token:")
        t.note("Refusals: tampered signature, missing Signature, no query at all, GET instead "
               "of POST:")
        c.raw("POST", url.replace("Signature=", "Signature=AAAA"), token=False)
        c.raw("POST", "&".join(p for p in url.split("&") if not p.startswith("Signature=")),
              token=False)
        c.raw("POST", url.split("?")[0], token=False)
        c.raw("GET", url, token=False)
        settle_signal(c, t, sid, asg, "scale_up", lambda: c.raw("POST", url, token=True),
                      "POST alarm_url with a valid X-Auth-Token added:")
        settle_signal(c, t, sid, asg, "scale_up",
                      sig({"reason": "gearshift d1: scale up small (op 43)"}),
                      "POST alarm_url with the handler's JSON body `{\"reason\"}`:")
        surl = outs["scale_up_signal_url"]
        t.note("signal_url without a token:")
        c.raw("POST", surl, {"reason": "x"}, token=False)
        bodies = [
            ("no body", None),
            ("the handler's {\"reason\"}", {"reason": "gearshift d1: scale up small (op 42)"}),
            ("the node agent's {\"host\", \"reason\"}", {"host": "node-1.example.com",
                                                         "reason": "gearshift: scale up"}),
            ("a JSON string", "gearshift d1: scale up small (op 45)"),
            ("Aodh-shaped", {"alarm_id": "a1", "current": "alarm", "previous": "ok",
                             "reason": "gear usage above 80%", "reason_data": {}}),
            ("Aodh-shaped with current=ok", {"alarm_id": "a1", "current": "ok",
                                             "previous": "alarm", "reason": "back to normal",
                                             "reason_data": {}}),
        ]
        for what, body in bodies:
            send = (lambda b=body: c.raw("POST", surl)) if body is None else \
                (lambda b=body: c.raw("POST", surl, b))
            settle_signal(c, t, sid, asg, "scale_up", send,
                          "signal_url with the user's token and %s:" % what)
        asg_metadata(c, t, sid, "Group metadata when idle")
        t.note("All policy events (`GET stacks/{sid}/resources/scale_up/events`):")
        c.raw("GET", c.heat("stacks/%s/resources/scale_up/events?sort_dir=asc" % sid))
        t.note("ASG resource events (`GET stacks/{sid}/resources/asg/events`): %s"
               % group_events(c, sid, "asg"))
    finally:
        c.delete_stack(sid)


# ------------------------------------------------------------------ busy

def busy(c, t):
    sid = new_stack(c, "gs-busy", asg_max=3, asg_desired=1, member_wait=6)
    try:
        asg = c.nested(sid, "asg")
        surl = c.heat("stacks/%s/resources/scale_up/signal" % sid)
        up = lambda why: (lambda: c.raw("POST", surl, {"reason": why}))
        t.note("ASG of 1 (max 3), each member's create takes 6 s. Signal 1, then signal 2 one "
               "second later (while the first one scales):")
        n_ev = len(c.events(sid, "scale_up"))
        c.raw("POST", surl, {"reason": "first"})
        trace = []
        t0 = time.time()
        sent2 = False
        while time.time() - t0 < 40:
            st = c.stack(asg)["stack_status"]
            md = c.raw("GET", c.heat("stacks/%s/resources/asg/metadata" % sid),
                       record=False).json().get("metadata", {})
            cur = (st, md.get("scaling_in_progress"), len(policy_events(c, sid, "scale_up", n_ev)))
            if not trace or trace[-1][1:] != cur:
                trace.append(("%.1fs" % (time.time() - t0),) + cur)
            if not sent2 and time.time() - t0 > 1:
                c.raw("POST", surl, {"reason": "second, while scaling"})
                sent2 = True
            if cur[2] >= 1 and time.time() - t0 > 15:
                break
            time.sleep(0.2)
        t.note("(time, ASG nested status, metadata.scaling_in_progress, new policy events) as "
               "they changed: %s" % trace)
        t.note("Members after both: %s; policy events: %s"
               % (fmt(members(c, asg)), policy_events(c, sid, "scale_up", n_ev)))
        t.note("A signal sent the moment the nested stack reports UPDATE_COMPLETE:")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", surl, {"reason": "third"}, record=False)
        wait_nested(c, asg, before, timeout=60)
        asg_metadata(c, t, sid, "Right after the nested stack's UPDATE_COMPLETE")
        settle_signal(c, t, sid, asg, "scale_up", up("right after UPDATE_COMPLETE"),
                      "signal now:", quiet=15)
        time.sleep(3)
        t.note("Members now %d (max 3). A scale-up signal at max_size:" % len(members(c, asg)))
        settle_signal(c, t, sid, asg, "scale_up", up("at max_size"), "signal at max:", quiet=10)
        settle_signal(c, t, sid, asg, "scale_up",
                      lambda: c.raw("POST", c.outputs(sid)["scale_up_alarm_url"], token=False),
                      "the pre-signed alarm_url at max:", quiet=10)
        asg_metadata(c, t, sid, "Group metadata now")
    finally:
        c.delete_stack(sid)
    sid = new_stack(c, "gs-cooldown", asg_max=5, asg_desired=2, cooldown=300)
    try:
        asg = c.nested(sid, "asg")
        up = lambda why: (lambda: c.raw("POST", c.heat(
            "stacks/%s/resources/scale_up/signal" % sid), {"reason": why}))
        down = lambda why: (lambda: c.raw("POST", c.heat(
            "stacks/%s/resources/scale_down/signal" % sid), {"reason": why}))
        t.note("Policies with cooldown 300 s, ASG of 2 (min 1):")
        settle_signal(c, t, sid, asg, "scale_up", up("first"), "scale_up:")
        asg_metadata(c, t, sid, "After it")
        settle_signal(c, t, sid, asg, "scale_up", up("in cooldown"), "scale_up again:", quiet=10)
        settle_signal(c, t, sid, asg, "scale_down", down("other policy, group in cooldown"),
                      "scale_down (the other policy) during the group's cooldown:", quiet=10)
    finally:
        c.delete_stack(sid)
    sid = new_stack(c, "gs-minsize", asg_max=5, asg_desired=1)
    try:
        asg = c.nested(sid, "asg")
        settle_signal(c, t, sid, asg, "scale_down", lambda: c.raw("POST", c.heat(
            "stacks/%s/resources/scale_down/signal" % sid), {"reason": "at min"}),
            "scale_down at min_size (1):", quiet=10)
    finally:
        c.delete_stack(sid)


# ------------------------------------------------------------------ patch_busy

def patch_busy(c, t):
    sid = new_stack(c, "gs-patchbusy", count=1, member_wait=6)
    try:
        rg = c.nested(sid, "group")
        t.note("ResourceGroup count 1, members take 6 s to create. PATCH count=2, then 1 s "
               "later (stack UPDATE_IN_PROGRESS) read the stack and PATCH count=3:")
        before = c.stack(sid)["updated_time"]
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 2}})
        time.sleep(1)
        r = c.raw("GET", c.heat("stacks/" + sid), record=False)
        st = r.json()["stack"]
        t.note("While updating: stack_status %s, parameters.count %r" % (
            st["stack_status"], st["parameters"]["count"]))
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 3}})
        seen = watch(c, sid, 40)
        s = c.stack(sid)
        t.note("(status, reason) seen every 0.2 s for 40 s: %s; count %r; members: %s" % (
            seen, s["parameters"]["count"], fmt(members(c, rg))))
        t.note("The same race as gearshift's count mode runs it: two clients read count=3, "
               "each PATCHes count+1=4 while the other's update runs:")
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 4}})
        time.sleep(1)
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 4}})
        seen = watch(c, sid, 40)
        s = c.stack(sid)
        t.note("Statuses seen: %s. Final %s, count %r, members: %s (two scale-ups asked, "
               "one member added)" % (seen, s["stack_status"], s["parameters"]["count"],
                                      fmt(members(c, rg))))
        t.note("A stack PATCH while the ASG's nested stack is scaling from a signal:")
        asg = c.nested(sid, "asg")
        before = c.stack(asg)["updated_time"]
        n0 = len(members(c, asg))
        c.raw("POST", c.heat("stacks/%s/resources/scale_up/signal" % sid), {"reason": "up"})
        t0 = time.time()
        while time.time() - t0 < 10 and c.stack(asg)["stack_status"] != "UPDATE_IN_PROGRESS":
            time.sleep(0.1)
        t.note("%.1f s after the signal: ASG nested %s, top %s (ASG had %d members)" % (
            time.time() - t0, c.stack(asg)["stack_status"], c.stack(sid)["stack_status"], n0))
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}})
        seen = watch(c, sid, 30)
        t.note("Top stack seen: %s; ASG nested now %s; ASG members: %s" % (
            seen, c.stack(asg)["stack_status"], fmt(members(c, asg))))
    finally:
        c.delete_stack(sid, wait=120)


# ------------------------------------------------------------------ unhealthy

def unhealthy(c, t):
    for mode in ("signal", "patch"):
        sid = new_stack(c, "gs-unhealthy-" + mode, asg_max=5, asg_desired=3)
        try:
            asg = c.nested(sid, "asg")
            ms = members(c, asg)
            victim = ms[1][0]
            t.note("**%s**: ASG of 3: %s. Mark the middle one (`%s`) unhealthy in the nested "
                   "stack:" % ("mark-unhealthy + scale_down signal" if mode == "signal"
                               else "mark-unhealthy + PATCH {\"parameters\": {}}",
                               fmt(ms), victim))
            c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (asg, victim)),
                  {"mark_unhealthy": True, "resource_status_reason": "gearshift: drained"})
            t.note("Members now: %s" % fmt(members(c, asg)))
            if mode == "signal":
                before = c.stack(asg)["updated_time"]
                c.raw("POST", c.heat("stacks/%s/resources/scale_down/signal" % sid),
                      {"reason": "gearshift: remove %s" % victim})
                s, seen = wait_nested(c, asg, before)
            else:
                before = c.stack(sid)["updated_time"]
                c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}})
                s, seen = c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
            after = members(c, asg)
            old = {n for n, _, _ in ms}
            kept = [n for n, _, _ in after if n in old]
            new = [n for n, _, _ in after if n not in old]
            oldp = {n: p for n, p, _ in ms}
            replaced = [n for n, p, _ in after if n in oldp and oldp[n] != p]
            t.note("Statuses seen: %s. Members after: %s -> kept %s (replaced in place, new "
                   "physical id: %s), new %s, gone %s"
                   % (seen, fmt(after), kept, replaced, new, sorted(old - set(kept))))
            t.note("ASG events:\n\n```\n%s\n```" % "\n".join(group_events(c, sid, "asg")))
        finally:
            c.delete_stack(sid)
    sid = new_stack(c, "gs-unhealthy-rg", count=3)
    try:
        rg = c.nested(sid, "group")
        ms = members(c, rg)
        t.note("**ResourceGroup**: members %s with physical ids %s. Mark `1` unhealthy, then "
               "PATCH {\"parameters\": {}}:" % (fmt(ms), [p for _, p, _ in ms]))
        c.raw("PATCH", c.heat("stacks/%s/resources/1" % rg),
              {"mark_unhealthy": True, "resource_status_reason": "gearshift: drained"})
        before = c.stack(sid)["updated_time"]
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}}, record=False)
        c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
        after = members(c, rg)
        t.note("After: %s, physical ids %s (a marked ResourceGroup member is replaced under "
               "the same name, not removed)" % (fmt(after), [p for _, p, _ in after]))
        t.note("Mark `1` unhealthy again, then PATCH count 2 with removal_policies "
               "[{\"resource_list\": [\"1\"]}]:")
        c.raw("PATCH", c.heat("stacks/%s/resources/1" % rg),
              {"mark_unhealthy": True, "resource_status_reason": "gearshift: drained"},
              record=False)
        before = c.stack(sid)["updated_time"]
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {
            "count": 2, "removal_policies": [{"resource_list": ["1"]}]}}, record=False)
        c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
        t.note("After: %s" % fmt(members(c, rg)))
    finally:
        c.delete_stack(sid)


NO_DESIRED = TEMPLATE.replace("      desired_capacity: {get_param: asg_desired}\n", "")
assert NO_DESIRED != TEMPLATE


def asg_patch(c, t):
    t.note("### ASG with desired_capacity set (1)")
    asg_patch_one(c, t, TEMPLATE)
    t.note("### ASG without desired_capacity (as docs/heat/gearshift-autoscaling.yaml)")
    asg_patch_one(c, t, NO_DESIRED)


def asg_patch_one(c, t, template):
    sid = c.create_stack(ostest.unique("gs-asgpatch"), template, {"asg_max": 5, "asg_desired": 1})
    c.wait_stack(sid, timeout=180)
    try:
        asg = c.nested(sid, "asg")
        surl = c.heat("stacks/%s/resources/scale_up/signal" % sid)
        for i in range(3 - len(members(c, asg))):
            settle_signal(c, t, sid, asg, "scale_up",
                          lambda: c.raw("POST", surl, {"reason": "up"}, record=False),
                          "scale_up signal %d:" % (i + 1))
        ms = members(c, asg)
        t.note("ASG grown to %d by scale-up signals: %s" % (len(ms), fmtp(ms)))
        before = c.stack(sid)["updated_time"]
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}})
        s, seen = c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
        ms = members(c, asg)
        t.note("After PATCH {\"parameters\": {}}: %s; members %s" % (seen, fmtp(ms)))
        if len(ms) < 3:
            return
        victim = ms[1]
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (asg, victim[0])),
              {"mark_unhealthy": True, "resource_status_reason": "gearshift: drained"},
              record=False)
        before = c.stack(sid)["updated_time"]
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}}, record=False)
        s, seen = c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
        t.note("Marked the middle member `%s` unhealthy, then PATCH {\"parameters\": {}}: "
               "members %s" % (victim[0], fmtp(members(c, asg))))
    finally:
        c.delete_stack(sid)


MEMBER_TOP = """heat_template_version: 2018-08-31
parameters:
  count: {type: number, default: 2}
resources:
  group:
    type: OS::Heat::ResourceGroup
    properties:
      count: {get_param: count}
      resource_def:
        type: member.yaml
        properties: {index: "%index%"}
"""
MEMBER = """heat_template_version: 2018-08-31
parameters:
  index: {type: string}
resources:
  server:
    type: OS::Heat::TestResource
    properties:
      value: {list_join: ["", ["node-", {get_param: index}, ".example.com"]]}
"""


def member_template(c, t):
    """Members that are nested templates holding the server (nested_depth=2)."""
    sid = c.create_stack(ostest.unique("gs-membertpl"), MEMBER_TOP, files={"member.yaml": MEMBER})
    c.wait_stack(sid, timeout=180)
    try:
        t.note("ResourceGroup whose members are a provider template `member.yaml` holding one "
               "TestResource `server`. `GET stacks/{top}/resources?nested_depth=2`:")
        deep = c.resources(sid, 2)
        t.note("```\n" + "\n".join("%s %s physical=%s parent_resource=%s stack=%s" % (
            r["resource_name"], r["resource_type"], r["physical_resource_id"],
            r.get("parent_resource"),
            next(l["href"] for l in r["links"] if l["rel"] == "stack").split("/stacks/")[1])
            for r in deep) + "\n```")
        server = next(r for r in deep if r["resource_name"] == "server")
        member = server["parent_resource"]
        owner = next(r for r in deep if r["resource_name"] == member
                     and r.get("parent_resource") == "group")
        link = next(l["href"] for l in owner["links"] if l["rel"] == "stack")
        t.note("The server `%s` has parent_resource `%s`; the group member `%s` (type `%s`) "
               "lives in `%s`: gearshift's lookup (server -> its parent member -> the member "
               "whose parent_resource is the group) finds it." % (
                   server["physical_resource_id"], member, owner["resource_name"],
                   owner["resource_type"], link.split("/stacks/")[1]))
        nested = "/".join(link.rstrip("/").split("/")[-2:])
        c.raw("PATCH", c.heat("stacks/%s/resources/%s" % (nested, member)),
              {"mark_unhealthy": True, "resource_status_reason": "gearshift: drained"})
        t.note("Members now: %s" % fmt(members(c, nested)))
    finally:
        c.delete_stack(sid)


# ------------------------------------------------------------------ removal

def removal(c, t):
    sid = new_stack(c, "gs-removal", count=4)
    try:
        rg = c.nested(sid, "group")
        ms = members(c, rg)
        t.note("ResourceGroup of 4: %s" % fmt(ms))

        def patch(params, what):
            before = c.stack(sid)["updated_time"]
            t.note(what)
            c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": params})
            s, seen = c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
            t.note("-> %s; members %s; parameters.removal_policies %r, count %r" % (
                seen, fmt(members(c, rg)), s["parameters"]["removal_policies"],
                s["parameters"]["count"]))

        patch({"count": 3, "removal_policies": [{"resource_list": ["1"]}]},
              "count 4 -> 3 with removal_policies as a JSON list naming member `1` "
              "(the handler's body):")
        patch({"count": 4}, "count 3 -> 4 (scale-up after a removal: which name is new?):")
        phys = dict((n, p) for n, p, _ in members(c, rg))
        patch({"count": 3, "removal_policies": json.dumps([{"resource_list": ["2"]}])},
              "count 4 -> 3 with removal_policies as a JSON *string* naming `2`:")
        victim = sorted(n for n in phys if n in dict((m, 1) for m, _, _ in members(c, rg)))[0]
        patch({"count": 2, "removal_policies": [{"resource_list": [phys[victim]]}]},
              "count 3 -> 2 naming member `%s` by its physical_resource_id `%s`:"
              % (victim, phys[victim]))
        patch({"count": 2, "removal_policies": [{"resource_list": ["nosuch"]}]},
              "removal_policies naming a member that does not exist (count unchanged):")
        t.note("A removal_policies entry with another key:")
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {
            "removal_policies": [{"resource_list": ["0"], "extra": 1}]}})
        c.wait_stack(sid, want=("UPDATE_COMPLETE", "UPDATE_FAILED"), timeout=60)
        t.note("Stack after it: %s" % c.stack(sid)["stack_status"])
    finally:
        c.delete_stack(sid)


# ------------------------------------------------------------------ replace

def replace(c, t):
    for op_replaces in (False, True):
        sid = new_stack(c, "gs-replace", count=2, op="op-1", op_replaces=op_replaces)
        try:
            rg = c.nested(sid, "group")
            asg = c.nested(sid, "asg")
            b_rg, b_asg = members(c, rg), members(c, asg)
            before = c.stack(sid)["updated_time"]
            t.note("update_replace=%s (a property change %s): PATCH count 2 -> 3 and "
                   "op op-1 -> op-2 (the count mode's op_param):" % (
                       op_replaces, "replaces the member, as user_data does on a Nova server"
                       if op_replaces else "updates the member in place"))
            c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 3, "op": "op-2"}},
                  record=False)
            c.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before)
            a_rg, a_asg = members(c, rg), members(c, asg)
            t.note("ResourceGroup before %s -> after %s; physical ids changed for %s"
                   % ([(n, p) for n, p, _ in b_rg], [(n, p) for n, p, _ in a_rg],
                      [n for n, p, _ in b_rg if dict((x, y) for x, y, _ in a_rg).get(n) != p]))
            t.note("AutoScalingGroup before %s -> after %s"
                   % ([(n, p) for n, p, _ in b_asg], [(n, p) for n, p, _ in a_asg]))
        finally:
            c.delete_stack(sid)


# ------------------------------------------------------------------ appcred

def appcred(c, t):
    sid = new_stack(c, "gs-appcred", asg_max=5, asg_desired=1)
    try:
        rg = c.nested(sid, "group")
        for kind in ("appcred", "appcred-unrestricted"):
            a = ostest.Cloud(c.cfg, auth=kind, transcript=t)
            t.note("**%s** token:" % kind)
            a.raw("GET", a.heat("stacks/" + sid))
            a.raw("PATCH", a.heat("stacks/%s/resources/0" % rg),
                  {"mark_unhealthy": False, "resource_status_reason": "probe"})
            before = a.stack(sid)["updated_time"]
            a.raw("PATCH", a.heat("stacks/" + sid), {"parameters": {}})
            try:
                s, seen = a.wait_stack(sid, want=("UPDATE_COMPLETE",), after=before, timeout=60)
                t.note("update: %s" % seen)
            except RuntimeError as e:
                t.note("update: %s" % e)
            asg = a.nested(sid, "asg")
            before = a.stack(asg)["updated_time"]
            a.raw("POST", a.heat("stacks/%s/resources/scale_up/signal" % sid), {"reason": "ac"})
            try:
                wait_nested(a, asg, before, timeout=30)
                t.note("signal applied: ASG members %d" % len(members(a, asg)))
            except RuntimeError as e:
                t.note("signal: %s" % e)
            r = a.raw("POST", a.heat("stacks"), {"stack_name": ostest.unique("gs-ac-create"),
                                                 "template": TEMPLATE, "parameters": {}})
            if r.status_code == 201:
                new = "%s/%s" % (r.json()["stack"]["links"][0]["href"].split("/")[-2],
                                 r.json()["stack"]["id"])
                try:
                    s, seen = a.wait_stack(new, timeout=120)
                    t.note("stack create with this token: %s" % seen)
                except RuntimeError as e:
                    t.note("stack create with this token: %s" % e)
                c.delete_stack(new)
    finally:
        c.delete_stack(sid)


SCENARIOS = {"basics": basics, "alarm": alarm, "busy": busy, "patch_busy": patch_busy,
             "unhealthy": unhealthy, "asg_patch": asg_patch,
             "member_template": member_template,
             "removal": removal, "replace": replace, "appcred": appcred}


def main():
    names = sys.argv[1:] or list(SCENARIOS)
    for n in names:
        t = ostest.Transcript("Heat: " + n)
        c = ostest.Cloud(transcript=t)
        t0 = time.time()
        try:
            SCENARIOS[n](c, t)
        except (RuntimeError, requests.RequestException, KeyError) as e:
            t.note("**probe error**: %r" % e)
        t.note("(scenario took %.0f s)" % (time.time() - t0))
        t.dump(os.path.join(OUT, "heat-%s.md" % n))


if __name__ == "__main__":
    main()
