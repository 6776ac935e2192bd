//! `clouds.yaml` (with `secure.yaml` beside it): the search path and the
//! reading of one cloud's entry.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::credentials::{Credentials, DomainRef, RawAuth, UserRef};
use crate::error::CloudError;

impl Credentials {
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
