//! The HTTP layer under every client: one `reqwest` client with our TLS and
//! timeout settings, bounded response bodies, and the translation of error
//! responses into [`CloudError`] using each API's documented error body.

use std::time::Duration;

pub use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;

use crate::error::{
    CloudError, Service, bounded, cinder_names_quota, magnum_reason_names_quota, nova_names_quota,
};

/// Largest response body we read (catalogs of big clouds run to a few hundred KiB).
pub const DEFAULT_MAX_BODY: usize = 8 * 1024 * 1024;

/// How the HTTP client connects.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// PEM file with extra trusted CA certificates (`OS_CACERT`, `cacert`).
    pub cacert: Option<std::path::PathBuf>,
    /// Skip TLS certificate verification (`OS_INSECURE`, `verify: false`).
    /// Never the default; logged loudly when set.
    pub insecure: bool,
    /// Whole-request timeout. Default 60 s.
    pub timeout: Duration,
    /// TCP/TLS connect timeout. Default 10 s.
    pub connect_timeout: Duration,
    /// Largest response body read. Default 8 MiB.
    pub max_body: usize,
    /// Follow a few same-origin redirects (Heat's `GET /stacks/{name}`
    /// answers 302). Default true; pull mode's pushes follow none.
    pub follow_redirects: bool,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            cacert: None,
            insecure: false,
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_body: DEFAULT_MAX_BODY,
            follow_redirects: true,
        }
    }
}

/// Makes ring the process's TLS crypto provider (a provider installed before
/// is kept). It is the one the AMQP and SMTP clients use, so one provider is
/// linked rather than two: reqwest's own default, aws-lc, is about 570 KiB
/// of code, resident on every node host. Every client here calls it.
pub fn install_tls_provider() {
    // Err only when a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A cheap-to-clone HTTP client with bounded bodies.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    max_body: usize,
}

/// A response with its body read.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body (at most the client's `max_body` bytes).
    pub body: Vec<u8>,
}

impl Response {
    /// Parses the body as JSON of type `T`.
    pub fn json<T: serde::de::DeserializeOwned>(
        &self,
        service: Service,
        url: &str,
    ) -> Result<T, CloudError> {
        serde_json::from_slice(&self.body).map_err(|e| CloudError::Decode {
            service,
            url: redact_url(url),
            message: format!("{e}"),
        })
    }
}

impl HttpClient {
    /// Builds a client. Fails on an unreadable or invalid CA file.
    pub fn new(opts: &HttpOptions) -> Result<Self, CloudError> {
        install_tls_provider();
        let mut b = reqwest::Client::builder()
            .timeout(opts.timeout)
            .connect_timeout(opts.connect_timeout)
            .user_agent(concat!("gearshift/", env!("CARGO_PKG_VERSION")))
            .redirect(redirect_policy(opts.follow_redirects));
        if let Some(path) = &opts.cacert {
            let pem = std::fs::read(path).map_err(|e| {
                CloudError::Config(format!("cannot read CA file {}: {e}", path.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                CloudError::Config(format!("invalid CA file {}: {e}", path.display()))
            })?;
            if certs.is_empty() {
                return Err(CloudError::Config(format!(
                    "CA file {} holds no certificate",
                    path.display()
                )));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if opts.insecure {
            tracing::warn!(
                "TLS certificate verification is disabled for OpenStack APIs (insecure)"
            );
            b = b.tls_danger_accept_invalid_certs(true);
        }
        let client = b
            .build()
            .map_err(|e| CloudError::Config(format!("cannot build HTTP client: {e}")))?;
        Ok(HttpClient {
            client,
            max_body: opts.max_body,
        })
    }

    /// Sends one request (a JSON body, if any; JSON accepted) and reads the
    /// whole (bounded) body. Error statuses are *not* turned into errors
    /// here: see [`check`].
    pub async fn send(
        &self,
        service: Service,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Response, CloudError> {
        let mut req = self.request(&method, url, headers);
        req = req.header("Accept", "application/json");
        if let Some(b) = body {
            req = req.json(b);
        }
        self.execute(service, method, url, req).await
    }

    /// Like [`HttpClient::send`], with a body of bytes whose type the
    /// caller gives in `headers` (an AWS query API's form), and no `Accept`.
    pub async fn send_bytes(
        &self,
        service: Service,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Response, CloudError> {
        let req = self.request(&method, url, headers).body(body);
        self.execute(service, method, url, req).await
    }

    fn request(
        &self,
        method: &Method,
        url: &str,
        headers: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let mut req = self.client.request(method.clone(), url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req
    }

    async fn execute(
        &self,
        service: Service,
        method: Method,
        url: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<Response, CloudError> {
        let transport = |e: reqwest::Error| CloudError::Transport {
            service,
            url: redact_url(url),
            message: describe_reqwest(&e),
        };
        let mut resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut buf = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            if buf.len() + chunk.len() > self.max_body {
                return Err(CloudError::Decode {
                    service,
                    url: redact_url(url),
                    message: format!("response body larger than {} bytes", self.max_body),
                });
            }
            buf.extend_from_slice(&chunk);
        }
        tracing::debug!(%service, %method, url = %redact_url(url), status = status.as_u16(), "cloud call");
        Ok(Response {
            status,
            headers,
            body: buf,
        })
    }
}

/// Heat's `GET /stacks/{name}` answers 302 to `/stacks/{name}/{id}`: a few
/// hops are enough, and our token header is not sent to another host (only
/// same-origin redirects are followed). `follow` false follows none.
fn redirect_policy(follow: bool) -> reqwest::redirect::Policy {
    if !follow {
        return reqwest::redirect::Policy::none();
    }
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .first()
            .map(|first| first.origin() == attempt.url().origin())
            .unwrap_or(false);
        if attempt.previous().len() > 3 || !same {
            attempt.stop()
        } else {
            attempt.follow()
        }
    })
}

/// Returns the response if its status is 2xx, else the classified error.
pub fn check(
    service: Service,
    method: &Method,
    url: &str,
    resp: Response,
) -> Result<Response, CloudError> {
    if resp.status.is_success() {
        return Ok(resp);
    }
    Err(api_error(service, method, url, &resp))
}

/// Builds the [`CloudError::Api`] for an error response, reading the
/// service's documented error body.
pub fn api_error(service: Service, method: &Method, url: &str, resp: &Response) -> CloudError {
    let status = resp.status.as_u16();
    let parsed: Option<Value> = serde_json::from_slice(&resp.body).ok();
    let text = String::from_utf8_lossy(&resp.body);
    let (message, kind) = match (&parsed, xml_error(&text)) {
        (Some(v), _) => error_message(service, v),
        (None, Some((code, msg))) => (msg, Some(code)),
        (None, None) => (text.trim().to_string(), None),
    };
    let message = if message.is_empty() {
        resp.status
            .canonical_reason()
            .unwrap_or("error")
            .to_string()
    } else {
        bounded(&message)
    };
    let quota = match service {
        Service::Compute => nova_names_quota(status, &message),
        Service::BlockStorage => cinder_names_quota(status, &message),
        Service::Orchestration => {
            status == 413
                || (matches!(status, 400 | 403) && crate::error::heat_reason_names_quota(&message))
        }
        Service::ContainerInfra => {
            matches!(status, 400 | 403 | 413) && magnum_reason_names_quota(&message)
        }
        _ => false,
    };
    let busy = status == 409
        && (kind.as_deref() == Some("ActionInProgress")
            || matches!(
                service,
                Service::Compute | Service::BlockStorage | Service::ContainerInfra
            ));
    CloudError::Api {
        service,
        method: method.to_string(),
        url: redact_url(url),
        status,
        message,
        quota,
        busy,
        kind,
    }
}

/// The `(Code, Message)` of an AWS-style XML error body, as heat-api-cfn
/// answers a refused pre-signed URL:
/// `<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>...</Message></Error></ErrorResponse>`.
pub fn xml_error(body: &str) -> Option<(String, String)> {
    let element = |name: &str| {
        let open = format!("<{name}>");
        let start = body.find(&open)? + open.len();
        let end = body[start..].find(&format!("</{name}>"))? + start;
        Some(body[start..end].trim().to_string())
    };
    if !body.trim_start().starts_with('<') {
        return None;
    }
    let code = element("Code").filter(|c| !c.is_empty())?;
    Some((code, element("Message").unwrap_or_default()))
}

/// Extracts (message, error type) from an API's documented error body:
/// - Keystone: `{"error": {"code", "message", "title"}}`
/// - Nova, Cinder: `{"<faultName>": {"message", "code"}}` (`forbidden`,
///   `overLimit`, `badRequest`, `itemNotFound`, `conflictingRequest`, ...)
/// - Heat: `{"code", "title", "explanation", "error": {"message", "type", "traceback"}}`
/// - Magnum: `{"errors": [{"status", "code", "title", "detail", "request_id"}]}`
/// - Glance/Neutron: `{"NeutronError": {"type", "message"}}` or plain text.
fn error_message(service: Service, v: &Value) -> (String, Option<String>) {
    let s = |v: &Value| v.as_str().map(str::to_string);
    if let Some(errors) = v.get("errors").and_then(Value::as_array)
        && let Some(first) = errors.first()
    {
        let detail = first.get("detail").and_then(s).unwrap_or_default();
        let title = first.get("title").and_then(s).unwrap_or_default();
        let msg = if detail.is_empty() { title } else { detail };
        return (msg, first.get("code").and_then(s));
    }
    if let Some(err) = v.get("error").filter(|e| e.is_object()) {
        let msg = err.get("message").and_then(s).unwrap_or_default();
        let kind = err
            .get("type")
            .and_then(s)
            .or_else(|| err.get("title").and_then(s));
        if service == Service::Orchestration
            && msg.is_empty()
            && let Some(expl) = v.get("explanation").and_then(s)
        {
            return (expl, kind);
        }
        return (msg, kind);
    }
    if let Some(obj) = v.as_object()
        && obj.len() == 1
        && let Some((name, inner)) = obj.iter().next()
        && let Some(msg) = inner.get("message").and_then(s)
    {
        let kind = inner
            .get("type")
            .and_then(s)
            .unwrap_or_else(|| name.clone());
        return (msg, Some(kind));
    }
    if let Some(expl) = v.get("explanation").and_then(s) {
        return (expl, v.get("title").and_then(s));
    }
    (v.to_string(), None)
}

/// Removes the query string (pre-signed URLs carry signatures) and any
/// user:password from a URL before it goes into an error or a log line.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.query().is_some() {
                u.set_query(Some("REDACTED"));
            }
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "<invalid url>".into(),
    }
}

fn describe_reqwest(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    };
    let mut msg = what.to_string();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    bounded(&msg)
}

#[cfg(test)]
mod tls_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, body: &str) -> Response {
        Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers: Default::default(),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn nova_quota_body() {
        let e = api_error(
            Service::Compute,
            &Method::POST,
            "http://n/v2.1/servers",
            &resp(
                403,
                r#"{"forbidden": {"code": 403, "message": "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"}}"#,
            ),
        );
        assert!(e.is_quota(), "{e}");
        assert_eq!(e.status(), Some(403));
        assert!(e.to_string().contains("already used 10 of 10"));
    }

    #[test]
    fn heat_conflict_is_busy() {
        let e = api_error(
            Service::Orchestration,
            &Method::PATCH,
            "http://h/v1/t/stacks/s/i",
            &resp(
                409,
                r#"{"explanation": "There was a conflict when trying to complete your request.", "code": 409, "error": {"message": "Stack s already has an action (UPDATE) in progress.", "traceback": null, "type": "ActionInProgress"}, "title": "Conflict"}"#,
            ),
        );
        assert!(e.is_busy());
        assert!(e.is_retryable());
        assert!(e.to_string().contains("already has an action"));
    }

    #[test]
    fn magnum_errors_list() {
        let e = api_error(
            Service::ContainerInfra,
            &Method::POST,
            "http://m/v1/clusters/c/actions/resize",
            &resp(
                400,
                r#"{"errors": [{"request_id": "", "code": "client", "status": 400, "title": "Bad", "detail": "Quota exceeded for instances", "links": []}]}"#,
            ),
        );
        assert!(e.is_quota());
        assert!(
            !api_error(
                Service::Identity,
                &Method::POST,
                "http://k/v3",
                &resp(401, "{}")
            )
            .is_quota()
        );
    }

    #[test]
    fn cfn_xml_refusals_name_their_code() {
        // heat-api-cfn 27, a changed Signature (docs/openstack-conformance.md, point 5).
        let body = "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>User is not authorized to perform action</Message></Error></ErrorResponse>";
        let e = api_error(
            Service::Orchestration,
            &Method::POST,
            "http://h:8000/v1/signal/arn?Signature=x",
            &resp(403, body),
        );
        assert_eq!(e.kind(), Some("AccessDenied"));
        assert!(e.to_string().contains("User is not authorized"), "{e}");
        assert_eq!(xml_error("not xml"), None);
        assert_eq!(xml_error("<html><body>502</body></html>"), None);
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("http://u:p@h:8000/v1/signal/arn?Signature=abc"),
            "http://h:8000/v1/signal/arn?REDACTED"
        );
    }
}
