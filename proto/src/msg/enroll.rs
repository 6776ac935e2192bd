//! `enroll.token`, `enroll.request`, `enroll.reply`: a node booted by a
//! scale-up enrolls its own key, with a token an operator (or the broker
//! agent) signed beforehand. [`crate::enroll`] mints and checks tokens.

use serde::{Deserialize, Serialize};

use super::{MAX_NAME, Validate, check_name, check_opt_name, check_text};

/// Longest token accepted, in characters of its text form (a token is a few
/// hundred bytes; the cap keeps a hostile request cheap to refuse).
pub const MAX_TOKEN: usize = 4096;
/// Most hosts one token may enroll.
pub const MAX_USES: u32 = 10_000;

/// What an enrollment token allows: the body of an `enroll.token`
/// statement. Its envelope carries the rest: `id` (the token id), `from`
/// (who minted it), `ts` (when) and `expires` (`not_after`, required).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollToken {
    /// The district the enrolled nodes join.
    pub district: String,
    /// The profile (node size) the enrolled nodes join.
    pub profile: String,
    /// How many distinct hosts the token may enroll (1..=[`MAX_USES`]).
    pub max_uses: u32,
    /// The one host the token may enroll, when it was minted for a known
    /// host (the nova handler knows the name it creates); any host if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl Validate for EnrollToken {
    fn validate(&self) -> Result<(), String> {
        check_name("district", &self.district)?;
        check_name("profile", &self.profile)?;
        if self.max_uses == 0 || self.max_uses > MAX_USES {
            return Err(format!("max_uses must be 1..={MAX_USES}"));
        }
        if let Some(h) = &self.host {
            check_host(h)?;
        }
        Ok(())
    }
}

/// A node asks to be trusted as the host of its envelope's `from`. The
/// envelope is signed by the key it presents (`public_key`): proof that
/// the sender holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollRequest {
    /// The node's new public key, SubjectPublicKeyInfo PEM.
    pub public_key: String,
    /// The enrollment token, as minted (`gearshift-broker enroll-token`).
    pub token: String,
    /// The district the node says it joins, when it knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district: Option<String>,
    /// The profile the node says it has, when it knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Longest public key PEM accepted (an Ed25519 one is 113 bytes).
pub const MAX_PUBLIC_PEM: usize = 1024;

impl Validate for EnrollRequest {
    fn validate(&self) -> Result<(), String> {
        if self.public_key.is_empty() || self.public_key.len() > MAX_PUBLIC_PEM {
            return Err(format!("public_key must be 1..={MAX_PUBLIC_PEM} bytes"));
        }
        if self.token.is_empty() || self.token.len() > MAX_TOKEN {
            return Err(format!("token must be 1..={MAX_TOKEN} bytes"));
        }
        check_opt_name("district", &self.district)?;
        check_opt_name("profile", &self.profile)
    }
}

/// The broker agent's answer to an `enroll.request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollReply {
    /// Whether the node's key is trusted now (also when it already was).
    pub ok: bool,
    /// Stable label: `enrolled`, `already_enrolled`, or the refusal reason
    /// (`bad_token`, `token_expired`, `token_used_up`, `wrong_group`,
    /// `wrong_host`, `host_taken`, `revoked`, `bad_request`, `failed`).
    pub reason: String,
    /// A sentence for the logs.
    #[serde(default)]
    pub message: String,
}

impl Validate for EnrollReply {
    fn validate(&self) -> Result<(), String> {
        check_name("reason", &self.reason)?;
        check_text("message", &self.message)
    }
}

/// Whether `host` may be enrolled: a host name (letters, digits, `.`, `-`,
/// `_`; 1..=[`MAX_NAME`] bytes; not starting with `.` or `-`). It becomes
/// the file name `nodes.d/<host>.pub`, so nothing else is accepted.
pub fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > MAX_NAME {
        return Err(format!("host name must be 1..={MAX_NAME} bytes"));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err("host name may only contain letters, digits, '.', '-' and '_'".into());
    }
    if host.starts_with(['.', '-']) {
        return Err("host name must not start with '.' or '-'".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_bounded() {
        let t = EnrollToken {
            district: "d1".into(),
            profile: "small".into(),
            max_uses: 0,
            host: None,
        };
        assert!(t.validate().unwrap_err().contains("max_uses"));
        let bad_host = EnrollToken {
            max_uses: 1,
            host: Some("../etc".into()),
            ..t.clone()
        };
        assert!(bad_host.validate().is_err());
        let r = EnrollRequest {
            public_key: "k".into(),
            token: "x".repeat(MAX_TOKEN + 1),
            district: None,
            profile: None,
        };
        assert!(r.validate().unwrap_err().contains("token"));
        for bad in ["", ".hidden", "-x", "a/b", "a b", "n\u{e9}"] {
            assert!(check_host(bad).is_err(), "{bad:?}");
        }
        assert!(check_host("node-1.example.com").is_ok());
    }
}
