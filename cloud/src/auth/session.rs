//! The [`Session`]: a Keystone token kept fresh, endpoints from its
//! catalog (or overrides), and requests with a 401 retry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::Value;

use super::credentials::{Credentials, Secret};
use super::token::{Token, TokenBody, token_request_body};
use crate::error::{CloudError, Service};
use crate::http::{HttpClient, HttpOptions, Response, check};

/// Session tuning.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// HTTP settings (TLS from the credentials are merged in).
    pub http: HttpOptions,
    /// Get a new token this long before the current one expires (at most
    /// half the token's lifetime). Default 5 minutes.
    pub refresh_margin: Duration,
    /// Endpoint URLs to use instead of the catalog's, by catalog service
    /// type (`compute`, `orchestration`, ...); `{project_id}` is replaced.
    pub endpoint_overrides: BTreeMap<String, String>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            http: HttpOptions::default(),
            refresh_margin: Duration::from_secs(300),
            endpoint_overrides: BTreeMap::new(),
        }
    }
}

/// An authenticated session: a token kept fresh, and requests to catalog
/// endpoints with that token. Cheap to clone; clones share the token.
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("auth_url", &self.inner.creds.auth_url)
            .field("region", &self.inner.creds.region)
            .finish_non_exhaustive()
    }
}

struct SessionInner {
    http: HttpClient,
    creds: Credentials,
    opts: SessionOptions,
    token: tokio::sync::Mutex<Option<Arc<Token>>>,
}

impl Session {
    /// A session; no network until the first request.
    pub fn new(creds: Credentials, mut opts: SessionOptions) -> Result<Self, CloudError> {
        if opts.http.cacert.is_none() {
            opts.http.cacert = creds.cacert.clone();
        }
        opts.http.insecure |= creds.insecure;
        for (ty, url) in &opts.endpoint_overrides {
            url::Url::parse(&url.replace("{project_id}", "p")).map_err(|e| {
                CloudError::Config(format!("endpoint override for {ty}: {url:?}: {e}"))
            })?;
        }
        let http = HttpClient::new(&opts.http)?;
        Ok(Session {
            inner: Arc::new(SessionInner {
                http,
                creds,
                opts,
                token: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// The HTTP client (for calls that need no token, like pre-signed URLs).
    pub fn http(&self) -> &HttpClient {
        &self.inner.http
    }

    /// The credentials this session uses.
    pub fn credentials(&self) -> &Credentials {
        &self.inner.creds
    }

    /// A valid token, fetching or refreshing it when needed.
    pub async fn token(&self) -> Result<Arc<Token>, CloudError> {
        let mut guard = self.inner.token.lock().await;
        if let Some(t) = guard.as_ref()
            && !self.needs_refresh(t, Utc::now())
        {
            return Ok(t.clone());
        }
        let fresh = Arc::new(self.authenticate().await?);
        *guard = Some(fresh.clone());
        Ok(fresh)
    }

    /// Forgets `stale` (after a 401), unless it was already replaced.
    pub async fn invalidate(&self, stale: &Token) {
        let mut guard = self.inner.token.lock().await;
        if guard.as_ref().is_some_and(|t| t.value == stale.value) {
            *guard = None;
        }
    }

    fn needs_refresh(&self, t: &Token, now: DateTime<Utc>) -> bool {
        let margin = chrono::Duration::from_std(self.inner.opts.refresh_margin)
            .unwrap_or(chrono::Duration::seconds(300));
        let margin = match t.issued_at {
            Some(issued) => margin.min((t.expires_at - issued) / 2),
            None => margin,
        };
        now + margin >= t.expires_at
    }

    async fn authenticate(&self) -> Result<Token, CloudError> {
        let creds = &self.inner.creds;
        let url = format!("{}/auth/tokens", creds.auth_url);
        let body = token_request_body(creds);
        let resp = self
            .inner
            .http
            .send(Service::Identity, Method::POST, &url, &[], Some(&body))
            .await?;
        let resp = check(Service::Identity, &Method::POST, &url, resp)?;
        let value = resp
            .headers
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| CloudError::Decode {
                service: Service::Identity,
                url: url.clone(),
                message: "no X-Subject-Token header".into(),
            })?
            .to_string();
        let parsed: TokenBody = resp.json(Service::Identity, &url)?;
        let t = parsed.token;
        tracing::info!(
            expires_at = %t.expires_at,
            project = ?t.project.as_ref().map(|p| &p.id),
            services = t.catalog.len(),
            "got a Keystone token"
        );
        Ok(Token {
            value: Secret::new(value),
            expires_at: t.expires_at,
            issued_at: t.issued_at,
            project_id: t.project.map(|p| p.id),
            user_id: t.user.map(|u| u.id),
            catalog: t.catalog,
        })
    }

    /// The base URL of `service` (override, else catalog), no trailing slash.
    pub async fn endpoint(&self, service: Service) -> Result<String, CloudError> {
        let token = self.token().await?;
        self.endpoint_with(&token, service)
    }

    fn endpoint_with(&self, token: &Token, service: Service) -> Result<String, CloudError> {
        for ty in service.catalog_aliases() {
            if let Some(url) = self.inner.opts.endpoint_overrides.get(*ty) {
                let pid = token.project_id.as_deref().unwrap_or("");
                return Ok(url
                    .replace("{project_id}", pid)
                    .trim_end_matches('/')
                    .to_string());
            }
        }
        token.endpoint(
            service,
            self.inner.creds.interface,
            self.inner.creds.region.as_deref(),
        )
    }

    /// The scoped project's id.
    pub async fn project_id(&self) -> Result<String, CloudError> {
        self.token()
            .await?
            .project_id
            .clone()
            .ok_or_else(|| CloudError::Config("the token is not scoped to a project".into()))
    }

    /// Sends a request with the token to `path` under `service`'s endpoint
    /// (or to `path` itself when it is an absolute `http(s)://` URL, like a
    /// Heat `signal_url`). Retries once with a new token on 401. Returns
    /// the response if 2xx, else the classified [`CloudError`].
    pub async fn request(
        &self,
        service: Service,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Response, CloudError> {
        let mut retried = false;
        loop {
            let token = self.token().await?;
            let url = if path.starts_with("http://") || path.starts_with("https://") {
                path.to_string()
            } else {
                format!(
                    "{}/{}",
                    self.endpoint_with(&token, service)?,
                    path.trim_start_matches('/')
                )
            };
            let mut hs: Vec<(&str, &str)> = vec![("X-Auth-Token", token.value.expose())];
            hs.extend_from_slice(headers);
            let resp = self
                .inner
                .http
                .send(service, method.clone(), &url, &hs, body)
                .await?;
            if resp.status.as_u16() == 401 && !retried {
                tracing::info!(%service, "token refused (401); authenticating again");
                self.invalidate(&token).await;
                retried = true;
                continue;
            }
            return check(service, &method, &url, resp);
        }
    }
}
