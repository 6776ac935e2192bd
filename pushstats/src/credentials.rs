//! AWS-style credentials for the CloudWatch-compatible API.
//!
//! Heat's OpenShift templates wrote them on each host as
//! `/etc/cfn/cfn-credentials` (or `/etc/heat/heat-credentials` on the
//! broker), mode 0400, from an `AWS::IAM::AccessKey` resource:
//!
//! ```text
//! AWSAccessKeyId=<access key id>
//! AWSSecretKey=<secret key>
//! ```
//!
//! [`AwsCredentials::from_cfn_file`] reads that format as heat-cfntools'
//! `parse_creds_file` did (spaces around `=` allowed, other lines ignored),
//! with a size bound and errors that name the file and the missing key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::PushError;

/// Where cfn-push-stats looked by default.
pub const DEFAULT_CFN_CREDENTIALS: &str = "/etc/cfn/cfn-credentials";

/// Largest credentials file read (the real one is two short lines).
pub const MAX_CREDENTIALS_FILE: u64 = 64 * 1024;

/// A secret string: `Debug` prints `***`; (de)serializes as a plain string
/// so that it can sit in a configuration file.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        SecretString(s.into())
    }
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// An access key pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    /// `AWSAccessKeyId`.
    pub access_key_id: String,
    /// `AWSSecretKey`.
    pub secret_access_key: SecretString,
}

impl AwsCredentials {
    /// A pair from explicit values; both must be non-empty.
    pub fn new(access_key_id: &str, secret: &str) -> Result<Self, PushError> {
        let c = AwsCredentials {
            access_key_id: access_key_id.trim().to_string(),
            secret_access_key: SecretString::new(secret.trim()),
        };
        if c.access_key_id.is_empty() || c.secret_access_key.is_empty() {
            return Err(PushError::Credentials {
                path: None,
                reason: "the access key id and the secret key must both be non-empty".into(),
            });
        }
        Ok(c)
    }

    /// Reads a `cfn-credentials` file.
    pub fn from_cfn_file(path: &Path) -> Result<Self, PushError> {
        let err = |reason: String| PushError::Credentials {
            path: Some(path.to_path_buf()),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read: {e}")))?;
        if meta.len() > MAX_CREDENTIALS_FILE {
            return Err(err(format!(
                "is {} bytes, more than the {MAX_CREDENTIALS_FILE} a credentials file can be",
                meta.len()
            )));
        }
        warn_if_readable_by_others(path, &meta);
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        parse_cfn_credentials(&text).map_err(err)
    }

    /// Reads `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let id = get("AWS_ACCESS_KEY_ID").filter(|v| !v.trim().is_empty())?;
        let secret = get("AWS_SECRET_ACCESS_KEY").filter(|v| !v.trim().is_empty())?;
        AwsCredentials::new(&id, &secret).ok()
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path, meta: &std::fs::Metadata) {
    use std::os::unix::fs::PermissionsExt;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "credentials file is readable by group or others; Heat's templates made it 0400"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path, _meta: &std::fs::Metadata) {}

/// Parses the `AWSAccessKeyId=` / `AWSSecretKey=` lines of a cfn-credentials
/// file. Blank lines, `#` comments and other keys are ignored; a key given
/// twice keeps its last value (as heat-cfntools did).
pub fn parse_cfn_credentials(text: &str) -> Result<AwsCredentials, String> {
    let mut id = None;
    let mut secret = None;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim_start().starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k.trim_end() {
            "AWSAccessKeyId" => id = Some(v.trim().to_string()),
            "AWSSecretKey" => secret = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let id = id
        .filter(|v| !v.is_empty())
        .ok_or("no AWSAccessKeyId= line with a value")?;
    let secret = secret
        .filter(|v| !v.is_empty())
        .ok_or("no AWSSecretKey= line with a value")?;
    Ok(AwsCredentials {
        access_key_id: id,
        secret_access_key: SecretString::new(secret),
    })
}

/// Where CloudWatch credentials come from, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// Given explicitly (configuration or command line).
    Explicit(AwsCredentials),
    /// A cfn-credentials file.
    File(PathBuf),
}

impl CredentialSource {
    /// Loads the credentials.
    pub fn load(&self) -> Result<AwsCredentials, PushError> {
        match self {
            CredentialSource::Explicit(c) => Ok(c.clone()),
            CredentialSource::File(p) => AwsCredentials::from_cfn_file(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_templates_format() {
        let c = parse_cfn_credentials("AWSAccessKeyId=AKID1\nAWSSecretKey=s3cr/et+key=\n").unwrap();
        assert_eq!(c.access_key_id, "AKID1");
        assert_eq!(c.secret_access_key.expose(), "s3cr/et+key=");
        assert!(!format!("{c:?}").contains("s3cr"));
    }

    #[test]
    fn tolerates_spaces_comments_and_crlf() {
        let c = parse_cfn_credentials(
            "# written by heat\r\nAWSAccessKeyId = AKID2\r\n\r\nRegion=x\r\nAWSSecretKey =  sk \r\n",
        )
        .unwrap();
        assert_eq!(c.access_key_id, "AKID2");
        assert_eq!(c.secret_access_key.expose(), "sk");
    }

    #[test]
    fn missing_keys_are_named() {
        let e = parse_cfn_credentials("AWSSecretKey=x\n").unwrap_err();
        assert!(e.contains("AWSAccessKeyId"), "{e}");
        let e = parse_cfn_credentials("AWSAccessKeyId=x\nAWSSecretKey=\n").unwrap_err();
        assert!(e.contains("AWSSecretKey"), "{e}");
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cfn-credentials");
        let e = AwsCredentials::from_cfn_file(&p).unwrap_err();
        assert!(e.to_string().contains("cfn-credentials"), "{e}");
        std::fs::write(&p, "AWSAccessKeyId=a\nAWSSecretKey=b\n").unwrap();
        let c = AwsCredentials::from_cfn_file(&p).unwrap();
        assert_eq!(c.access_key_id, "a");
        std::fs::write(&p, vec![b'x'; (MAX_CREDENTIALS_FILE + 1) as usize]).unwrap();
        assert!(AwsCredentials::from_cfn_file(&p).is_err());
    }

    #[test]
    fn env_vars() {
        let get = |k: &str| match k {
            "AWS_ACCESS_KEY_ID" => Some("id".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("sec".to_string()),
            _ => None,
        };
        assert_eq!(AwsCredentials::from_vars(get).unwrap().access_key_id, "id");
        assert!(AwsCredentials::from_vars(|_| None).is_none());
    }
}
