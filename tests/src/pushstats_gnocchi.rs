//! An in-process fake Gnocchi (v1 REST API) for the pull-mode tests.
//!
//! It serves the calls a pusher makes and checks each against Gnocchi's
//! documented shape: the `X-Auth-Token` header (validated by a callback,
//! as keystonemiddleware asks Keystone; the tests pass
//! [`crate::fake_openstack::FakeOpenStack::token_is_valid`]), the JSON
//! content type, and the bodies. A request that does not fit is answered
//! `400` in Gnocchi's error format and recorded as a violation
//! ([`FakeGnocchi::assert_no_violations`]).
//!
//! | call | answer |
//! |---|---|
//! | `POST /v1/resource/generic/{id}/metric/{name}/measures` `[{"timestamp", "value"}, ...]` | `202`; `404` if the resource or the metric does not exist |
//! | `POST /v1/resource/generic/{id}/metric` `{"<name>": {"archive_policy_name", "unit"}}` | `200` with the resource; `404` no resource; `409` metric exists |
//! | `POST /v1/resource/{type}` `{"id", "project_id", "user_id", "metrics"}` | `201` with `Location`; `409` if it exists |
//!
//! Without a token: `401` in keystonemiddleware's format. Errors are
//! `{"code", "description", "title"}` as Gnocchi's WSGI stack writes them.
//! Archive policies `low`, `medium`, `high` exist; a metric created without
//! `archive_policy_name` gets `low` only when [`FakeGnocchi::set_default_rule`]
//! is on (an archive policy rule matching every name), else `400`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};

/// A token check (Keystone's answer for a token).
pub type TokenCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// One metric of a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeMetric {
    /// Archive policy name.
    pub archive_policy: String,
    /// Unit given at creation.
    pub unit: Option<String>,
    /// Measures received: (timestamp as sent, value).
    pub measures: Vec<(String, f64)>,
}

/// One resource.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeResource {
    /// Its type (`generic`, `instance`).
    pub resource_type: String,
    /// `project_id` given at creation.
    pub project_id: Option<String>,
    /// `user_id` given at creation.
    pub user_id: Option<String>,
    /// Named metrics.
    pub metrics: BTreeMap<String, FakeMetric>,
}

/// A request as received.
#[derive(Debug, Clone)]
pub struct GnocchiRequest {
    /// Method.
    pub method: String,
    /// Decoded path.
    pub path: String,
    /// `X-Auth-Token`, if sent.
    pub token: Option<String>,
    /// `Content-Type`, if sent.
    pub content_type: Option<String>,
    /// Body as JSON, if it was.
    pub body: Option<Value>,
    /// The status answered.
    pub status: u16,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, FakeResource>,
    requests: Vec<GnocchiRequest>,
    violations: Vec<String>,
    default_rule: bool,
    fail_next: Vec<(u16, usize)>,
}

/// The fake. Dropping it stops the server.
pub struct FakeGnocchi {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGnocchi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const POLICIES: &[&str] = &["low", "medium", "high"];
const TYPES: &[&str] = &["generic", "instance"];

fn error(status: u16, description: impl Into<String>) -> (u16, Value) {
    let title = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    (
        status,
        json!({"code": status, "description": description.into(), "title": title}),
    )
}

impl FakeGnocchi {
    /// Starts on `127.0.0.1:0`; `check` says whether a token is valid.
    pub async fn start(check: TokenCheck) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Gnocchi");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let st = st.clone();
                let check = check.clone();
                async move { handle(&st, &check, method, uri, headers, body) }
            },
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeGnocchi { addr, state, task }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `http://127.0.0.1:PORT` (Gnocchi's base, without `/v1`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds a resource (as Ceilometer or an operator would have).
    pub fn add_resource(&self, id: &str, resource_type: &str, metrics: &[&str]) {
        self.lock().resources.insert(
            id.to_string(),
            FakeResource {
                resource_type: resource_type.into(),
                project_id: None,
                user_id: None,
                metrics: metrics
                    .iter()
                    .map(|m| {
                        (
                            m.to_string(),
                            FakeMetric {
                                archive_policy: "low".into(),
                                unit: None,
                                measures: Vec::new(),
                            },
                        )
                    })
                    .collect(),
            },
        );
    }

    /// A resource, if it exists.
    pub fn resource(&self, id: &str) -> Option<FakeResource> {
        self.lock().resources.get(id).cloned()
    }

    /// The measures of `resource`'s `metric`.
    pub fn measures(&self, resource: &str, metric: &str) -> Vec<(String, f64)> {
        self.lock()
            .resources
            .get(resource)
            .and_then(|r| r.metrics.get(metric))
            .map(|m| m.measures.clone())
            .unwrap_or_default()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<GnocchiRequest> {
        self.lock().requests.clone()
    }

    /// Whether an archive policy rule matches every metric name.
    pub fn set_default_rule(&self, on: bool) {
        self.lock().default_rule = on;
    }

    /// Answers the next `count` requests with `status` (Gnocchi's error body).
    pub fn fail_next(&self, status: u16, count: usize) {
        self.lock().fail_next.push((status, count));
    }

    /// Requests that broke the documented shape.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Panics, listing them, if any request broke the documented shape.
    pub fn assert_no_violations(&self) {
        let v = self.violations();
        assert!(
            v.is_empty(),
            "requests that break Gnocchi's API:\n{}",
            v.join("\n")
        );
    }
}

fn handle(
    st: &Mutex<State>,
    check: &TokenCheck,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = percent_decode_str(uri.path())
        .decode_utf8_lossy()
        .to_string();
    let token = headers
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
    let (status, answer, location) = route(
        &mut s,
        check,
        &method,
        &path,
        &token,
        &content_type,
        &body,
        &parsed,
    );
    s.requests.push(GnocchiRequest {
        method: method.to_string(),
        path: path.clone(),
        token,
        content_type,
        body: parsed,
        status,
    });
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = match answer {
        Some(v) => (code, axum::Json(v)).into_response(),
        None => code.into_response(),
    };
    if let Some(l) = location
        && let Ok(v) = l.parse()
    {
        resp.headers_mut().insert("location", v);
    }
    resp
}

/// (status, JSON body, `Location`) of an answer.
type Reply = (u16, Option<Value>, Option<String>);

/// An error answer in Gnocchi's format.
fn err(status: u16, why: String) -> Reply {
    let (st, v) = error(status, why);
    (st, Some(v), None)
}

/// Records a violation of the API's shape and answers `400`.
fn violation(s: &mut State, method: &Method, path: &str, why: String) -> Reply {
    s.violations.push(format!("{method} {path}: {why}"));
    err(400, why)
}

#[allow(clippy::too_many_arguments)]
fn route(
    s: &mut State,
    check: &TokenCheck,
    method: &Method,
    path: &str,
    token: &Option<String>,
    content_type: &Option<String>,
    raw: &Bytes,
    body: &Option<Value>,
) -> Reply {
    // keystonemiddleware runs first.
    match token {
        Some(t) if check(t) => {}
        Some(_) | None => {
            return (
                401,
                Some(json!({"error": {"code": 401, "title": "Unauthorized",
                    "message": "The request you have made requires authentication."}})),
                None,
            );
        }
    }
    if let Some((status, left)) = s.fail_next.first_mut() {
        let status = *status;
        *left -= 1;
        if *left == 0 {
            s.fail_next.remove(0);
        }
        return err(status, "injected failure".into());
    }
    let bad = |s: &mut State, why: String| violation(s, method, path, why);
    if *method != Method::POST {
        return bad(s, "only POST is served by this fake".into());
    }
    if !content_type
        .as_deref()
        .is_some_and(|c| c.starts_with("application/json"))
    {
        return bad(
            s,
            format!("Content-Type must be application/json, got {content_type:?}"),
        );
    }
    let Some(body) = body else {
        return bad(
            s,
            format!("body is not JSON: {}", String::from_utf8_lossy(raw)),
        );
    };
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let r = match segs.as_slice() {
        ["v1", "resource", "generic", id, "metric", name, "measures"] => {
            post_measures(s, id, name, body)
        }
        ["v1", "resource", "generic", id, "metric"] => add_metrics(s, id, body),
        ["v1", "resource", rtype] => create_resource(s, rtype, body),
        _ => Err("no such Gnocchi call in this fake".into()),
    };
    r.unwrap_or_else(|why| bad(s, why))
}

/// What a handler answers: a reply, or the violation it found.
type Handled = Result<Reply, String>;

/// `POST /v1/resource/generic/{id}/metric/{name}/measures`.
fn post_measures(s: &mut State, id: &str, name: &str, body: &Value) -> Handled {
    let Some(list) = body.as_array() else {
        return Err("measures must be a JSON list".into());
    };
    let mut measures = Vec::new();
    for m in list {
        let ok = m.as_object().is_some_and(|o| {
            o.len() == 2 && o.contains_key("timestamp") && o.contains_key("value")
        });
        let ts = m.get("timestamp").and_then(Value::as_str);
        let v = m.get("value").and_then(Value::as_f64);
        let ts_ok = ts.is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok());
        match (ok, ts, v, ts_ok) {
            (true, Some(t), Some(v), true) => measures.push((t.to_string(), v)),
            _ => {
                return Err(format!(
                    "each measure is {{\"timestamp\": ISO 8601, \"value\": number}}, got {m}"
                ));
            }
        }
    }
    let Some(r) = s.resources.get_mut(id) else {
        return Ok(err(404, format!("Resource {id} does not exist")));
    };
    let Some(metric) = r.metrics.get_mut(name) else {
        return Ok(err(404, format!("Metric {name} does not exist")));
    };
    metric.measures.extend(measures);
    Ok((202, None, None))
}

/// `POST /v1/resource/generic/{id}/metric`.
fn add_metrics(s: &mut State, id: &str, body: &Value) -> Handled {
    let defs = match parse_metric_defs(s, body) {
        Ok(d) => d,
        Err(e) => return Ok(e),
    };
    let Some(r) = s.resources.get_mut(id) else {
        return Ok(err(404, format!("Resource {id} does not exist")));
    };
    for (name, m) in defs {
        if r.metrics.contains_key(&name) {
            return Ok(err(409, format!("Named metric {name} already exists")));
        }
        r.metrics.insert(name, m);
    }
    let metrics: Vec<Value> = r
        .metrics
        .iter()
        .map(|(n, m)| json!({"name": n, "archive_policy_name": m.archive_policy, "unit": m.unit}))
        .collect();
    Ok((200, Some(Value::Array(metrics)), None))
}

/// Attributes of a resource.
const RESOURCE_FIELDS: [&str; 6] = [
    "id",
    "project_id",
    "user_id",
    "metrics",
    "started_at",
    "ended_at",
];

/// `POST /v1/resource/{type}`.
fn create_resource(s: &mut State, rtype: &str, body: &Value) -> Handled {
    if !TYPES.contains(&rtype) {
        return Ok(err(404, format!("Resource type {rtype} does not exist")));
    }
    let Some(obj) = body.as_object() else {
        return Err("a resource is a JSON object".into());
    };
    if let Some(k) = obj.keys().find(|k| !RESOURCE_FIELDS.contains(&k.as_str())) {
        return Err(format!("unknown attribute {k:?} for a {rtype} resource"));
    }
    let Some(id) = obj.get("id").and_then(Value::as_str) else {
        return Err("a resource needs a string id".into());
    };
    let str_field = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_string);
    let metrics = match obj.get("metrics") {
        None => BTreeMap::new(),
        Some(m) => match parse_metric_defs(s, m) {
            Ok(d) => d,
            Err(e) => return Ok(e),
        },
    };
    if s.resources.contains_key(id) {
        return Ok(err(409, format!("Resource {id} already exists")));
    }
    s.resources.insert(
        id.to_string(),
        FakeResource {
            resource_type: rtype.to_string(),
            project_id: str_field("project_id"),
            user_id: str_field("user_id"),
            metrics,
        },
    );
    Ok((
        201,
        Some(json!({"id": id, "type": rtype, "original_resource_id": id})),
        Some(format!("/v1/resource/{rtype}/{id}")),
    ))
}

/// Parses `{"<name>": {"archive_policy_name": ..., "unit": ...}}`.
#[allow(clippy::type_complexity)]
fn parse_metric_defs(s: &mut State, v: &Value) -> Result<BTreeMap<String, FakeMetric>, Reply> {
    let bad = |s: &mut State, why: String| {
        s.violations.push(why.clone());
        let (st, v) = error(400, why);
        (st, Some(v), None)
    };
    let Some(obj) = v.as_object() else {
        return Err(bad(
            s,
            "metrics must be an object of name -> definition".into(),
        ));
    };
    let mut out = BTreeMap::new();
    for (name, def) in obj {
        if name.contains('/') || name.is_empty() {
            return Err(bad(s, format!("invalid metric name {name:?}")));
        }
        let Some(d) = def.as_object() else {
            return Err(bad(s, format!("definition of {name} must be an object")));
        };
        for k in d.keys() {
            if !["archive_policy_name", "unit", "resource_id"].contains(&k.as_str()) {
                return Err(bad(s, format!("unknown metric attribute {k:?}")));
            }
        }
        let ap = match d.get("archive_policy_name").and_then(Value::as_str) {
            Some(ap) if POLICIES.contains(&ap) => ap.to_string(),
            Some(ap) => {
                // A well-formed request for a missing policy: a plain 400.
                let (st, v) = error(400, format!("Archive policy {ap} does not exist"));
                return Err((st, Some(v), None));
            }
            None if s.default_rule => "low".to_string(),
            None => {
                let (st, v) = error(
                    400,
                    format!(
                        "No archive policy name specified and no archive policy rule found matching the metric name {name}"
                    ),
                );
                return Err((st, Some(v), None));
            }
        };
        let unit = d.get("unit").and_then(Value::as_str).map(str::to_string);
        if unit.as_deref().is_some_and(|u| u.len() > 31) {
            return Err(bad(
                s,
                format!("unit of {name} is longer than 31 characters"),
            ));
        }
        out.insert(
            name.clone(),
            FakeMetric {
                archive_policy: ap,
                unit,
                measures: Vec::new(),
            },
        );
    }
    Ok(out)
}
