//! Credentials: what Keystone needs to issue a token, from `OS_*`
//! variables or an `auth.env` file, and where a configuration says they
//! come from ([`CredentialsFrom`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::CloudError;

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
    pub(super) fn to_json(&self) -> Value {
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
    pub(super) fn to_json(&self) -> Value {
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
}

/// Where a configuration takes credentials from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialsFrom<'a> {
    /// The process's `OS_*` variables.
    Env,
    /// A file of `export OS_X=value` lines (the seeds' `auth.env`).
    EnvFile(&'a Path),
    /// A `clouds.yaml` entry, from `path` or the standard search path.
    CloudsYaml {
        /// The cloud's name.
        cloud: &'a str,
        /// An explicit `clouds.yaml`.
        path: Option<&'a Path>,
    },
}

impl<'a> CredentialsFrom<'a> {
    /// The handlers' and pull mode's order: `cloud` (with its optional
    /// `clouds_yaml`) when set, else `env_file` when set, else the
    /// environment.
    pub fn first_of(
        cloud: Option<&'a str>,
        clouds_yaml: Option<&'a Path>,
        env_file: Option<&'a Path>,
    ) -> Self {
        match (cloud, env_file) {
            (Some(cloud), _) => CredentialsFrom::CloudsYaml {
                cloud,
                path: clouds_yaml,
            },
            (None, Some(f)) => CredentialsFrom::EnvFile(f),
            (None, None) => CredentialsFrom::Env,
        }
    }
}

impl Credentials {
    /// Reads the credentials from where `from` says (no network).
    pub fn load(from: CredentialsFrom<'_>) -> Result<Self, CloudError> {
        match from {
            CredentialsFrom::Env => Self::from_env(),
            CredentialsFrom::EnvFile(p) => Self::from_env_file(p),
            CredentialsFrom::CloudsYaml { cloud, path } => Self::from_clouds_yaml(cloud, path),
        }
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

pub(super) struct RawAuth {
    pub(super) auth_url: String,
    pub(super) auth_type: String,
    pub(super) user: Option<UserRef>,
    pub(super) password: Option<String>,
    pub(super) app_cred_id: Option<String>,
    pub(super) app_cred_name: Option<String>,
    pub(super) app_cred_secret: Option<String>,
    pub(super) project_id: Option<String>,
    pub(super) project_name: Option<String>,
    pub(super) project_domain: DomainRef,
    pub(super) region: Option<String>,
    pub(super) interface: Option<String>,
    pub(super) cacert: Option<PathBuf>,
    pub(super) insecure: bool,
}

impl RawAuth {
    pub(super) fn build(self, origin: &str) -> Result<Credentials, CloudError> {
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
