//! Keystone tokens: the request body, and the token with its service
//! catalog.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::credentials::{AuthMethod, Credentials, Interface, ProjectRef, Secret};
use crate::error::{CloudError, Service};

/// Builds the `POST /v3/auth/tokens` body for these credentials.
pub fn token_request_body(creds: &Credentials) -> Value {
    let identity = match &creds.method {
        AuthMethod::Password { user, password } => {
            let mut u = user.to_json();
            u["password"] = json!(password.expose());
            json!({ "methods": ["password"], "password": { "user": u } })
        }
        AuthMethod::ApplicationCredential {
            id,
            name,
            user,
            secret,
        } => {
            let mut ac = serde_json::Map::new();
            if let Some(id) = id {
                ac.insert("id".into(), json!(id));
            } else {
                if let Some(n) = name {
                    ac.insert("name".into(), json!(n));
                }
                if let Some(u) = user {
                    ac.insert("user".into(), u.to_json());
                }
            }
            ac.insert("secret".into(), json!(secret.expose()));
            json!({ "methods": ["application_credential"], "application_credential": ac })
        }
    };
    let mut auth = json!({ "identity": identity });
    // An application credential carries its project: Keystone answers 401
    // "Application credentials cannot request a scope." to any scope, even
    // its own project's (Keystone 30), so a project left in the
    // environment (`OS_PROJECT_NAME`) is never sent with one.
    let password = matches!(creds.method, AuthMethod::Password { .. });
    if let Some(p) = creds.project.as_ref().filter(|_| password) {
        let proj = match p {
            ProjectRef::Id(id) => json!({ "id": id }),
            ProjectRef::Name { name, domain } => {
                json!({ "name": name, "domain": domain.to_json() })
            }
        };
        auth["scope"] = json!({ "project": proj });
    }
    json!({ "auth": auth })
}

/// One catalog endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Endpoint {
    /// `public`, `internal` or `admin`.
    pub interface: String,
    /// Region id.
    #[serde(default)]
    pub region_id: Option<String>,
    /// Region name (older Keystone).
    #[serde(default)]
    pub region: Option<String>,
    /// Base URL.
    pub url: String,
}

/// One catalog service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CatalogEntry {
    /// Service type (`compute`, `orchestration`, ...).
    #[serde(rename = "type")]
    pub service_type: String,
    /// Service name.
    #[serde(default)]
    pub name: Option<String>,
    /// Its endpoints.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

/// A Keystone token with its catalog.
#[derive(Debug, Clone)]
pub struct Token {
    /// The `X-Subject-Token` value.
    pub value: Secret,
    /// When Keystone said it expires.
    pub expires_at: DateTime<Utc>,
    /// When Keystone issued it.
    pub issued_at: Option<DateTime<Utc>>,
    /// The scoped project's id.
    pub project_id: Option<String>,
    /// The user's id.
    pub user_id: Option<String>,
    /// The service catalog.
    pub catalog: Vec<CatalogEntry>,
}

impl Token {
    /// The endpoint URL for `service` on `interface` in `region` (any
    /// region when `None`), without a trailing slash.
    pub fn endpoint(
        &self,
        service: Service,
        interface: Interface,
        region: Option<&str>,
    ) -> Result<String, CloudError> {
        for ty in service.catalog_aliases() {
            for entry in self.catalog.iter().filter(|e| e.service_type == *ty) {
                let found = entry.endpoints.iter().find(|ep| {
                    ep.interface == interface.as_str()
                        && region.is_none_or(|r| {
                            ep.region_id.as_deref() == Some(r) || ep.region.as_deref() == Some(r)
                        })
                });
                if let Some(ep) = found {
                    return Ok(ep.url.trim_end_matches('/').to_string());
                }
            }
        }
        Err(CloudError::Config(format!(
            "the service catalog has no {} endpoint of type {} on interface {}{}",
            service.name(),
            service.catalog_aliases().join("/"),
            interface.as_str(),
            region
                .map(|r| format!(" in region {r}"))
                .unwrap_or_default()
        )))
    }
}

#[derive(Deserialize)]
pub(super) struct TokenBody {
    pub(super) token: TokenInner,
}

#[derive(Deserialize)]
pub(super) struct TokenInner {
    pub(super) expires_at: DateTime<Utc>,
    #[serde(default)]
    pub(super) issued_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(super) project: Option<IdOnly>,
    #[serde(default)]
    pub(super) user: Option<IdOnly>,
    #[serde(default)]
    pub(super) catalog: Vec<CatalogEntry>,
}

#[derive(Deserialize)]
pub(super) struct IdOnly {
    pub(super) id: String,
}
