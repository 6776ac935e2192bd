//! A Gnocchi client for the one call pull mode needs: add measures to a
//! resource's named metric, which Aodh's `gnocchi_*` alarms evaluate.
//!
//! ```text
//! POST /v1/resource/generic/{resource_id}/metric/{name}/measures
//! X-Auth-Token: <keystone token>
//! Content-Type: application/json
//!
//! [{"timestamp": "2024-05-06T07:08:09.000Z", "value": 42.5}]
//! ```
//!
//! Gnocchi answers `202 Accepted`. When it answers `404` (no such resource
//! or no such metric on it) and `create_missing` is on, we create what is
//! missing with the documented calls, then post again:
//! 1. `POST /v1/resource/generic/{id}/metric` with `{"<name>": {"archive_policy_name": ..., "unit": ...}}`
//!    appends the metric (409: it already exists, fine);
//! 2. if that is `404` too, the resource is missing: `POST /v1/resource/{type}`
//!    with `{"id": ..., "project_id": ..., "user_id": ..., "metrics": {...}}`
//!    creates it with the metric (409: created meanwhile, so append again).
//!
//! Which of the two was missing is decided by those calls' statuses, never
//! by reading Gnocchi's message. Resource ids that are not UUIDs are fine:
//! Gnocchi maps them to UUIDs and keeps the original as `original_resource_id`.
//!
//! The token comes from a [`gearshift_cloud::Session`] (Keystone v3); the
//! endpoint from the session's catalog (service type `metric`) unless one
//! is configured.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use gearshift_cloud::auth::Token;
use gearshift_cloud::http::{HttpClient, Method};
use gearshift_cloud::{Service, Session};
use serde_json::{Value, json};

use crate::error::{PushError, bounded};
use crate::http::transport;
use crate::sample::{Sample, Unit};
use crate::sigv4::uri_encode;

const TARGET: &str = "gnocchi";
/// The catalog type of Gnocchi.
pub const CATALOG_TYPE: &str = "metric";

/// What to send and how.
#[derive(Debug, Clone)]
pub struct GnocchiOptions {
    /// Gnocchi's base URL (without `/v1`); `None`: the catalog's `metric` endpoint.
    pub endpoint: Option<String>,
    /// Resource for samples that name none (the node's own).
    pub default_resource: Option<String>,
    /// Type of resources we create (`generic`).
    pub resource_type: String,
    /// Archive policy of metrics we create; `None`: Gnocchi's archive policy rules decide.
    pub archive_policy: Option<String>,
    /// Create missing metrics and resources on 404.
    pub create_missing: bool,
    /// Prefix of metric names (`gearshift.`).
    pub metric_prefix: String,
    /// Whole-request timeout.
    pub timeout: Duration,
}

/// One `POST .../measures` call: its path and body (what would be sent).
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuresRequest {
    /// The resource id.
    pub resource: String,
    /// The Gnocchi metric name.
    pub metric: String,
    /// The sample's unit (given when the metric is created).
    pub unit: Unit,
    /// Path under the endpoint: `/v1/resource/generic/{id}/metric/{name}/measures`.
    pub path: String,
    /// The JSON list of measures.
    pub body: Value,
}

/// The client.
#[derive(Debug, Clone)]
pub struct GnocchiClient {
    http: HttpClient,
    session: Session,
    opts: GnocchiOptions,
}

/// Groups samples into one measures call per (resource, metric), in order.
pub fn plan(
    samples: &[Sample],
    opts: &GnocchiOptions,
    now: DateTime<Utc>,
) -> Result<Vec<MeasuresRequest>, PushError> {
    let mut groups: BTreeMap<(String, String), (Unit, Vec<Value>)> = BTreeMap::new();
    for s in samples {
        s.validate()?;
        let resource = s
            .resource
            .clone()
            .or_else(|| opts.default_resource.clone())
            .ok_or_else(|| {
                PushError::Config(format!(
                    "sample {} names no Gnocchi resource and no resource_id is configured",
                    s.name
                ))
            })?;
        let metric = s.gnocchi_name(&opts.metric_prefix);
        let ts = s
            .timestamp
            .unwrap_or(now)
            .to_rfc3339_opts(SecondsFormat::Micros, true);
        groups
            .entry((resource, metric))
            .or_insert_with(|| (s.unit, Vec::new()))
            .1
            .push(json!({ "timestamp": ts, "value": s.value }));
    }
    Ok(groups
        .into_iter()
        .map(|((resource, metric), (unit, measures))| MeasuresRequest {
            path: format!(
                "/v1/resource/generic/{}/metric/{}/measures",
                uri_encode(&resource),
                uri_encode(&metric)
            ),
            resource,
            metric,
            unit,
            body: Value::Array(measures),
        })
        .collect())
}

/// Finds the `metric` endpoint in a token's catalog.
fn catalog_endpoint(token: &Token, interface: &str, region: Option<&str>) -> Option<String> {
    token
        .catalog
        .iter()
        .filter(|e| e.service_type == CATALOG_TYPE)
        .flat_map(|e| e.endpoints.iter())
        .find(|ep| {
            ep.interface == interface
                && region.is_none_or(|r| {
                    ep.region_id.as_deref() == Some(r) || ep.region.as_deref() == Some(r)
                })
        })
        .map(|ep| ep.url.trim_end_matches('/').to_string())
}

struct Answer {
    status: u16,
    body: String,
}

impl GnocchiClient {
    /// A client; no network until the first push.
    pub fn new(session: Session, opts: GnocchiOptions) -> Result<Self, PushError> {
        if let Some(ep) = &opts.endpoint {
            let u = url::Url::parse(ep)
                .map_err(|e| PushError::Config(format!("Gnocchi endpoint {ep:?}: {e}")))?;
            if !matches!(u.scheme(), "http" | "https") {
                return Err(PushError::Config(format!(
                    "Gnocchi endpoint {ep:?}: scheme must be http or https"
                )));
            }
        }
        if opts.resource_type.is_empty()
            || !opts
                .resource_type
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(PushError::Config(format!(
                "Gnocchi resource type {:?} is not a valid name",
                opts.resource_type
            )));
        }
        let creds = session.credentials();
        let http = crate::http::client(opts.timeout, creds.cacert.clone(), creds.insecure)?;
        Ok(GnocchiClient {
            http,
            session,
            opts,
        })
    }

    /// The options.
    pub fn options(&self) -> &GnocchiOptions {
        &self.opts
    }

    /// Pushes `samples`: one measures call per (resource, metric).
    pub async fn push(&self, samples: &[Sample]) -> Result<(), PushError> {
        for req in plan(samples, &self.opts, Utc::now())? {
            self.post_measures(&req).await?;
        }
        Ok(())
    }

    /// Sends one measures call, creating the metric or resource on 404 when
    /// configured to.
    pub async fn post_measures(&self, req: &MeasuresRequest) -> Result<(), PushError> {
        let a = self.call(Method::POST, &req.path, &req.body).await?;
        if is_success(a.status) {
            return Ok(());
        }
        if a.status != 404 || !self.opts.create_missing {
            return Err(api_error(a));
        }
        tracing::info!(resource = %req.resource, metric = %req.metric, "Gnocchi metric or resource missing; creating it");
        self.ensure_metric(req).await?;
        let a = self.call(Method::POST, &req.path, &req.body).await?;
        if is_success(a.status) {
            Ok(())
        } else {
            Err(api_error(a))
        }
    }

    fn metric_definition(&self, unit: Unit) -> Value {
        let mut def = serde_json::Map::new();
        if let Some(ap) = &self.opts.archive_policy {
            def.insert("archive_policy_name".into(), json!(ap));
        }
        def.insert("unit".into(), json!(unit.as_str()));
        Value::Object(def)
    }

    async fn ensure_metric(&self, req: &MeasuresRequest) -> Result<(), PushError> {
        let metrics = json!({ req.metric.clone(): self.metric_definition(req.unit) });
        let append_path = format!("/v1/resource/generic/{}/metric", uri_encode(&req.resource));
        let a = self.call(Method::POST, &append_path, &metrics).await?;
        if is_success(a.status) || a.status == 409 {
            return Ok(());
        }
        if a.status != 404 {
            return Err(api_error(a));
        }
        // The resource itself is missing: create it with the metric.
        let token = self.session.token().await?;
        let mut res = serde_json::Map::new();
        res.insert("id".into(), json!(req.resource));
        if let Some(p) = &token.project_id {
            res.insert("project_id".into(), json!(p));
        }
        if let Some(u) = &token.user_id {
            res.insert("user_id".into(), json!(u));
        }
        res.insert("metrics".into(), metrics.clone());
        let create_path = format!("/v1/resource/{}", self.opts.resource_type);
        let a = self
            .call(Method::POST, &create_path, &Value::Object(res))
            .await?;
        if is_success(a.status) {
            return Ok(());
        }
        if a.status != 409 {
            return Err(api_error(a));
        }
        // Created by someone else meanwhile, maybe without our metric.
        let a = self.call(Method::POST, &append_path, &metrics).await?;
        if is_success(a.status) || a.status == 409 {
            Ok(())
        } else {
            Err(api_error(a))
        }
    }

    async fn endpoint(&self, token: &Token) -> Result<String, PushError> {
        if let Some(ep) = &self.opts.endpoint {
            return Ok(ep.trim_end_matches('/').to_string());
        }
        let creds = self.session.credentials();
        catalog_endpoint(token, creds.interface.as_str(), creds.region.as_deref()).ok_or_else(|| {
            PushError::Config(format!(
                "the service catalog has no Gnocchi ({CATALOG_TYPE}) endpoint on interface {}{}; set gnocchi.endpoint",
                creds.interface.as_str(),
                creds
                    .region
                    .as_deref()
                    .map(|r| format!(" in region {r}"))
                    .unwrap_or_default()
            ))
        })
    }

    /// One request with the token; a 401 gets one retry with a new token.
    async fn call(&self, method: Method, path: &str, body: &Value) -> Result<Answer, PushError> {
        let mut retried = false;
        loop {
            let token = self.session.token().await?;
            let url = format!("{}{path}", self.endpoint(&token).await?);
            let resp = self
                .http
                .send(
                    Service::Metric,
                    method.clone(),
                    &url,
                    &[("X-Auth-Token", token.value.expose())],
                    Some(body),
                )
                .await
                .map_err(|e| transport(TARGET, e))?;
            let status = resp.status.as_u16();
            let buf = resp.body;
            tracing::debug!(%method, %url, status, "gnocchi call");
            if status == 401 && !retried {
                tracing::info!("Gnocchi refused the token (401); authenticating again");
                self.session.invalidate(&token).await;
                retried = true;
                continue;
            }
            return Ok(Answer {
                status,
                body: String::from_utf8_lossy(&buf).into_owned(),
            });
        }
    }
}

fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Reads Gnocchi's error body (`{"code", "description", "title"}` from its
/// WSGI stack, or plain text) into a [`PushError::Api`].
fn api_error(a: Answer) -> PushError {
    let message = serde_json::from_str::<Value>(&a.body)
        .ok()
        .and_then(|v| {
            v.get("description")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("title"))
                .and_then(|d| d.as_str().map(str::to_string))
        })
        .unwrap_or(a.body);
    PushError::Api {
        target: TARGET,
        status: a.status,
        code: None,
        message: bounded(&message),
        retryable: a.status >= 500 || a.status == 429 || a.status == 408,
        auth: matches!(a.status, 401 | 403),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn opts() -> GnocchiOptions {
        GnocchiOptions {
            endpoint: Some("http://gnocchi:8041".into()),
            default_resource: Some("node-1.example.com".into()),
            resource_type: "generic".into(),
            archive_policy: Some("low".into()),
            create_missing: true,
            metric_prefix: "gearshift.".into(),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn plan_groups_by_resource_and_metric() {
        let t = Utc.with_ymd_and_hms(2024, 5, 6, 7, 8, 9).unwrap();
        let samples = vec![
            Sample::new("NodeUtilization", 40.0, Unit::PERCENT),
            Sample::new("ActiveGears", 4.0, Unit::COUNT),
            Sample::new("CapacityUtilization", 55.5, Unit::PERCENT)
                .with_resource("gearshift-profile-small"),
            Sample {
                timestamp: Some(t + chrono::Duration::seconds(60)),
                ..Sample::new("NodeUtilization", 50.0, Unit::PERCENT)
            },
        ];
        let reqs = plan(&samples, &opts(), t).unwrap();
        assert_eq!(reqs.len(), 3);
        let util = reqs
            .iter()
            .find(|r| r.metric == "gearshift.node_utilization")
            .unwrap();
        assert_eq!(
            util.path,
            "/v1/resource/generic/node-1.example.com/metric/gearshift.node_utilization/measures"
        );
        assert_eq!(
            util.body,
            json!([
                {"timestamp": "2024-05-06T07:08:09.000000Z", "value": 40.0},
                {"timestamp": "2024-05-06T07:09:09.000000Z", "value": 50.0}
            ])
        );
        assert!(reqs.iter().any(|r| r.resource == "gearshift-profile-small"
            && r.path.contains("/metric/gearshift.capacity_utilization/")));
    }

    #[test]
    fn plan_needs_a_resource() {
        let mut o = opts();
        o.default_resource = None;
        let e = plan(&[Sample::new("A", 1.0, Unit::COUNT)], &o, Utc::now()).unwrap_err();
        assert!(matches!(e, PushError::Config(_)), "{e}");
    }

    #[test]
    fn resource_ids_are_path_encoded() {
        let reqs = plan(
            &[Sample::new("A", 1.0, Unit::COUNT).with_resource("a/b c")],
            &opts(),
            Utc::now(),
        )
        .unwrap();
        assert!(
            reqs[0]
                .path
                .starts_with("/v1/resource/generic/a%2Fb%20c/metric/")
        );
    }

    #[test]
    fn catalog_lookup_by_interface_and_region() {
        use gearshift_cloud::auth::{CatalogEntry, Endpoint};
        let ep = |interface: &str, region: &str, url: &str| Endpoint {
            interface: interface.into(),
            region_id: Some(region.into()),
            region: None,
            url: url.into(),
        };
        let token = Token {
            value: gearshift_cloud::auth::Secret::new("t"),
            expires_at: Utc::now(),
            issued_at: None,
            project_id: None,
            user_id: None,
            catalog: vec![
                CatalogEntry {
                    service_type: "compute".into(),
                    name: None,
                    endpoints: vec![ep("public", "R1", "http://nova")],
                },
                CatalogEntry {
                    service_type: CATALOG_TYPE.into(),
                    name: Some("gnocchi".into()),
                    endpoints: vec![
                        ep("internal", "R1", "http://gnocchi-int:8041"),
                        ep("public", "R1", "http://gnocchi-r1:8041/"),
                        ep("public", "R2", "http://gnocchi-r2:8041"),
                    ],
                },
            ],
        };
        assert_eq!(
            catalog_endpoint(&token, "public", Some("R2")).as_deref(),
            Some("http://gnocchi-r2:8041")
        );
        assert_eq!(
            catalog_endpoint(&token, "public", None).as_deref(),
            Some("http://gnocchi-r1:8041")
        );
        assert_eq!(
            catalog_endpoint(&token, "internal", Some("R1")).as_deref(),
            Some("http://gnocchi-int:8041")
        );
        assert_eq!(catalog_endpoint(&token, "admin", None), None);
        assert_eq!(catalog_endpoint(&token, "public", Some("R3")), None);
    }

    #[test]
    fn errors() {
        let e = api_error(Answer {
            status: 404,
            body:
                r#"{"code": 404, "description": "Metric x does not exist", "title": "Not Found"}"#
                    .into(),
        });
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("does not exist"));
        assert!(
            api_error(Answer {
                status: 503,
                body: "down".into()
            })
            .is_retryable()
        );
        assert!(
            api_error(Answer {
                status: 403,
                body: "".into()
            })
            .is_auth()
        );
    }
}
