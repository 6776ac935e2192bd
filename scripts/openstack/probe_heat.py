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


def policy_events(c, sid, policy, since=0):
    ev = c.events(sid, policy)
    return ["%s %s: %s" % (e["resource_action"], e["resource_status"],
                           e.get("resource_status_reason")) for e in ev][since:]


def group_events(c, sid, group):
    ev = c.events(sid, group)
    return ["%s %s: %s" % (e["resource_action"], e["resource_status"],
                           e.get("resource_status_reason")) for e in ev]


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

        def scaled(before, what):
            s, seen = wait_nested(c, asg, before)
            t.note("%s: ASG nested stack went %s; members: %s" % (what, seen, fmt(members(c, asg))))

        t.note("POST alarm_url, no body, no token:")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", url, token=False)
        scaled(before, "after the alarm_url POST")
        t.note("Tampered signature, missing Signature, GET instead of POST, and with a "
               "(valid) X-Auth-Token added:")
        bad = url.replace("Signature=", "Signature=AAAA")
        c.raw("POST", bad, token=False)
        nosig = "&".join(p for p in url.split("&") if not p.startswith("Signature="))
        c.raw("POST", nosig, token=False)
        c.raw("GET", url, token=False)
        r = c.raw("POST", url, token=True)
        if r.status_code == 200:
            before = c.stack(asg)["updated_time"]
            scaled(None, "after the POST with a token")
        t.note("Unsigned path without a query at all:")
        c.raw("POST", url.split("?")[0], token=False)

        t.note("signal_url: without a token, then with the user's token and gearshift's "
               "bodies. Events of the policy after each (GET stacks/{sid}/resources/scale_up/events):")
        surl = outs["scale_up_signal_url"]
        c.raw("POST", surl, {"reason": "x"}, token=False)
        bodies = [
            ("no body (node agent's scale_up/scale_down alarm_url form)", None),
            ("handler's {\"reason\"}", {"reason": "gearshift d1: scale up small (op 42)"}),
            ("node agent's {\"host\", \"reason\"}", {"host": "node-1.example.com",
                                                     "reason": "gearshift: scale up"}),
            ("Aodh-shaped", {"alarm_id": "a1", "current": "alarm", "previous": "ok",
                             "reason": "gear usage above 80%", "reason_data": {}}),
            ("Aodh-shaped, current=ok", {"alarm_id": "a1", "current": "ok", "previous": "alarm",
                                         "reason": "back to normal", "reason_data": {}}),
        ]
        n = len(c.events(sid, "scale_up"))
        for what, body in bodies:
            before = c.stack(asg)["updated_time"]
            t.note("signal_url with %s:" % what)
            if body is None:
                r = c.raw("POST", surl)
            else:
                r = c.raw("POST", surl, body)
            try:
                wait_nested(c, asg, before, timeout=30)
            except RuntimeError as e:
                t.note("(no ASG update: %s)" % e)
            ev = policy_events(c, sid, "scale_up", n)
            n += len(ev)
            t.note("New policy events:\n\n```\n%s\n```\nMembers: %s"
                   % ("\n".join(ev), len(members(c, asg))))
        t.note("alarm_url POST with a JSON body (the handler's `{\"reason\"}`), then its events:")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", url, {"reason": "gearshift d1: scale up small (op 43)"}, token=False)
        wait_nested(c, asg, before, timeout=30)
        t.note("```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_up", n)))
        t.note("Native signal API of the policy (`POST stacks/{sid}/resources/scale_up/signal`):")
        before = c.stack(asg)["updated_time"]
        n = len(c.events(sid, "scale_up"))
        c.raw("POST", c.heat("stacks/%s/resources/scale_up/signal" % sid),
              {"reason": "gearshift d1: scale up small (op 44)"})
        wait_nested(c, asg, before, timeout=30)
        t.note("```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_up", n)))
        t.note("ASG group events (GET stacks/{sid}/resources/asg/events):\n\n```\n%s\n```"
               % "\n".join(group_events(c, sid, "asg")))
    finally:
        c.delete_stack(sid)


# ------------------------------------------------------------------ busy

def busy(c, t):
    sid = new_stack(c, "gs-busy", asg_max=3, asg_desired=1, member_wait=6)
    try:
        asg = c.nested(sid, "asg")
        surl = c.heat("stacks/%s/resources/scale_up/signal" % sid)
        t.note("ASG of 1 (max 3), each member's create takes 6 s. Two scale-up signals 1 s "
               "apart:")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", surl, {"reason": "first"})
        time.sleep(1)
        st = c.stack(asg)
        t.note("Nested stack during the scaling: %s; top stack: %s" % (
            st["stack_status"], c.stack(sid)["stack_status"]))
        c.raw("POST", surl, {"reason": "second, while scaling"})
        wait_nested(c, asg, before)
        time.sleep(2)
        t.note("Members after both: %s" % fmt(members(c, asg)))
        t.note("Policy events:\n\n```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_up")))
        t.note("Scale up to max (3), then one more signal at max_size:")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", surl, {"reason": "to max"}, record=False)
        wait_nested(c, asg, before)
        n = len(c.events(sid, "scale_up"))
        c.raw("POST", surl, {"reason": "at max_size"})
        time.sleep(3)
        t.note("Members: %s; nested stack %s" % (len(members(c, asg)), c.stack(asg)["stack_status"]))
        t.note("Policy events:\n\n```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_up", n)))
        t.note("The same through the pre-signed alarm_url at max_size:")
        n = len(c.events(sid, "scale_up"))
        c.raw("POST", c.outputs(sid)["scale_up_alarm_url"], token=False)
        time.sleep(3)
        t.note("Policy events:\n\n```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_up", n)))
    finally:
        c.delete_stack(sid)
    sid = new_stack(c, "gs-cooldown", asg_max=5, asg_desired=1, cooldown=300)
    try:
        asg = c.nested(sid, "asg")
        surl = c.heat("stacks/%s/resources/scale_up/signal" % sid)
        t.note("Policy cooldown 300 s: a scale-up, then a second one after it completed:")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", surl, {"reason": "first"})
        wait_nested(c, asg, before)
        c.raw("POST", surl, {"reason": "in cooldown"})
        time.sleep(3)
        t.note("Members: %s" % len(members(c, asg)))
        t.note("Policy events:\n\n```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_up")))
        t.note("At min_size (1 member left after a scale-down? no: 2 now) - scale_down twice "
               "(cooldown applies to scale_down separately):")
        sd = c.heat("stacks/%s/resources/scale_down/signal" % sid)
        before = c.stack(asg)["updated_time"]
        c.raw("POST", sd, {"reason": "down"})
        wait_nested(c, asg, before)
        c.raw("POST", sd, {"reason": "down again (cooldown and min_size)"})
        time.sleep(3)
        t.note("Members: %s" % len(members(c, asg)))
        t.note("scale_down events:\n\n```\n%s\n```" % "\n".join(policy_events(c, sid, "scale_down")))
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
        seen = []
        deadline = time.time() + 120
        while time.time() < deadline:
            s = c.stack(sid)
            if not seen or seen[-1] != s["stack_status"]:
                seen.append(s["stack_status"])
            if s["stack_status"] in ("UPDATE_COMPLETE", "UPDATE_FAILED") and len(seen) > 1:
                break
            time.sleep(0.5)
        time.sleep(8)
        s = c.stack(sid)
        t.note("Statuses seen: %s; final %s (%s); count %r; members: %s" % (
            seen, s["stack_status"], s["stack_status_reason"], s["parameters"]["count"],
            fmt(members(c, rg))))
        t.note("The same race as gearshift's count mode runs it: two clients read count=3, "
               "each PATCHes count+1=4 while the other's update runs:")
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 4}})
        time.sleep(1)
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {"count": 4}})
        c.wait_stack(sid, want=("UPDATE_COMPLETE",), timeout=120)
        time.sleep(8)
        s = c.stack(sid)
        t.note("Final %s, count %r, members: %s (one node asked twice, one added)" % (
            s["stack_status"], s["parameters"]["count"], fmt(members(c, rg))))
        t.note("A stack PATCH while the ASG's nested stack is scaling from a signal:")
        asg = c.nested(sid, "asg")
        before = c.stack(asg)["updated_time"]
        c.raw("POST", c.heat("stacks/%s/resources/scale_up/signal" % sid), {"reason": "up"})
        time.sleep(1)
        t.note("ASG nested: %s, top: %s" % (c.stack(asg)["stack_status"],
                                            c.stack(sid)["stack_status"]))
        c.raw("PATCH", c.heat("stacks/" + sid), {"parameters": {}})
        c.wait_stack(sid, want=("UPDATE_COMPLETE",), timeout=120)
        time.sleep(8)
        t.note("Top %s; ASG members: %s" % (c.stack(sid)["stack_status"], fmt(members(c, asg))))
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
            t.note("Statuses seen: %s. Members after: %s -> kept %s, new %s, gone %s"
                   % (seen, fmt(after), kept, new, sorted(old - set(kept))))
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
                   % ([n for n, _, _ in b_asg], [n for n, _, _ in a_asg]))
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
             "unhealthy": unhealthy, "removal": removal, "replace": replace, "appcred": appcred}


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
