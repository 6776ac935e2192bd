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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ostest  # noqa: E402
import requests  # noqa: E402

from heatprobe import (  # noqa: E402
    OUT, asg_metadata, fmt, group_events, members, new_stack, policy_events, settle,
    settle_signal, wait_nested, watch)
import probe_heat_members  # noqa: E402


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


SCENARIOS = {"basics": basics, "alarm": alarm, "busy": busy, "patch_busy": patch_busy}
SCENARIOS.update(probe_heat_members.SCENARIOS)


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
