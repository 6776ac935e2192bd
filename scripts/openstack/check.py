"""Readiness and smoke check of the loopback Keystone + Heat.

    check.py --engine [--wait N]   waits until a token works and heat-engine
                                   answers a stack list over RPC
    check.py --stack               creates templates/groups.yaml (a ResourceGroup
                                   of 2 and an AutoScalingGroup of 2 TestResource
                                   members with scaling policies), scales the ASG
                                   up through the pre-signed alarm_url, checks the
                                   member counts, deletes the stack
"""

import argparse
import os
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ostest  # noqa: E402

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "groups.yaml")


def wait_engine(state, wait):
    deadline = time.time() + wait
    last = ""
    while time.time() < deadline:
        try:
            c = ostest.Cloud(ostest.load(state))
            r = c.raw("GET", c.heat("stacks"), timeout=10)
            if r.status_code == 200:
                return True
            last = "%d %s" % (r.status_code, r.text[:200])
        except (requests.RequestException, RuntimeError, OSError, KeyError) as e:
            last = str(e)
        time.sleep(1)
    print("check: no stack list within %ds: %s" % (wait, last), file=sys.stderr)
    return False


def smoke(state):
    t0 = time.time()
    c = ostest.Cloud(ostest.load(state))
    with open(TEMPLATE) as f:
        tmpl = f.read()
    sid = c.create_stack(ostest.unique("gs-check"), tmpl)
    try:
        c.wait_stack(sid, timeout=120)
        rg = c.members(c.nested(sid, "group"))
        asg_stack = c.nested(sid, "asg")
        asg = c.members(asg_stack)
        if sorted(rg) != ["0", "1"] or len(asg) != 2:
            ostest.fail("unexpected members: group %s, asg %s" % (rg, asg))
        url = c.outputs(sid)["scale_up_alarm_url"]
        before = c.stack(asg_stack).get("updated_time")
        r = requests.post(url, timeout=30)
        if r.status_code != 200:
            ostest.fail("alarm_url POST: %d %s" % (r.status_code, r.text[:300]))
        c.wait_stack(asg_stack, timeout=60, want=("UPDATE_COMPLETE",), after=before)
        asg = c.members(asg_stack)
        if len(asg) != 3:
            ostest.fail("after scale-up the ASG has %d members: %s" % (len(asg), asg))
        print("check: stack %s: ResourceGroup members %s, ASG grew 2 -> 3 through alarm_url"
              % (sid, sorted(rg)))
    finally:
        c.delete_stack(sid)
    print("check: ok in %.1f s" % (time.time() - t0))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state", default=ostest.STATE)
    p.add_argument("--engine", action="store_true")
    p.add_argument("--stack", action="store_true")
    p.add_argument("--wait", type=int, default=90)
    a = p.parse_args()
    if a.engine and not wait_engine(a.state, a.wait):
        sys.exit(1)
    if a.stack:
        smoke(a.state)


if __name__ == "__main__":
    main()
