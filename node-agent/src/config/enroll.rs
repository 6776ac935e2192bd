//! `[enroll]`: enrolling the node's own key with a token (a node booted by a
//! scale-up, with no key installed by hand).

use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::check;
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};

/// `[enroll]`: off unless a token (or a token file) is given.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnrollSection {
    /// The enrollment token (`gearshift-broker enroll-token`). Default none.
    pub token: Option<String>,
    /// A file holding the token (written from the instance's user data); a
    /// missing file means no token. Default none.
    pub token_file: Option<PathBuf>,
    /// Routing key of the broker agent's requests (its `agent.admin_key`).
    /// Default `admin.request`.
    pub request_key: String,
    /// Longest wait between two attempts while the broker agent does not
    /// answer or refuses. Default `5m`.
    #[serde(with = "duration")]
    pub retry_max: Duration,
}

impl Default for EnrollSection {
    fn default() -> Self {
        EnrollSection {
            token: None,
            token_file: None,
            request_key: gearshift_proto::routing::ADMIN.into(),
            retry_max: Duration::from_secs(300),
        }
    }
}

impl EnrollSection {
    /// Checks the section; keys in errors start with `enroll.`.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.token.is_some() && self.token_file.is_some() {
            return Err(Invalid::new(
                "enroll.token",
                "set token or token_file, not both",
            ));
        }
        if let Some(t) = &self.token
            && (t.is_empty() || t.len() > gearshift_proto::msg::MAX_TOKEN)
        {
            return Err(Invalid::new(
                "enroll.token",
                format!("must be 1..={} characters", gearshift_proto::msg::MAX_TOKEN),
            ));
        }
        if let Some(p) = &self.token_file {
            check::names_a_path("enroll.token_file", p, "file")?;
        }
        if self.request_key.is_empty() || self.request_key.len() > 255 {
            return Err(Invalid::new("enroll.request_key", "must be 1..=255 bytes"));
        }
        check::within(
            "enroll.retry_max",
            self.retry_max,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        )
    }
}
