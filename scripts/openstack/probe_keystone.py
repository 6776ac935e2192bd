"""Probe: Keystone v3 token requests as gearshift sends them (cloud/src/auth.rs).

Prints a Markdown transcript (also written to <state>/probes/keystone.md):
password auth scoped by project id and by name, the catalog, application
credentials without and with a scope (the "misscoped" case), bad secrets,
a user named without its domain, and token validation.
"""

import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ostest  # noqa: E402


def main():
    cfg = ostest.load()
    t = ostest.Transcript("Keystone: POST /v3/auth/tokens")
    c = ostest.Cloud(cfg, transcript=t)
    url = cfg["auth_url"] + "/auth/tokens"
    u = cfg["user"]
    p = cfg["project"]
    ac = cfg["application_credentials"]["restricted"]

    def post(note, body):
        t.note(note)
        return c.raw("POST", url, body, token=False)

    pw = {"methods": ["password"], "password": {"user": {
        "name": u["username"], "domain": {"id": "default"}, "password": u["password"]}}}
    r = post("Password, project scope by id (what gearshift sends with OS_PROJECT_ID):",
             {"auth": {"identity": pw, "scope": {"project": {"id": p["id"]}}}})
    tok = r.headers.get("X-Subject-Token")
    cat = r.json()["token"]["catalog"]
    t.note("Catalog of that token (type, name, interface -> url):\n\n```\n" + "\n".join(
        "%s %s %s -> %s" % (s["type"], s["name"], e["interface"], e["url"])
        for s in cat for e in s["endpoints"]) + "\n```")
    t.note("Token body keys: `%s`; roles: `%s`" % (
        sorted(r.json()["token"].keys()),
        sorted(x["name"] for x in r.json()["token"]["roles"])))
    post("Password, project scope by name with domain name (OS_PROJECT_NAME + "
         "OS_PROJECT_DOMAIN_NAME):",
         {"auth": {"identity": {"methods": ["password"], "password": {"user": {
             "name": u["username"], "domain": {"name": "Default"},
             "password": u["password"]}}},
             "scope": {"project": {"name": p["name"], "domain": {"name": "Default"}}}}})
    bad = copy.deepcopy(pw)
    bad["password"]["user"]["password"] = "wrong"
    post("Wrong password:", {"auth": {"identity": bad, "scope": {"project": {"id": p["id"]}}}})
    nodom = copy.deepcopy(pw)
    del nodom["password"]["user"]["domain"]
    post("User by name without a domain:",
         {"auth": {"identity": nodom, "scope": {"project": {"id": p["id"]}}}})
    post("Project by name without a domain:",
         {"auth": {"identity": pw, "scope": {"project": {"name": p["name"]}}}})
    r = post("Password, no scope:", {"auth": {"identity": pw}})
    t.note("Without a scope Keystone scoped the token to the user's default project: "
           "project `%s`, catalog entries %d." % (r.json()["token"].get("project", {}).get("id"),
                                                 len(r.json()["token"].get("catalog", []))))

    acid = {"methods": ["application_credential"],
            "application_credential": {"id": ac["id"], "secret": ac["secret"]}}
    r = post("Application credential by id, no scope (what gearshift sends):", {"auth": {"identity": acid}})
    t.note("Its token: project `%s`, roles `%s`, application_credential `%s`" % (
        r.json()["token"].get("project", {}).get("id"),
        sorted(x["name"] for x in r.json()["token"]["roles"]),
        r.json()["token"].get("application_credential")))
    post("Application credential by name + user (id) + secret:",
         {"auth": {"identity": {"methods": ["application_credential"],
                                "application_credential": {"name": ac.get("name", "gearshift-test"),
                                                           "user": {"id": u["id"]},
                                                           "secret": ac["secret"]}}}})
    post("Application credential with a scope naming its own project "
         "(cloud/src/auth.rs adds `scope` whenever a project is configured too):",
         {"auth": {"identity": acid, "scope": {"project": {"id": p["id"]}}}})
    post("Application credential with a scope naming another project (admin):",
         {"auth": {"identity": acid, "scope": {"project": {"name": "admin",
                                                            "domain": {"id": "default"}}}}})
    wrong = copy.deepcopy(acid)
    wrong["application_credential"]["secret"] = "wrong"
    post("Application credential, wrong secret:", {"auth": {"identity": wrong}})
    gone = copy.deepcopy(acid)
    gone["application_credential"]["id"] = "0" * 32
    post("Application credential, unknown id:", {"auth": {"identity": gone}})

    t.note("Token validation (GET /v3/auth/tokens with X-Subject-Token) and a garbage token:")
    c.raw("GET", url, token=False, headers={"X-Auth-Token": tok, "X-Subject-Token": tok})
    c.raw("GET", c.heat("stacks"), token=False, headers={"X-Auth-Token": "gAAAAAnotatoken"})
    t.dump(os.path.join(ostest.STATE, "probes", "keystone.md"))


if __name__ == "__main__":
    main()
