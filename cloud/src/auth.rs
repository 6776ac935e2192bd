//! Keystone v3: credentials, token, catalog, endpoints.
//!
//! ## Where credentials come from
//! - [`Credentials::from_env`]: the `OS_*` variables an openrc / the seeds'
//!   `auth.env` sets (`OS_AUTH_URL`, `OS_USERNAME`/`OS_USER_ID`,
//!   `OS_PASSWORD`, `OS_PROJECT_NAME` or the v2-era `OS_TENANT_NAME`,
//!   `OS_PROJECT_ID`/`OS_TENANT_ID`, `OS_USER_DOMAIN_NAME`/`_ID`,
//!   `OS_PROJECT_DOMAIN_NAME`/`_ID`, `OS_DOMAIN_NAME`/`_ID` as a fallback for
//!   both, `OS_REGION_NAME`, `OS_INTERFACE`/`OS_ENDPOINT_TYPE`,
//!   `OS_AUTH_TYPE` (`password`, `v3password`, `v3applicationcredential`)
//!   with `OS_APPLICATION_CREDENTIAL_ID`/`_NAME`/`_SECRET`, `OS_CACERT`,
//!   `OS_INSECURE`).
//! - [`Credentials::from_env_file`]: the same variables read from a file of
//!   `export OS_X=value` lines (the seeds' `auth.env`), without a shell.
//! - [`Credentials::from_clouds_yaml`]: `clouds.yaml` (plus `secure.yaml`
//!   beside it), found at an explicit path, `$OS_CLIENT_CONFIG_FILE`,
//!   `./clouds.yaml`, `~/.config/openstack/clouds.yaml`, then
//!   `/etc/openstack/clouds.yaml`.
//!
//! An auth URL without a version gets `/v3`; a v2.0 URL (old openrc files)
//! is rewritten to `/v3` with a warning, since Keystone v2 is gone.
//! Without any domain, the `default` domain id is used, like the CLI does.
//!
//! ## Why not the `openstack_sdk` crate
//! We read `openstack_sdk` 0.22 (it is on our reqwest 0.13). It does not
//! fit: it has no Heat (orchestration) API, which two handlers and the
//! node agent need; its default features pull in interactive prompts,
//! web SSO, OIDC and a wasm plugin host; it persists tokens to `~/.osc`
//! by default; and it probes every endpoint's version document before the
//! first call, which our fake servers would have to mimic with no gain.
//! We need about a dozen calls, so a small client of our own is simpler
//! to audit and test. [`Session`] is what the other modules build on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{CloudError, Service};
use crate::http::{HttpClient, HttpOptions, Response, check};

/// A secret string: never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A Keystone domain, by id or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainRef {
    /// By id (for example `default`).
    Id(String),
    /// By name (for example `Default`).
    Name(String),
}

impl DomainRef {
    fn to_json(&self) -> Value {
        match self {
            DomainRef::Id(id) => json!({ "id": id }),
            DomainRef::Name(n) => json!({ "name": n }),
        }
    }
}

/// The user, by id or by name within a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserRef {
    /// By id (globally unique).
    Id(String),
    /// By name in a domain.
    Name {
        /// User name.
        name: String,
        /// Its domain.
        domain: DomainRef,
    },
}

impl UserRef {
    fn to_json(&self) -> Value {
        match self {
            UserRef::Id(id) => json!({ "id": id }),
            UserRef::Name { name, domain } => json!({ "name": name, "domain": domain.to_json() }),
        }
    }
}

/// How to authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    /// The `password` method.
    Password {
        /// The user.
        user: UserRef,
        /// Password.
        password: Secret,
    },
    /// The `application_credential` method (scope is implied by the credential).
    ApplicationCredential {
        /// Credential id; or `name` plus `user`.
        id: Option<String>,
        /// Credential name (needs `user`).
        name: Option<String>,
        /// The owning user, when the credential is given by name.
        user: Option<UserRef>,
        /// Secret.
        secret: Secret,
    },
}

/// The project to scope the token to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectRef {
    /// By id.
    Id(String),
    /// By name in a domain.
    Name {
        /// Project name.
        name: String,
        /// Its domain.
        domain: DomainRef,
    },
}

/// Which catalog endpoints to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interface {
    /// `public` (the default).
    #[default]
    Public,
    /// `internal`.
    Internal,
    /// `admin`.
    Admin,
}

impl Interface {
    /// Parses `public`, `publicURL`, `internal`, `internalURL`, `admin`, `adminURL`.
    pub fn parse(s: &str) -> Result<Self, CloudError> {
        match s.trim().to_ascii_lowercase().trim_end_matches("url") {
            "public" => Ok(Interface::Public),
            "internal" => Ok(Interface::Internal),
            "admin" => Ok(Interface::Admin),
            other => Err(CloudError::Config(format!(
                "interface {other:?}: expected public, internal or admin"
            ))),
        }
    }

    /// The catalog's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Interface::Public => "public",
            Interface::Internal => "internal",
            Interface::Admin => "admin",
        }
    }
}

/// Everything needed to get a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Keystone v3 base URL, ending in `/v3`.
    pub auth_url: String,
    /// How to authenticate.
    pub method: AuthMethod,
    /// Project scope (none for application credentials).
    pub project: Option<ProjectRef>,
    /// Region for endpoint selection (any region when absent).
    pub region: Option<String>,
    /// Catalog interface.
    pub interface: Interface,
    /// Extra CA certificates (PEM).
    pub cacert: Option<PathBuf>,
    /// Skip TLS verification.
    pub insecure: bool,
}

/// Normalises an auth URL to the v3 root.
pub fn normalize_auth_url(url: &str) -> Result<String, CloudError> {
    let trimmed = url.trim().trim_end_matches('/');
    let parsed = url::Url::parse(trimmed)
        .map_err(|e| CloudError::Config(format!("auth URL {trimmed:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(CloudError::Config(format!(
            "auth URL {trimmed:?}: scheme must be http or https"
        )));
    }
    if trimmed.ends_with("/v3") {
        Ok(trimmed.to_string())
    } else if let Some(base) = trimmed.strip_suffix("/v2.0") {
        tracing::warn!(auth_url = %trimmed, "Keystone v2.0 URL given; using v3 at the same root");
        Ok(format!("{base}/v3"))
    } else {
        Ok(format!("{trimmed}/v3"))
    }
}

impl Credentials {
    /// Reads the `OS_*` variables of this process.
    pub fn from_env() -> Result<Self, CloudError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads `OS_*` variables from a file of `export OS_X=value` lines (the
    /// seeds' `auth.env`). Comments, blank lines and non-`OS_` lines are
    /// ignored; a value that needs a shell (`$VAR`, `$(...)`, backticks) is
    /// refused, since a service cannot prompt for a password.
    pub fn from_env_file(path: &Path) -> Result<Self, CloudError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CloudError::Config(format!("cannot read {}: {e}", path.display())))?;
        let vars = parse_env_file(&text)
            .map_err(|e| CloudError::Config(format!("{}: {e}", path.display())))?;
        Self::from_vars(|k| vars.get(k).cloned())
    }

    /// Builds credentials from a variable lookup (what [`Credentials::from_env`] uses).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, CloudError> {
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let first = |ks: &[&str]| ks.iter().find_map(|k| var(k));
        let auth_url = var("OS_AUTH_URL")
            .ok_or_else(|| CloudError::Config("OS_AUTH_URL is not set".into()))?;
        let fallback_domain = || {
            var("OS_DOMAIN_ID")
                .map(DomainRef::Id)
                .or_else(|| var("OS_DOMAIN_NAME").map(DomainRef::Name))
                .unwrap_or_else(|| DomainRef::Id("default".into()))
        };
        let user_domain = var("OS_USER_DOMAIN_ID")
            .map(DomainRef::Id)
            .or_else(|| var("OS_USER_DOMAIN_NAME").map(DomainRef::Name))
            .unwrap_or_else(fallback_domain);
        let project_domain = var("OS_PROJECT_DOMAIN_ID")
            .map(DomainRef::Id)
            .or_else(|| var("OS_PROJECT_DOMAIN_NAME").map(DomainRef::Name))
            .unwrap_or_else(fallback_domain);
        let user = var("OS_USER_ID").map(UserRef::Id).or_else(|| {
            first(&["OS_USERNAME", "OS_USER_NAME"]).map(|name| UserRef::Name {
                name,
                domain: user_domain.clone(),
            })
        });
        let auth_type = var("OS_AUTH_TYPE").unwrap_or_else(|| {
            if var("OS_APPLICATION_CREDENTIAL_SECRET").is_some() {
                "v3applicationcredential".into()
            } else {
                "password".into()
            }
        });
        let raw = RawAuth {
            auth_url,
            auth_type,
            user,
            password: var("OS_PASSWORD"),
            app_cred_id: var("OS_APPLICATION_CREDENTIAL_ID"),
            app_cred_name: var("OS_APPLICATION_CREDENTIAL_NAME"),
            app_cred_secret: var("OS_APPLICATION_CREDENTIAL_SECRET"),
            project_id: first(&["OS_PROJECT_ID", "OS_TENANT_ID"]),
            project_name: first(&["OS_PROJECT_NAME", "OS_TENANT_NAME"]),
            project_domain,
            region: var("OS_REGION_NAME"),
            interface: first(&["OS_INTERFACE", "OS_ENDPOINT_TYPE"]),
            cacert: var("OS_CACERT").map(PathBuf::from),
            insecure: var("OS_INSECURE")
                .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
                .unwrap_or(false),
        };
        raw.build("OS_* variables")
    }

    /// Reads cloud `cloud` from `clouds.yaml`: `path` if given, else the
    /// standard search path (see the module doc). A `secure.yaml` in the
    /// same directory is merged over it.
    pub fn from_clouds_yaml(cloud: &str, path: Option<&Path>) -> Result<Self, CloudError> {
        let file = match path {
            Some(p) => p.to_path_buf(),
            None => find_clouds_yaml().ok_or_else(|| {
                CloudError::Config(format!(
                    "no clouds.yaml found (looked at {})",
                    clouds_yaml_search_path()
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|e| CloudError::Config(format!("cannot read {}: {e}", file.display())))?;
        let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)
            .map_err(|e| CloudError::Config(format!("{}: {e}", file.display())))?;
        let secure = file.with_file_name("secure.yaml");
        if let Ok(sec_text) = std::fs::read_to_string(&secure) {
            let sec: serde_yaml::Value = serde_yaml::from_str(&sec_text)
                .map_err(|e| CloudError::Config(format!("{}: {e}", secure.display())))?;
            merge_yaml(&mut doc, sec);
        }
        Self::from_clouds_doc(cloud, &doc, &file.display().to_string())
    }

    /// Builds credentials from an already-parsed `clouds.yaml` document.
    pub fn from_clouds_doc(
        cloud: &str,
        doc: &serde_yaml::Value,
        origin: &str,
    ) -> Result<Self, CloudError> {
        let entry = doc
            .get("clouds")
            .and_then(|c| c.get(cloud))
            .ok_or_else(|| CloudError::Config(format!("{origin}: no cloud named {cloud:?}")))?;
        let entry: CloudEntry = serde_yaml::from_value(entry.clone())
            .map_err(|e| CloudError::Config(format!("{origin}: clouds.{cloud}: {e}")))?;
        if let Some(v) = &entry.identity_api_version
            && !matches!(v.as_str(), "3" | "3.0")
        {
            return Err(CloudError::Config(format!(
                "{origin}: clouds.{cloud}.identity_api_version {v:?}: only 3 is supported"
            )));
        }
        let a = entry.auth;
        let dom = |id: Option<String>, name: Option<String>| {
            id.map(DomainRef::Id).or_else(|| name.map(DomainRef::Name))
        };
        let fallback = dom(a.domain_id.clone(), a.domain_name.clone())
            .unwrap_or_else(|| DomainRef::Id("default".into()));
        let user_domain = dom(a.user_domain_id, a.user_domain_name).unwrap_or(fallback.clone());
        let project_domain =
            dom(a.project_domain_id, a.project_domain_name).unwrap_or(fallback.clone());
        let user = a.user_id.map(UserRef::Id).or_else(|| {
            a.username.map(|name| UserRef::Name {
                name,
                domain: user_domain.clone(),
            })
        });
        let raw = RawAuth {
            auth_url: a.auth_url.ok_or_else(|| {
                CloudError::Config(format!("{origin}: clouds.{cloud}.auth.auth_url is missing"))
            })?,
            auth_type: entry.auth_type.unwrap_or_else(|| {
                if a.application_credential_secret.is_some() {
                    "v3applicationcredential".into()
                } else {
                    "password".into()
                }
            }),
            user,
            password: a.password,
            app_cred_id: a.application_credential_id,
            app_cred_name: a.application_credential_name,
            app_cred_secret: a.application_credential_secret,
            project_id: a.project_id.or(a.tenant_id),
            project_name: a.project_name.or(a.tenant_name),
            project_domain,
            region: entry.region_name,
            interface: entry.interface.or(entry.endpoint_type),
            cacert: entry.cacert.map(PathBuf::from),
            insecure: entry.verify == Some(false) || entry.insecure == Some(true),
        };
        raw.build(&format!("{origin}: clouds.{cloud}"))
    }
}

/// The standard `clouds.yaml` search path, in order.
pub fn clouds_yaml_search_path() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("OS_CLIENT_CONFIG_FILE")
        && !p.is_empty()
    {
        out.push(PathBuf::from(p));
    }
    out.push(PathBuf::from("clouds.yaml"));
    if let Ok(home) = std::env::var("HOME")
        && !home.is_empty()
    {
        out.push(Path::new(&home).join(".config/openstack/clouds.yaml"));
    }
    out.push(PathBuf::from("/etc/openstack/clouds.yaml"));
    out
}

fn find_clouds_yaml() -> Option<PathBuf> {
    clouds_yaml_search_path().into_iter().find(|p| p.is_file())
}

fn merge_yaml(base: &mut serde_yaml::Value, over: serde_yaml::Value) {
    match (base, over) {
        (serde_yaml::Value::Mapping(b), serde_yaml::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge_yaml(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Parses `KEY=value` / `export KEY="value"` lines, keeping `OS_*` keys.
pub fn parse_env_file(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim();
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if !k.starts_with("OS_") || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let v = v.trim();
        let value = if let Some(inner) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
            inner.to_string()
        } else {
            let inner = v
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .unwrap_or(v);
            if inner.contains('$') || inner.contains('`') {
                return Err(format!(
                    "line {}: {k} needs a shell to expand ({v}); write the value itself",
                    n + 1
                ));
            }
            inner.replace("\\\"", "\"")
        };
        out.insert(k.to_string(), value);
    }
    Ok(out)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CloudEntry {
    auth: CloudAuth,
    auth_type: Option<String>,
    region_name: Option<String>,
    interface: Option<String>,
    endpoint_type: Option<String>,
    #[serde(deserialize_with = "string_or_number")]
    identity_api_version: Option<String>,
    cacert: Option<String>,
    verify: Option<bool>,
    insecure: Option<bool>,
}

/// `identity_api_version: 3` (a YAML integer, as OpenStack's examples write
/// it), `3.0` (a float) and `"3"` (a string) all mean the same.
fn string_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<serde_yaml::Value>::deserialize(d)?;
    match v {
        None | Some(serde_yaml::Value::Null) => Ok(None),
        Some(serde_yaml::Value::String(s)) => Ok(Some(s)),
        Some(serde_yaml::Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(serde::de::Error::custom(format!(
            "expected a version number, got {other:?}"
        ))),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CloudAuth {
    auth_url: Option<String>,
    username: Option<String>,
    user_id: Option<String>,
    password: Option<String>,
    project_name: Option<String>,
    project_id: Option<String>,
    tenant_name: Option<String>,
    tenant_id: Option<String>,
    user_domain_name: Option<String>,
    user_domain_id: Option<String>,
    project_domain_name: Option<String>,
    project_domain_id: Option<String>,
    domain_name: Option<String>,
    domain_id: Option<String>,
    application_credential_id: Option<String>,
    application_credential_name: Option<String>,
    application_credential_secret: Option<String>,
}

struct RawAuth {
    auth_url: String,
    auth_type: String,
    user: Option<UserRef>,
    password: Option<String>,
    app_cred_id: Option<String>,
    app_cred_name: Option<String>,
    app_cred_secret: Option<String>,
    project_id: Option<String>,
    project_name: Option<String>,
    project_domain: DomainRef,
    region: Option<String>,
    interface: Option<String>,
    cacert: Option<PathBuf>,
    insecure: bool,
}

impl RawAuth {
    fn build(self, origin: &str) -> Result<Credentials, CloudError> {
        let err = |m: &str| CloudError::Config(format!("{origin}: {m}"));
        let auth_url = normalize_auth_url(&self.auth_url)?;
        let interface = match &self.interface {
            Some(i) => Interface::parse(i)?,
            None => Interface::Public,
        };
        let (method, project) = match self.auth_type.as_str() {
            "password" | "v3password" => {
                let user = self.user.ok_or_else(|| err("no user name or id"))?;
                let password = self.password.ok_or_else(|| err("no password"))?;
                let project = match (self.project_id, self.project_name) {
                    (Some(id), _) => Some(ProjectRef::Id(id)),
                    (None, Some(name)) => Some(ProjectRef::Name {
                        name,
                        domain: self.project_domain,
                    }),
                    (None, None) => None,
                };
                if project.is_none() {
                    return Err(err(
                        "no project (project name or id): gearshift needs a project-scoped token",
                    ));
                }
                (
                    AuthMethod::Password {
                        user,
                        password: Secret(password),
                    },
                    project,
                )
            }
            "v3applicationcredential" | "applicationcredential" | "application_credential" => {
                let secret = self
                    .app_cred_secret
                    .ok_or_else(|| err("no application credential secret"))?;
                if self.app_cred_id.is_none() && self.app_cred_name.is_none() {
                    return Err(err("no application credential id or name"));
                }
                if self.app_cred_id.is_none() && self.user.is_none() {
                    return Err(err(
                        "an application credential given by name needs the user name or id",
                    ));
                }
                (
                    AuthMethod::ApplicationCredential {
                        id: self.app_cred_id,
                        name: self.app_cred_name,
                        user: self.user,
                        secret: Secret(secret),
                    },
                    None,
                )
            }
            other => {
                return Err(err(&format!(
                    "auth type {other:?} is not supported (password, v3password, v3applicationcredential)"
                )));
            }
        };
        Ok(Credentials {
            auth_url,
            method,
            project,
            region: self.region,
            interface,
            cacert: self.cacert,
            insecure: self.insecure,
        })
    }
}

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
    if let Some(p) = &creds.project {
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
struct TokenBody {
    token: TokenInner,
}

#[derive(Deserialize)]
struct TokenInner {
    expires_at: DateTime<Utc>,
    #[serde(default)]
    issued_at: Option<DateTime<Utc>>,
    #[serde(default)]
    project: Option<IdOnly>,
    #[serde(default)]
    user: Option<IdOnly>,
    #[serde(default)]
    catalog: Vec<CatalogEntry>,
}

#[derive(Deserialize)]
struct IdOnly {
    id: String,
}

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
            value: Secret(value),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn v2_openrc_gets_v3_and_default_domain() {
        let c = Credentials::from_vars(vars(&[
            ("OS_AUTH_URL", "http://keystone:5000/v2.0/"),
            ("OS_USERNAME", "admin"),
            ("OS_PASSWORD", "pw"),
            ("OS_TENANT_NAME", "demo"),
            ("OS_REGION_NAME", "RegionOne"),
        ]))
        .unwrap();
        assert_eq!(c.auth_url, "http://keystone:5000/v3");
        let body = token_request_body(&c);
        assert_eq!(
            body,
            json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
                "name": "admin", "domain": {"id": "default"}, "password": "pw"}}},
                "scope": {"project": {"name": "demo", "domain": {"id": "default"}}}}})
        );
        assert!(!format!("{c:?}").contains("pw\""));
    }

    #[test]
    fn application_credential() {
        let c = Credentials::from_vars(vars(&[
            ("OS_AUTH_URL", "https://k/identity"),
            ("OS_AUTH_TYPE", "v3applicationcredential"),
            ("OS_APPLICATION_CREDENTIAL_ID", "ac1"),
            ("OS_APPLICATION_CREDENTIAL_SECRET", "s3"),
        ]))
        .unwrap();
        assert_eq!(c.auth_url, "https://k/identity/v3");
        assert_eq!(
            token_request_body(&c),
            json!({"auth": {"identity": {"methods": ["application_credential"],
                "application_credential": {"id": "ac1", "secret": "s3"}}}})
        );
    }

    #[test]
    fn missing_pieces_are_named() {
        let e = Credentials::from_vars(vars(&[("OS_AUTH_URL", "http://k:5000/v3")])).unwrap_err();
        assert!(e.to_string().contains("no user"), "{e}");
        let e = Credentials::from_vars(vars(&[
            ("OS_AUTH_URL", "http://k:5000/v3"),
            ("OS_USERNAME", "u"),
            ("OS_PASSWORD", "p"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("project"), "{e}");
        let e = Credentials::from_vars(vars(&[])).unwrap_err();
        assert!(e.to_string().contains("OS_AUTH_URL"));
    }

    #[test]
    fn env_file() {
        let text = "# openrc\nexport OS_AUTH_URL=http://k:5000/v2.0\nexport OS_USERNAME='bob'\nexport OS_PASSWORD=\"p w\"\nOS_TENANT_NAME=demo\nunset OS_X\n";
        let m = parse_env_file(text).unwrap();
        assert_eq!(m["OS_PASSWORD"], "p w");
        assert_eq!(m["OS_USERNAME"], "bob");
        assert!(parse_env_file("export OS_PASSWORD=$OS_PASSWORD_INPUT").is_err());
    }

    #[test]
    fn clouds_doc() {
        let doc: serde_yaml::Value = serde_yaml::from_str(
            "clouds:\n  c1:\n    auth:\n      auth_url: http://k:5000\n      username: u\n      password: p\n      project_name: pr\n      user_domain_name: Users\n      project_domain_id: pd\n    region_name: R2\n    interface: internal\n",
        )
        .unwrap();
        let c = Credentials::from_clouds_doc("c1", &doc, "t").unwrap();
        assert_eq!(c.region.as_deref(), Some("R2"));
        assert_eq!(c.interface, Interface::Internal);
        assert_eq!(
            c.project,
            Some(ProjectRef::Name {
                name: "pr".into(),
                domain: DomainRef::Id("pd".into())
            })
        );
        assert!(Credentials::from_clouds_doc("nope", &doc, "t").is_err());
    }

    #[test]
    fn identity_api_version_as_written_in_openstack_examples() {
        let base = "clouds:\n  c1:\n    auth:\n      auth_url: http://k:5000\n      username: u\n      password: p\n      project_name: pr\n";
        for v in ["3", "'3'", "3.0"] {
            let doc: serde_yaml::Value =
                serde_yaml::from_str(&format!("{base}    identity_api_version: {v}\n")).unwrap();
            Credentials::from_clouds_doc("c1", &doc, "t").unwrap_or_else(|e| panic!("{v}: {e}"));
        }
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&format!("{base}    identity_api_version: 2\n")).unwrap();
        let e = Credentials::from_clouds_doc("c1", &doc, "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("identity_api_version") && e.contains("only 3"),
            "{e}"
        );
    }

    #[test]
    fn endpoint_selection() {
        let t = Token {
            value: Secret::new("t"),
            expires_at: Utc::now(),
            issued_at: None,
            project_id: Some("p".into()),
            user_id: None,
            catalog: vec![CatalogEntry {
                service_type: "volumev3".into(),
                name: None,
                endpoints: vec![
                    Endpoint {
                        interface: "public".into(),
                        region_id: Some("R1".into()),
                        region: None,
                        url: "http://c1/v3/p/".into(),
                    },
                    Endpoint {
                        interface: "public".into(),
                        region_id: Some("R2".into()),
                        region: None,
                        url: "http://c2/v3/p".into(),
                    },
                ],
            }],
        };
        assert_eq!(
            t.endpoint(Service::BlockStorage, Interface::Public, Some("R2"))
                .unwrap(),
            "http://c2/v3/p"
        );
        assert_eq!(
            t.endpoint(Service::BlockStorage, Interface::Public, None)
                .unwrap(),
            "http://c1/v3/p"
        );
        assert!(
            t.endpoint(Service::Compute, Interface::Public, None)
                .is_err()
        );
        assert!(
            t.endpoint(Service::BlockStorage, Interface::Admin, None)
                .is_err()
        );
    }
}
