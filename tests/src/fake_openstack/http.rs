//! The fake's HTTP side: one handler records every request, answers a
//! planned fault, checks the token, and routes to the service; the request
//! and answer types the services share.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::{Value, json};

use super::{Recorded, Shared, State, compute, heat, keystone, magnum};

/// Reads a request and answers it: record, check the token, apply a
/// planned fault, route to the service.
pub(super) fn dispatch(
    st: Shared,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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

pub(super) fn unauthorized() -> Answer {
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
        return keystone::keystone(s, req);
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
