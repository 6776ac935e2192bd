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
//!
//! ## Layout
//! - `http`: the one handler (recording, planned faults, tokens, routing),
//!   the request and answer types.
//! - `keystone`: tokens and the catalog.
//! - `compute`: Nova (`compute/nova.rs`), Cinder, Glance and Neutron
//!   (`compute/cinder.rs`), and the compute knobs.
//! - `heat`: stacks, groups and policies, and their API (`heat/api.rs`).
//! - `magnum`: clusters and node groups.

mod compute;
mod heat;
mod http;
mod keystone;
mod magnum;

pub(crate) use http::{Answer, Req, violation};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use chrono::{DateTime, Utc};
use serde_json::Value;

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
                async move { http::dispatch(st, method, uri, headers, body) }
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

    /// Writes [`FakeOpenStack::env_vars`] to `path` as the seeds' `auth.env`
    /// (`export K=V` lines), which the handlers' `[auth] env_file` reads.
    pub fn write_env_file(&self, path: &std::path::Path) {
        let text: String = self
            .env_vars()
            .into_iter()
            .map(|(k, v)| format!("export {k}={v}\n"))
            .collect();
        std::fs::write(path, text).expect("auth.env written");
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

/// Heat's timestamp format (`2024-05-01T10:00:00Z`), unique per call.
pub(crate) fn heat_time(s: &mut State) -> String {
    s.counter += 1;
    let t = Utc::now() + chrono::Duration::seconds(s.counter as i64);
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
