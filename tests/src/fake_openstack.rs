//! An in-process fake OpenStack (Keystone v3, Heat and its cfn signal
//! endpoint, Nova, Cinder, Glance and Neutron look-ups, Magnum) for tests.
//!
//! It stands in for the one thing that cannot run here, and it is strict:
//! every request is checked against the real API's documented shape (URL,
//! method, `X-Auth-Token`, JSON body, microversion headers where needed).
//! A request that does not fit is answered `400` in the API's error format
//! **and** recorded as a violation, so a test fails loudly with
//! [`FakeOpenStack::assert_no_violations`] even when the client swallowed
//! the error. Answers follow the API references (status codes, bodies,
//! headers such as `X-Subject-Token`), errors included: Keystone `401`,
//! Nova `403 forbidden` "Quota exceeded for instances: Requested 1, but
//! already used N of M instances", Cinder `413 overLimit`, Magnum's
//! `errors` list.
//!
//! Keystone and Heat follow what the real services did when measured
//! (Keystone 30, Heat 27: `docs/openstack-conformance.md`, whose last
//! sections list where this fake differed and what changed): a password
//! request without a scope gets a token for the user's project; an
//! application credential with a scope is `401` ("Application credentials
//! cannot request a scope."), by name and user it works, an unknown one is
//! `404`; for Heat see the `heat` module.
//!
//! ## Use
//! ```ignore
//! let os = FakeOpenStack::start().await;          // 127.0.0.1:0
//! let creds = os.credentials();                   // password, project-scoped
//! // or: os.env_vars() -> OS_* pairs, os.app_credential_env_vars()
//! let stack = os.add_stack(FakeStack::asg("nodes", "node-", 2));
//! let alarm = os.alarm_url(&stack, "scale_up");   // pre-signed, no token
//! let signal = os.signal_url(&stack, "scale_up"); // needs X-Auth-Token
//! // ... run the code under test ...
//! let sent = os.requests();                        // every request, in order
//! assert_eq!(os.signals().len(), 1);              // signals Heat accepted
//! os.assert_no_violations();
//! ```
//!
//! ## Endpoints (all under [`FakeOpenStack::base_url`])
//! | service | catalog type | URL |
//! |---|---|---|
//! | Keystone | `identity` | `/identity/v3` ([`FakeOpenStack::auth_url`]) |
//! | Nova | `compute` | `/compute/v2.1` |
//! | Cinder | `block-storage` and `volumev3` | `/volume/v3/{project_id}` |
//! | Heat | `orchestration` | `/heat/v1/{project_id}` |
//! | Heat cfn | `cloudformation` | `/heat-cfn/v1` (pre-signed alarm URLs; refusals in XML) |
//! | Magnum | `container-infra` | `/magnum/v1` |
//! | Glance | `image` | `/image` |
//! | Neutron | `network` | `/network` |
//!
//! The catalog lists each on the `public` and `internal` interfaces of
//! region [`REGION`]. Users: [`USERNAME`]/[`PASSWORD`] in domain `Default`
//! with project [`PROJECT_NAME`] ([`PROJECT_ID`]), and the application
//! credential [`APP_CRED_ID`]/[`APP_CRED_SECRET`].
//!
//! ## Knobs
//! - Tokens: [`FakeOpenStack::set_token_ttl`], [`FakeOpenStack::revoke_tokens`]
//!   (every issued token then gets `401`, as after a Keystone restart).
//! - Faults: [`FakeOpenStack::fail_next`] (JSON) and
//!   [`FakeOpenStack::fail_next_raw`] (XML, HTML) answer the next matching
//!   request with a given status and body (then behaves again).
//! - Heat: [`FakeStack`] describes a stack with an `OS::Heat::ResourceGroup`
//!   or `OS::Heat::AutoScalingGroup` of servers and its scaling policies
//!   (builders for `min_size`/`max_size`, `desired_capacity`, policy
//!   cooldowns, and an operation id that replaces members). A stack PATCH
//!   (202, also during an update, which it supersedes) puts the stack in
//!   `UPDATE_IN_PROGRESS` for [`FakeOpenStack::set_update_polls`] GETs, then
//!   applies it (`UPDATE_COMPLETE`, or `UPDATE_FAILED` with the reason set by
//!   [`FakeOpenStack::fail_next_stack_update`]): a ResourceGroup honours
//!   `removal_policies` and replaces marked members; an AutoScalingGroup is
//!   resized to its `desired_capacity` or healthy count. A policy signal is
//!   answered 200 at once and applied at the next GETs of the group's nested
//!   stack (resizing from the healthy members, dropping failed ones first,
//!   then the oldest), writing a `SIGNAL_COMPLETE` event
//!   ([`FakeOpenStack::policy_events`]); while the group scales, in its
//!   cooldown or at its size limits it is ignored without an event. The
//!   template, update previews, group metadata and policy events are served.
//!   Group members are servers in the fake Nova, named `<prefix><index>`.
//! - Nova/Cinder/Magnum: see the `nova` and `magnum` sections of this
//!   type's methods (`set_compute_limits`, `add_flavor`, `servers`, ...).

#[path = "fake_openstack_compute.rs"]
mod compute;
#[path = "fake_openstack_heat.rs"]
mod heat;
#[path = "fake_openstack_magnum.rs"]
mod magnum;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

pub use compute::{FakeServer, FakeVolume, Flavor, Limits};
pub use heat::{FakeGroup, FakeMember, FakeStack, GroupKind};
pub use magnum::{FakeCluster, FakeNodegroup};

/// Region of every catalog endpoint.
pub const REGION: &str = "RegionOne";
/// The password user's name.
pub const USERNAME: &str = "gearshift";
/// Its password.
pub const PASSWORD: &str = "s3cret-pw";
/// Its id.
pub const USER_ID: &str = "ee4dfb6e5540447cb3741905149d9b6e";
/// The project's name.
pub const PROJECT_NAME: &str = "paas";
/// The project's id (also the Heat tenant id and Cinder project in URLs).
pub const PROJECT_ID: &str = "8538a3f13f9541b28c2620eb19065e45";
/// The application credential's id.
pub const APP_CRED_ID: &str = "423f19a4ac1e4f48bbb4180756e6eb6c";
/// The application credential's name (it may be given by name and user).
pub const APP_CRED_NAME: &str = "gearshift-test";
/// The application credential's secret.
pub const APP_CRED_SECRET: &str = "rEaqvJka48mpv";

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path, without the query.
    pub path: String,
    /// Raw query string.
    pub query: Option<String>,
    /// Headers, names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The body parsed as JSON (`None` when empty or not JSON).
    pub body: Option<Value>,
    /// Raw body length.
    pub body_len: usize,
    /// The status the fake answered.
    pub status: u16,
}

impl Recorded {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// A planned failure.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    method: Method,
    path_contains: String,
    status: u16,
    body: Value,
    content_type: Option<String>,
}

/// A Heat signal the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    /// The stack's name.
    pub stack: String,
    /// The signalled resource (a scaling policy).
    pub resource: String,
    /// How it came: `alarm_url` (pre-signed, no token) or `signal` (token).
    pub via: &'static str,
    /// The JSON body sent, if any.
    pub details: Option<Value>,
    /// Whether Heat acts on it: it answers 200 to every signal and ignores,
    /// without an event, those that come while the group is not settled or
    /// scales, in its cooldown, or when the adjustment would cross
    /// `min_size`/`max_size` (Heat 27's `NoActionRequired`).
    pub applied: bool,
}

pub(crate) struct State {
    pub base: String,
    pub requests: Vec<Recorded>,
    pub violations: Vec<String>,
    pub tokens: BTreeMap<String, DateTime<Utc>>,
    pub token_ttl: Duration,
    pub token_counter: u64,
    pub faults: Vec<Fault>,
    pub signals: Vec<Signal>,
    pub heat: heat::HeatState,
    pub nova: compute::ComputeState,
    pub magnum: magnum::MagnumState,
    pub counter: u64,
}

impl State {
    pub(crate) fn next_id(&mut self, prefix: &str) -> String {
        self.counter += 1;
        // UUID-shaped and unique, readable in test output.
        format!("{prefix:0>8}-0000-4000-8000-{:012x}", self.counter)
    }
}

type Shared = Arc<Mutex<State>>;

/// The fake cloud. Dropping it stops the server.
pub struct FakeOpenStack {
    addr: SocketAddr,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOpenStack {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeOpenStack {
    /// Starts the fake on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake OpenStack");
        let addr = listener.local_addr().expect("local addr");
        let state: Shared = Arc::new(Mutex::new(State {
            base: format!("http://{addr}"),
            requests: Vec::new(),
            violations: Vec::new(),
            tokens: BTreeMap::new(),
            token_ttl: Duration::from_secs(3600),
            token_counter: 0,
            faults: Vec::new(),
            signals: Vec::new(),
            heat: heat::HeatState::default(),
            nova: compute::ComputeState::new(),
            magnum: magnum::MagnumState::default(),
            counter: 0,
        }));
        let st = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let st = st.clone();
                async move { dispatch(st, method, uri, headers, body) }
            },
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeOpenStack { addr, state, task }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The Keystone v3 URL (`.../identity/v3`).
    pub fn auth_url(&self) -> String {
        format!("{}/identity/v3", self.base_url())
    }

    /// `OS_*` variables for the password user, as an openrc sets them.
    pub fn env_vars(&self) -> Vec<(String, String)> {
        [
            ("OS_AUTH_URL", self.auth_url()),
            ("OS_USERNAME", USERNAME.into()),
            ("OS_PASSWORD", PASSWORD.into()),
            ("OS_PROJECT_NAME", PROJECT_NAME.into()),
            ("OS_USER_DOMAIN_NAME", "Default".into()),
            ("OS_PROJECT_DOMAIN_NAME", "Default".into()),
            ("OS_REGION_NAME", REGION.into()),
            ("OS_INTERFACE", "public".into()),
            ("OS_IDENTITY_API_VERSION", "3".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// `OS_*` variables for the application credential.
    pub fn app_credential_env_vars(&self) -> Vec<(String, String)> {
        [
            ("OS_AUTH_URL", self.auth_url()),
            ("OS_AUTH_TYPE", "v3applicationcredential".into()),
            ("OS_APPLICATION_CREDENTIAL_ID", APP_CRED_ID.into()),
            ("OS_APPLICATION_CREDENTIAL_SECRET", APP_CRED_SECRET.into()),
            ("OS_REGION_NAME", REGION.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The password user's credentials, project-scoped.
    pub fn credentials(&self) -> gearshift_cloud::Credentials {
        let vars: BTreeMap<String, String> = self.env_vars().into_iter().collect();
        gearshift_cloud::Credentials::from_vars(|k| vars.get(k).cloned()).expect("fake credentials")
    }

    /// A session on [`FakeOpenStack::credentials`].
    pub fn session(&self) -> gearshift_cloud::Session {
        gearshift_cloud::Session::new(self.credentials(), Default::default()).expect("session")
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Requests with this method whose path contains `path_contains`.
    pub fn requests_matching(&self, method: &str, path_contains: &str) -> Vec<Recorded> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.method == method && r.path.contains(path_contains))
            .cloned()
            .collect()
    }

    /// Forgets the recorded requests (not the violations).
    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    /// Requests that did not match the documented API shape.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Panics, listing them, if any request broke the API's shape.
    pub fn assert_no_violations(&self) {
        let v = self.violations();
        assert!(
            v.is_empty(),
            "requests that break the API shape:\n{}",
            v.join("\n")
        );
    }

    /// Lifetime of new tokens (`expires_at` = issue time + ttl).
    pub fn set_token_ttl(&self, ttl: Duration) {
        self.lock().token_ttl = ttl;
    }

    /// Invalidates every issued token: they get `401` from now on.
    pub fn revoke_tokens(&self) {
        self.lock().tokens.clear();
    }

    /// How many tokens Keystone issued.
    pub fn tokens_issued(&self) -> u64 {
        self.lock().token_counter
    }

    /// Whether `token` was issued by this Keystone and is still valid: what
    /// another service's fake (Gnocchi's) asks, as keystonemiddleware would.
    pub fn token_is_valid(&self, token: &str) -> bool {
        self.lock()
            .tokens
            .get(token)
            .is_some_and(|exp| *exp > Utc::now())
    }

    /// Answers the next `method` request whose path contains
    /// `path_contains` with `status` and `body`, once.
    pub fn fail_next(&self, method: &str, path_contains: &str, status: u16, body: Value) {
        self.lock().faults.push(Fault {
            method: method.parse().expect("method"),
            path_contains: path_contains.into(),
            status,
            body,
            content_type: None,
        });
    }

    /// Like [`FakeOpenStack::fail_next`] with a body that is not JSON (an
    /// XML error of heat-api-cfn, an HTML page), sent with `content_type`.
    pub fn fail_next_raw(
        &self,
        method: &str,
        path_contains: &str,
        status: u16,
        content_type: &str,
        body: &str,
    ) {
        self.lock().faults.push(Fault {
            method: method.parse().expect("method"),
            path_contains: path_contains.into(),
            status,
            body: Value::String(body.into()),
            content_type: Some(content_type.into()),
        });
    }

    /// Heat signals accepted so far.
    pub fn signals(&self) -> Vec<Signal> {
        self.lock().signals.clone()
    }
}

/// Reads a request and answers it: record, check the token, apply a
/// planned fault, route to the service.
fn dispatch(st: Shared, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
    let path = uri.path().to_string();
    let query = uri.query().map(str::to_string);
    let hdrs: BTreeMap<String, String> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.to_str().unwrap_or("<binary>").to_string(),
            )
        })
        .collect();
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok()
    };
    let mut req = Req {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        headers: hdrs.clone(),
        body: json_body.clone(),
        raw_len: body.len(),
    };
    let resp = route(&mut s, &mut req);
    let status = resp.0;
    s.requests.push(Recorded {
        method: method.to_string(),
        path,
        query,
        headers: hdrs,
        body: json_body,
        body_len: body.len(),
        status: status.as_u16(),
    });
    drop(s);
    resp.into_response()
}

/// A request being answered.
pub(crate) struct Req {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub body: Option<Value>,
    pub raw_len: usize,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// Query parameters (decoded).
    pub fn params(&self) -> Vec<(String, String)> {
        self.query
            .as_deref()
            .map(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn param(&self, name: &str) -> Option<String> {
        self.params()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// Path segments after `prefix`, percent-decoded.
    pub fn segments(&self, prefix: &str) -> Vec<String> {
        self.path
            .strip_prefix(prefix)
            .unwrap_or("")
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect()
    }

    /// `Content-Type: application/json` when a body is present.
    pub fn json_body_ok(&self) -> bool {
        self.raw_len == 0
            || (self.body.is_some()
                && self
                    .header("content-type")
                    .is_some_and(|c| c.starts_with("application/json")))
    }
}

/// (status, headers, body) of an answer.
pub(crate) struct Answer(pub StatusCode, pub Vec<(String, String)>, pub Option<Value>);

impl Answer {
    pub fn json(status: u16, body: Value) -> Self {
        Answer(
            StatusCode::from_u16(status).expect("status"),
            Vec::new(),
            Some(body),
        )
    }
    pub fn empty(status: u16) -> Self {
        Answer(
            StatusCode::from_u16(status).expect("status"),
            Vec::new(),
            None,
        )
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let typed = self.1.iter().any(|(k, _)| k == "content-type");
        let mut r = match self.2 {
            // A string with its own Content-Type is sent as is (Heat's HTML
            // pages, heat-api-cfn's XML errors).
            Some(Value::String(text)) if typed => (self.0, text).into_response(),
            Some(v) => (
                self.0,
                [("content-type", "application/json")],
                serde_json::to_vec(&v).expect("json"),
            )
                .into_response(),
            None => self.0.into_response(),
        };
        for (k, v) in self.1 {
            r.headers_mut().insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
                v.parse().expect("header value"),
            );
        }
        r
    }
}

/// Records a violation and answers 400 in the right service's error format.
pub(crate) fn violation(s: &mut State, req: &Req, why: impl Into<String>) -> Answer {
    let why = why.into();
    let line = format!("{} {}: {}", req.method, req.path, why);
    s.violations.push(line.clone());
    let body = if req.path.starts_with("/compute") || req.path.starts_with("/volume") {
        json!({"badRequest": {"code": 400, "message": line}})
    } else if req.path.starts_with("/magnum") {
        json!({"errors": [{"request_id": "", "code": "client", "status": 400, "title": "Bad Request", "detail": line, "links": []}]})
    } else if req.path.starts_with("/heat") {
        json!({"explanation": "The server could not comply with the request since it is either malformed or otherwise incorrect.", "code": 400, "error": {"message": line, "traceback": null, "type": "HTTPBadRequest"}, "title": "Bad Request"})
    } else {
        json!({"error": {"code": 400, "message": line, "title": "Bad Request"}})
    };
    Answer::json(400, body)
}

fn unauthorized() -> Answer {
    Answer::json(
        401,
        json!({"error": {"code": 401, "message": "The request you have made requires authentication.", "title": "Unauthorized"}}),
    )
}

fn route(s: &mut State, req: &mut Req) -> Answer {
    // A planned fault wins over everything but Keystone's own checks.
    if let Some(i) = s
        .faults
        .iter()
        .position(|f| f.method == req.method && req.path.contains(&f.path_contains))
    {
        let f = s.faults.remove(i);
        let mut a = Answer::json(f.status, f.body);
        if let Some(ct) = f.content_type {
            a.1.push(("content-type".into(), ct));
        }
        return a;
    }
    if req.path.starts_with("/identity/v3") {
        return keystone(s, req);
    }
    if req.path.starts_with("/heat-cfn/") {
        return heat::cfn_signal(s, req);
    }
    // Every other API needs a valid token.
    match req.header("x-auth-token") {
        None => {
            let a = unauthorized();
            s.violations
                .push(format!("{} {}: no X-Auth-Token", req.method, req.path));
            return a;
        }
        Some(t) => {
            let valid = s.tokens.get(t).is_some_and(|exp| *exp > Utc::now());
            if !valid {
                return unauthorized();
            }
        }
    }
    if !req.json_body_ok() {
        return violation(
            s,
            req,
            "a body without Content-Type: application/json, or not JSON",
        );
    }
    if req.path.starts_with("/heat/v1/") {
        heat::route(s, req)
    } else if req.path.starts_with("/compute/v2.1") {
        compute::nova(s, req)
    } else if req.path.starts_with("/volume/v3/") {
        compute::cinder(s, req)
    } else if req.path.starts_with("/image") {
        compute::glance(s, req)
    } else if req.path.starts_with("/network") {
        compute::neutron(s, req)
    } else if req.path.starts_with("/magnum/v1") {
        magnum::route(s, req)
    } else {
        violation(s, req, "no such service in the catalog")
    }
}

fn catalog(base: &str) -> Value {
    let svc = |ty: &str, name: &str, url: String| {
        json!({
            "id": format!("{name}-{ty}"),
            "type": ty,
            "name": name,
            "endpoints": [
                {"id": format!("{name}-pub"), "interface": "public", "region": REGION, "region_id": REGION, "url": url},
                {"id": format!("{name}-int"), "interface": "internal", "region": REGION, "region_id": REGION, "url": url},
            ]
        })
    };
    json!([
        svc("identity", "keystone", format!("{base}/identity")),
        svc("compute", "nova", format!("{base}/compute/v2.1")),
        svc(
            "block-storage",
            "cinder",
            format!("{base}/volume/v3/{PROJECT_ID}")
        ),
        svc(
            "volumev3",
            "cinderv3",
            format!("{base}/volume/v3/{PROJECT_ID}")
        ),
        svc(
            "orchestration",
            "heat",
            format!("{base}/heat/v1/{PROJECT_ID}")
        ),
        svc("cloudformation", "heat-cfn", format!("{base}/heat-cfn/v1")),
        svc("container-infra", "magnum", format!("{base}/magnum/v1")),
        svc("image", "glance", format!("{base}/image")),
        svc("network", "neutron", format!("{base}/network")),
    ])
}

/// Keystone: `POST /v3/auth/tokens` (password or application_credential).
fn keystone(s: &mut State, req: &mut Req) -> Answer {
    if req.path != "/identity/v3/auth/tokens" || req.method != Method::POST {
        return violation(s, req, "only POST /v3/auth/tokens is served");
    }
    if !req.json_body_ok() || req.body.is_none() {
        return violation(s, req, "POST /v3/auth/tokens needs a JSON body");
    }
    let body = req.body.clone().unwrap_or(Value::Null);
    let auth = &body["auth"];
    let methods = &auth["identity"]["methods"];
    let method = match methods.as_array().map(|m| m.as_slice()) {
        Some([m]) => m.as_str().unwrap_or("").to_string(),
        _ => return violation(s, req, "auth.identity.methods must be a one-element list"),
    };
    let bad_creds = || {
        Answer::json(
            401,
            json!({"error": {"code": 401, "message": "The request you have made requires authentication.", "title": "Unauthorized"}}),
        )
    };
    match method.as_str() {
        "password" => {
            let user = &auth["identity"]["password"]["user"];
            let by_id = user["id"].as_str() == Some(USER_ID);
            let domain_ok = user["domain"]["name"].as_str() == Some("Default")
                || user["domain"]["id"].as_str() == Some("default");
            let by_name = user["name"].as_str() == Some(USERNAME);
            if user["name"].is_string() && !user["domain"].is_object() {
                return violation(s, req, "a user given by name needs its domain");
            }
            if !(by_id || (by_name && domain_ok)) || user["password"].as_str() != Some(PASSWORD) {
                return bad_creds();
            }
            let proj = &auth["scope"]["project"];
            // Without a scope Keystone 30 answers 201, scoped to the user's
            // default project (the test user has one): as here.
            if proj["name"].is_string() && !proj["domain"].is_object() {
                return violation(s, req, "a project given by name needs its domain");
            }
            let pok = !proj.is_object()
                || proj["id"].as_str() == Some(PROJECT_ID)
                || (proj["name"].as_str() == Some(PROJECT_NAME)
                    && (proj["domain"]["name"].as_str() == Some("Default")
                        || proj["domain"]["id"].as_str() == Some("default")));
            if !pok {
                return bad_creds();
            }
        }
        "application_credential" => {
            if let Some(refused) = application_credential(auth) {
                return refused;
            }
        }
        other => return violation(s, req, format!("unsupported method {other:?}")),
    }
    s.token_counter += 1;
    let token = format!("gAAAAABfake{:08}", s.token_counter);
    let now = Utc::now();
    let expires = now + chrono::Duration::from_std(s.token_ttl).unwrap_or_default();
    s.tokens.insert(token.clone(), expires);
    let fmt = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let body = json!({
        "token": {
            "methods": [method],
            "expires_at": fmt(expires),
            "issued_at": fmt(now),
            "audit_ids": ["3T2dc1CGQxyJsHdDu1xkcw"],
            "user": {"domain": {"id": "default", "name": "Default"}, "id": USER_ID, "name": USERNAME, "password_expires_at": null},
            "project": {"domain": {"id": "default", "name": "Default"}, "id": PROJECT_ID, "name": PROJECT_NAME},
            "is_domain": false,
            "roles": [{"id": "51cc68287d524c759f47c811e6463340", "name": "member"}],
            "catalog": catalog(&s.base),
        }
    });
    Answer(
        StatusCode::CREATED,
        vec![("x-subject-token".into(), token)],
        Some(body),
    )
}

/// Keystone 30 on an application credential: `None` when it authenticates.
fn application_credential(auth: &Value) -> Option<Answer> {
    let ac = &auth["identity"]["application_credential"];
    if auth.get("scope").is_some() {
        // 401 for any scope, even the credential's own project.
        return Some(Answer::json(
            401,
            json!({"error": {"code": 401, "identity": {}, "message": "Error authenticating with application credential: Application credentials cannot request a scope.", "title": "Unauthorized"}}),
        ));
    }
    let by_id = ac["id"].as_str();
    let by_name = ac["name"].as_str() == Some(APP_CRED_NAME)
        && (ac["user"]["id"].as_str() == Some(USER_ID)
            || (ac["user"]["name"].as_str() == Some(USERNAME) && ac["user"]["domain"].is_object()));
    if let Some(id) = by_id.filter(|id| *id != APP_CRED_ID) {
        return Some(Answer::json(
            404,
            json!({"error": {"code": 404, "message": format!("Could not find Application Credential: {id}."), "title": "Not Found"}}),
        ));
    }
    if !(by_id.is_some() || by_name) || ac["secret"].as_str() != Some(APP_CRED_SECRET) {
        return Some(unauthorized());
    }
    None
}

/// Heat's timestamp format (`2024-05-01T10:00:00Z`), unique per call.
pub(crate) fn heat_time(s: &mut State) -> String {
    s.counter += 1;
    let t = Utc::now() + chrono::Duration::seconds(s.counter as i64);
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
