"""Small client for the loopback Keystone and Heat that scripts/setup-openstack runs.

Shared by check.py and the probe_*.py scripts. Every request can be recorded
(method, URL, request body, status, the headers that matter, response body)
so a probe prints exactly what the real services said; tokens and
signatures are shortened in the transcript.

Reads the state dir's openstack.json (GEARSHIFT_OPENSTACK_DIR, default
<repo>/target/openstack).
"""

import json
import os
import re
import sys
import time
import uuid

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE = os.environ.get("GEARSHIFT_OPENSTACK_DIR", os.path.join(ROOT, "target", "openstack"))
SHOWN_HEADERS = ("location", "content-type", "x-subject-token", "www-authenticate",
                 "x-openstack-request-id")


def load(state=None):
    with open(os.path.join(state or STATE, "openstack.json")) as f:
        return json.load(f)


def short(text):
    """Shortens tokens, signatures and secrets in a transcript line."""
    text = re.sub(r"gAAAAA[A-Za-z0-9_\-=]{20,}", "gAAAAA<token>", text)
    text = re.sub(r"(Signature=)[A-Za-z0-9%+/=]+", r"\1<sig>", text)
    text = re.sub(r'("(?:password|secret)": )"[^"]*"', r'\1"<redacted>"', text)
    return text


class Transcript:
    """Collects request/response pairs of one probe, printed as Markdown."""

    def __init__(self, title):
        self.title = title
        self.lines = ["## " + title, ""]

    def note(self, text):
        self.lines += [text, ""]

    def add(self, method, url, req_headers, body, resp, max_body=1800):
        shown = {k: v for k, v in req_headers.items()
                 if k.lower() in ("content-type", "x-auth-token")}
        lines = ["```", "%s %s" % (method, url)]
        lines += ["%s: %s" % (k, v) for k, v in shown.items()]
        if body is not None:
            lines.append(json.dumps(body) if not isinstance(body, str) else body)
        lines.append("-> %d %s" % (resp.status_code, resp.reason))
        for k in SHOWN_HEADERS:
            if k in resp.headers and k != "x-openstack-request-id":
                lines.append("%s: %s" % (k, resp.headers[k]))
        text = resp.text
        try:
            text = json.dumps(resp.json(), sort_keys=True)
        except ValueError:
            pass
        if len(text) > max_body:
            text = text[:max_body] + " ...(%d bytes)" % len(resp.content)
        lines.append(text if text else "(empty body)")
        lines.append("```")
        self.lines += [short(x) for x in lines] + [""]

    def dump(self, path=None):
        out = "\n".join(self.lines)
        print(out)
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(out + "\n")


class Cloud:
    """A project-scoped session (password or application credential)."""

    def __init__(self, cfg=None, auth="password", transcript=None):
        self.cfg = cfg or load()
        self.auth = auth
        self.t = transcript
        self.http = requests.Session()
        self.token = None
        self.body = None

    # -- raw requests -------------------------------------------------

    def raw(self, method, url, body=None, token=True, headers=None, record=True, data=None,
            allow_redirects=False, timeout=30):
        h = dict(headers or {})
        if token:
            h["X-Auth-Token"] = self.get_token()
        if body is not None:
            h.setdefault("Content-Type", "application/json")
            data = json.dumps(body)
        r = self.http.request(method, url, data=data, headers=h, timeout=timeout,
                              allow_redirects=allow_redirects)
        if record and self.t is not None:
            self.t.add(method, url, h, body if body is not None else data, r)
        return r

    # -- Keystone -----------------------------------------------------

    def token_body(self, kind=None, scope=True):
        c = self.cfg
        kind = kind or self.auth
        if kind == "password":
            ident = {"methods": ["password"], "password": {"user": {
                "name": c["user"]["username"], "domain": {"id": "default"},
                "password": c["user"]["password"]}}}
            auth = {"identity": ident}
            if scope:
                auth["scope"] = {"project": {"id": c["project"]["id"]}}
        elif kind == "admin":
            a = c["admin"]
            auth = {"identity": {"methods": ["password"], "password": {"user": {
                "name": a["username"], "domain": {"id": "default"}, "password": a["password"]}}},
                "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}
        else:
            ac = c["application_credentials"]["unrestricted" if kind == "appcred-unrestricted"
                                              else "restricted"]
            auth = {"identity": {"methods": ["application_credential"],
                                 "application_credential": {"id": ac["id"],
                                                            "secret": ac["secret"]}}}
        return {"auth": auth}

    def get_token(self):
        if self.token is None:
            r = self.http.post(self.cfg["auth_url"] + "/auth/tokens", json=self.token_body(),
                               timeout=30)
            if r.status_code != 201:
                raise RuntimeError("Keystone refused %s auth: %d %s"
                                   % (self.auth, r.status_code, r.text[:300]))
            self.token = r.headers["X-Subject-Token"]
            self.body = r.json()["token"]
        return self.token

    def endpoint(self, stype, interface="public"):
        self.get_token()
        for svc in self.body.get("catalog", []):
            if svc["type"] == stype:
                for ep in svc["endpoints"]:
                    if ep["interface"] == interface:
                        return ep["url"].rstrip("/")
        raise RuntimeError("no %s endpoint in the catalog" % stype)

    # -- Heat ---------------------------------------------------------

    def heat(self, path):
        return self.endpoint("orchestration") + "/" + path.lstrip("/")

    def create_stack(self, name, template, parameters=None, record=False, files=None):
        # Heat 27's engine once answered 500 (RemoteError: identity:create_trust
        # "requires a scope of ['project'], request was made with domain scope")
        # right after another stack's delete: retried, and noted in the doc.
        for attempt in range(3):
            r = self.raw("POST", self.heat("stacks"), {
                "stack_name": name, "template": template, "parameters": parameters or {},
                "disable_rollback": True, "timeout_mins": 10, "files": files or {}},
                record=record)
            if r.status_code != 500:
                break
            print("create_stack: 500 %s; retrying" % r.text[:200], file=sys.stderr)
            time.sleep(2)
        if r.status_code != 201:
            raise RuntimeError("stack create: %d %s" % (r.status_code, r.text[:500]))
        return "%s/%s" % (name, r.json()["stack"]["id"])

    def stack(self, sid, record=False):
        r = self.raw("GET", self.heat("stacks/" + sid), record=record)
        if r.status_code != 200:
            raise RuntimeError("stack get %s: %d %s" % (sid, r.status_code, r.text[:300]))
        return r.json()["stack"]

    def wait_stack(self, sid, timeout=120, want=("CREATE_COMPLETE", "UPDATE_COMPLETE"),
                   after=None, poll=0.5):
        """Polls until the stack reaches one of `want` (and, when `after` is
        given, its updated_time differs from it). FAILED raises."""
        deadline = time.time() + timeout
        seen = []
        while True:
            s = self.stack(sid)
            st = s["stack_status"]
            if not seen or seen[-1] != st:
                seen.append(st)
            changed = after is None or s.get("updated_time") != after
            if st in want and changed:
                return s, seen
            if st.endswith("FAILED") and changed:
                raise RuntimeError("stack %s %s: %s" % (sid, st, s.get("stack_status_reason")))
            if time.time() > deadline:
                raise RuntimeError("stack %s still %s after %ds (seen %s)"
                                   % (sid, st, timeout, seen))
            time.sleep(poll)

    def delete_stack(self, sid, wait=60):
        r = self.raw("DELETE", self.heat("stacks/" + sid), record=False)
        if r.status_code not in (204, 404):
            raise RuntimeError("stack delete: %d %s" % (r.status_code, r.text[:300]))
        deadline = time.time() + wait
        while time.time() < deadline:
            r = self.raw("GET", self.heat("stacks/" + sid), record=False)
            if r.status_code == 404 or r.json()["stack"]["stack_status"] == "DELETE_COMPLETE":
                return
            if r.json()["stack"]["stack_status"] == "DELETE_FAILED":
                raise RuntimeError("stack delete failed: %s" % r.json()["stack"])
            time.sleep(0.5)
        raise RuntimeError("stack %s not deleted within %ds" % (sid, wait))

    def resources(self, sid, nested_depth=0, record=False):
        r = self.raw("GET", self.heat("stacks/%s/resources?nested_depth=%d" % (sid, nested_depth)),
                     record=record)
        if r.status_code != 200:
            raise RuntimeError("resources: %d %s" % (r.status_code, r.text[:300]))
        return r.json()["resources"]

    def nested(self, sid, group):
        """The `name/id` of a group resource's nested stack."""
        for res in self.resources(sid):
            if res["resource_name"] == group:
                for link in res["links"]:
                    if link["rel"] == "nested":
                        return "/".join(link["href"].rstrip("/").split("/")[-2:])
                return res["physical_resource_id"]
        raise RuntimeError("no resource %s in %s" % (group, sid))

    def members(self, nested_sid):
        """Members of a group's nested stack: name -> (status, value attribute)."""
        out = {}
        for res in self.resources(nested_sid):
            out[res["resource_name"]] = res["resource_status"]
        return out

    def outputs(self, sid):
        return {o["output_key"]: o.get("output_value") for o in self.stack(sid).get("outputs", [])}

    def events(self, sid, resource=None, record=False):
        path = "stacks/%s/events" % sid
        if resource:
            path = "stacks/%s/resources/%s/events" % (sid, resource)
        r = self.raw("GET", self.heat(path + "?sort_dir=asc&limit=200"), record=record)
        return r.json().get("events", [])


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:6])


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)
