//! What the OpenStack handlers share: a session from
//! [`OpenStackAuth`], the one mapping from
//! [`CloudError`] to [`HandlerError`], and host-to-server-name mapping.

use gearshift_cloud::auth::Interface;
use gearshift_cloud::{CloudError, Credentials, Session, SessionOptions};

use crate::config::{OpenStackAuth, ServerName};
use crate::{BuildError, HandlerError};

/// Reads the credentials (no network) and makes a session.
pub fn session(auth: &OpenStackAuth) -> Result<Session, BuildError> {
    let mut creds = if let Some(cloud) = &auth.cloud {
        Credentials::from_clouds_yaml(cloud, auth.clouds_yaml.as_deref())
    } else if let Some(file) = &auth.env_file {
        Credentials::from_env_file(file)
    } else {
        Credentials::from_env()
    }
    .map_err(|e| BuildError::Setup(format!("OpenStack credentials: {e}")))?;
    if let Some(r) = &auth.region {
        creds.region = Some(r.clone());
    }
    if let Some(i) = &auth.interface {
        creds.interface = Interface::parse(i).map_err(|e| BuildError::Setup(e.to_string()))?;
    }
    let mut opts = SessionOptions {
        endpoint_overrides: auth.endpoint_overrides.clone(),
        ..SessionOptions::default()
    };
    if let Some(t) = auth.request_timeout {
        opts.http.timeout = t;
    }
    Session::new(creds, opts).map_err(|e| BuildError::Setup(format!("OpenStack session: {e}")))
}

/// The one place cloud failures become handler errors: quota first, then
/// busy, then retryable or not. Decided by the error's class, never its text.
pub fn to_handler_error(e: CloudError) -> HandlerError {
    let msg = e.to_string();
    if e.is_quota() {
        HandlerError::Quota(msg)
    } else if e.is_busy() {
        HandlerError::Busy(msg)
    } else if e.is_retryable() {
        HandlerError::Transient(msg)
    } else {
        HandlerError::Permanent(msg)
    }
}

/// The Nova server name of a node host.
pub fn server_name(host: &str, how: ServerName) -> &str {
    match how {
        ServerName::Short => host.split('.').next().unwrap_or(host),
        ServerName::Fqdn => host,
    }
}

/// Escapes a literal for Nova's regular-expression `name` filter, anchored.
pub fn exact_name_filter(name: &str) -> String {
    let mut out = String::from("^");
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() && c != '_' && c != '-' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('$');
    out
}

/// The Nova server id of `host`: `cloud_id` when given, else the one
/// server named after it.
pub async fn resolve_server(
    nova: &gearshift_cloud::nova::Nova,
    host: &str,
    cloud_id: Option<&str>,
    how: ServerName,
) -> Result<Option<String>, HandlerError> {
    if let Some(id) = cloud_id {
        return Ok(Some(id.to_string()));
    }
    let name = server_name(host, how);
    let found = nova
        .list_servers(Some(&exact_name_filter(name)))
        .await
        .map_err(to_handler_error)?;
    let matching: Vec<_> = found.into_iter().filter(|s| s.name == name).collect();
    match matching.len() {
        0 => Ok(None),
        1 => Ok(Some(matching[0].id.clone())),
        n => Err(HandlerError::Permanent(format!(
            "{n} Nova servers are named {name:?}; cannot tell which one is {host}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            server_name("node-3.example.com", ServerName::Short),
            "node-3"
        );
        assert_eq!(
            server_name("node-3.example.com", ServerName::Fqdn),
            "node-3.example.com"
        );
        assert_eq!(
            exact_name_filter("node-3.example.com"),
            "^node-3\\.example\\.com$"
        );
    }

    #[test]
    fn error_classes() {
        let quota = CloudError::Failed {
            what: "s".into(),
            state: "UPDATE_FAILED".into(),
            reason: "Quota exceeded".into(),
            quota: true,
        };
        assert!(to_handler_error(quota).is_quota());
        let busy = CloudError::Busy {
            what: "s".into(),
            state: "UPDATE_IN_PROGRESS".into(),
        };
        assert_eq!(to_handler_error(busy).label(), "busy");
        assert_eq!(
            to_handler_error(CloudError::Config("x".into())).label(),
            "permanent"
        );
    }
}
