"""Probes on group members (see probe_heat.py for how to run them): mark-unhealthy, ASG
updates with and without desired_capacity, provider-template members, removal_policies,
member replacement, application credentials."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ostest  # noqa: E402
from heatprobe import (  # noqa: E402
    TEMPLATE, fmt, fmtp, group_events, members, new_stack, settle_signal, wait_nested)


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


SCENARIOS = {"unhealthy": unhealthy, "asg_patch": asg_patch, "member_template": member_template,
             "removal": removal, "replace": replace, "appcred": appcred}
