"""Registers what gearshift's tests need in a freshly bootstrapped Keystone.

Run by scripts/setup-openstack with the virtualenv's Python, after
`keystone-manage bootstrap` and once Keystone answers. Idempotent: every
entity is looked up by name first and created only when missing.

- catalog: `orchestration` (heat, http://127.0.0.1:8004/v1/%(tenant_id)s)
  and `cloudformation` (heat-cfn, http://127.0.0.1:8000/v1), public,
  internal and admin, in RegionOne (identity comes from bootstrap);
- the `service` project and Heat's service user `heat` (admin there);
- roles `heat_stack_owner` and `heat_stack_user`;
- the stack user domain `heat` and its admin `heat_domain_admin` (Heat
  creates one user per scaling policy there, whose EC2 keys sign alarm URLs);
- the test project `gearshift` and user `gearshift` with `member` and
  `heat_stack_owner`;
- application credentials of that user: `gearshift-test` (restricted, the
  default) and `gearshift-test-unrestricted` (may create trusts);
  their secrets are only shown at creation, so one is created again (after
  deleting the old one) when the state dir has no working secret.

Writes $STATE/openstack.json, $STATE/password.env and $STATE/appcred.env.
Input from the environment: STATE, ADMIN_PASSWORD, HEAT_PASSWORD,
HEAT_DOMAIN_ADMIN_PASSWORD, TEST_PASSWORD, KEYSTONE_URL, HEAT_URL, CFN_URL.
"""

import json
import os
import sys

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client as ks_client

E = os.environ
STATE = E["STATE"]
KEYSTONE = E.get("KEYSTONE_URL", "http://127.0.0.1:5000")
AUTH_URL = KEYSTONE + "/v3"
HEAT = E.get("HEAT_URL", "http://127.0.0.1:8004")
CFN = E.get("CFN_URL", "http://127.0.0.1:8000")
REGION = "RegionOne"


def admin_client():
    auth = v3.Password(
        auth_url=AUTH_URL,
        username="admin",
        password=E["ADMIN_PASSWORD"],
        user_domain_id="default",
        project_name="admin",
        project_domain_id="default",
    )
    return ks_client.Client(session=ks_session.Session(auth=auth))


def find(manager, name, **kw):
    for x in manager.list(**kw):
        if x.name == name:
            return x
    return None


def ensure(manager, name, list_kw=None, **create_kw):
    x = find(manager, name, **(list_kw or {}))
    return x if x else manager.create(name=name, **create_kw)


def ensure_user(ks, name, domain, password, project=None):
    u = find(ks.users, name, domain=domain)
    if u is None:
        return ks.users.create(name=name, domain=domain, password=password, default_project=project)
    # Keep the password what the state dir says (it may have been regenerated).
    ks.users.update(u, password=password, enabled=True)
    return u


def ensure_service(ks, name, stype, url, description):
    svc = next((s for s in ks.services.list(type=stype) if s.name == name), None)
    if svc is None:
        svc = ks.services.create(name=name, type=stype, description=description)
    have = {(e.interface, e.url) for e in ks.endpoints.list(service=svc, region_id=REGION)}
    for iface in ("public", "internal", "admin"):
        if (iface, url) not in have:
            for e in ks.endpoints.list(service=svc, interface=iface, region_id=REGION):
                ks.endpoints.delete(e)
            ks.endpoints.create(service=svc, url=url, interface=iface, region=REGION)
    return svc


def app_cred(user_id, project_id, name, unrestricted, saved):
    """An application credential of the test user, created with its own token."""
    def works(cid, secret):
        try:
            s = ks_session.Session(
                auth=v3.ApplicationCredential(
                    auth_url=AUTH_URL, application_credential_id=cid,
                    application_credential_secret=secret))
            s.get_token()
            return True
        except ks_exc.ClientException:
            return False

    if saved and works(saved["id"], saved["secret"]):
        return saved
    auth = v3.Password(auth_url=AUTH_URL, username="gearshift", password=E["TEST_PASSWORD"],
                       user_domain_id="default", project_id=project_id)
    ks = ks_client.Client(session=ks_session.Session(auth=auth))
    for ac in ks.application_credentials.list(user=user_id):
        if ac.name == name:
            ks.application_credentials.delete(ac)
    ac = ks.application_credentials.create(
        name=name, user=user_id, unrestricted=unrestricted,
        description="gearshift conformance tests (scripts/setup-openstack)")
    return {"id": ac.id, "name": ac.name, "secret": ac.secret, "unrestricted": unrestricted}


def main():
    ks = admin_client()
    default = ks.domains.get("default")
    roles = {n: ensure(ks.roles, n) for n in
             ("admin", "member", "reader", "heat_stack_owner", "heat_stack_user")}

    ensure_service(ks, "heat", "orchestration", HEAT + "/v1/%(tenant_id)s",
                   "Heat orchestration (gearshift tests)")
    ensure_service(ks, "heat-cfn", "cloudformation", CFN + "/v1",
                   "Heat CloudFormation API (gearshift tests)")

    service = ensure(ks.projects, "service", list_kw={"domain": default}, domain=default)
    heat_user = ensure_user(ks, "heat", default, E["HEAT_PASSWORD"], service)
    ks.roles.grant(roles["admin"], user=heat_user, project=service)

    heat_domain = ensure(ks.domains, "heat", description="Heat stack users (gearshift tests)")
    dom_admin = ensure_user(ks, "heat_domain_admin", heat_domain, E["HEAT_DOMAIN_ADMIN_PASSWORD"])
    ks.roles.grant(roles["admin"], user=dom_admin, domain=heat_domain)

    project = ensure(ks.projects, "gearshift", list_kw={"domain": default}, domain=default,
                     description="gearshift conformance tests")
    user = ensure_user(ks, "gearshift", default, E["TEST_PASSWORD"], project)
    for r in ("member", "heat_stack_owner"):
        ks.roles.grant(roles[r], user=user, project=project)

    path = os.path.join(STATE, "openstack.json")
    saved = {}
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
    creds = saved.get("application_credentials", {})
    acs = {
        "restricted": app_cred(user.id, project.id, "gearshift-test", False,
                               creds.get("restricted")),
        "unrestricted": app_cred(user.id, project.id, "gearshift-test-unrestricted", True,
                                 creds.get("unrestricted")),
    }
    out = {
        "auth_url": AUTH_URL,
        "region": REGION,
        "heat_url": HEAT + "/v1/" + project.id,
        "cfn_url": CFN + "/v1",
        "admin": {"username": "admin", "password": E["ADMIN_PASSWORD"], "project_name": "admin",
                  "user_domain_id": "default", "project_domain_id": "default"},
        "user": {"id": user.id, "username": "gearshift", "password": E["TEST_PASSWORD"],
                 "user_domain_id": "default"},
        "project": {"id": project.id, "name": "gearshift", "domain_id": "default"},
        "heat_stack_domain": {"id": heat_domain.id, "name": "heat"},
        "application_credentials": acs,
    }
    tmp = path + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(out, f, indent=2)
    os.replace(tmp, path)

    common = ["OS_AUTH_URL=%s" % AUTH_URL, "OS_REGION_NAME=%s" % REGION,
              "OS_INTERFACE=public", "OS_IDENTITY_API_VERSION=3"]
    write_env("password.env", common + [
        "OS_AUTH_TYPE=password", "OS_USERNAME=gearshift", "OS_PASSWORD=%s" % E["TEST_PASSWORD"],
        "OS_USER_DOMAIN_NAME=Default", "OS_PROJECT_NAME=gearshift",
        "OS_PROJECT_DOMAIN_NAME=Default"])
    write_env("appcred.env", common + [
        "OS_AUTH_TYPE=v3applicationcredential",
        "OS_APPLICATION_CREDENTIAL_ID=%s" % acs["restricted"]["id"],
        "OS_APPLICATION_CREDENTIAL_SECRET=%s" % acs["restricted"]["secret"]])
    print("bootstrap: project %s, user %s, application credential %s"
          % (project.id, user.id, acs["restricted"]["id"]))


def write_env(name, lines):
    path = os.path.join(STATE, name)
    with open(os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("# written by scripts/setup-openstack; loopback test cloud only\n")
        f.write("".join("export %s\n" % line for line in lines))
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    try:
        main()
    except ks_exc.ClientException as e:
        sys.exit("bootstrap: %s" % e)
