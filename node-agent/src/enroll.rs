//! Enrolling the node's own key with a token (`[enroll]`): a node booted by
//! a scale-up needs nobody to install its key on the broker hosts.
//!
//! At start, before the keys are loaded, [`prepare`] generates the node's
//! key pair when a token is configured and `keys.signing_key` does not exist
//! (private key mode 0600). Then, beside the agent, [`run`] sends
//! `enroll.request` (the host name, the new public key, the token, the
//! node's profile and district when its runtime knows them), signed by the
//! new key, to the broker agent's request key, and retries with backoff
//! until a broker agent answers that the key is enrolled. Reports sent
//! before that are refused (`unknown_key`) and the next ones are taken: the
//! agent itself does not wait. Once enrolled, `<state_dir>/enrolled.json`
//! names the key, and later starts with the same key skip the request.

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::{OutMessage, SharedBus};
use gearshift_proto::msg::{EnrollReply, EnrollRequest, Kind, Message, Role};
use gearshift_proto::{Envelope, Expect, Gate, KeyPair, Keyring, TimePolicy};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::NodeConfig;
use crate::runtime::SharedRuntime;
use crate::setup::SetupError;

/// The marker file in the state directory.
pub const MARKER: &str = "enrolled.json";
/// How long one attempt waits for the broker agent's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(15);
/// The first wait between attempts.
const RETRY_MIN: Duration = Duration::from_secs(1);

/// An enrollment to carry out once the agent runs.
#[derive(Debug, Clone)]
pub struct Pending {
    token: String,
    request_key: String,
    retry_max: Duration,
    marker: PathBuf,
}

/// What the marker file records.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    key: String,
    at: chrono::DateTime<Utc>,
    reason: String,
}

/// Whether [`prepare`] would make the node's key: a token is configured
/// and `keys.signing_key` does not exist.
pub fn makes_key(cfg: &NodeConfig) -> bool {
    token(cfg).is_ok_and(|t| t.is_some()) && !cfg.keys.signing_key.exists()
}

/// The configured token: `[enroll] token`, else the content of
/// `token_file` (just the token, or a JSON object with an `enroll_token`
/// member: the nova handler's `boot.json`). A missing file, or an object
/// without the member, is no token.
pub fn token(cfg: &NodeConfig) -> Result<Option<String>, SetupError> {
    let e = &cfg.enroll;
    let text = match (&e.token, &e.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => match std::fs::read_to_string(p) {
            Ok(t) => t,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(SetupError::Enroll(format!("{}: {err}", p.display()))),
        },
        (None, None) => return Ok(None),
    };
    let text = text.trim();
    let token = if text.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|err| {
            SetupError::Enroll(format!("the token file is not valid JSON: {err}"))
        })?;
        match v.get("enroll_token") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(t)) => t.trim().to_string(),
            Some(_) => {
                return Err(SetupError::Enroll(
                    "\"enroll_token\" is not a string".into(),
                ));
            }
        }
    } else {
        text.to_string()
    };
    if token.is_empty() || token.len() > gearshift_proto::msg::MAX_TOKEN {
        return Err(SetupError::Enroll("the token is empty or too long".into()));
    }
    Ok(Some(token))
}

/// With a token configured: makes sure the node has a private key
/// (generating one when `keys.signing_key` does not exist) and returns the
/// enrollment to carry out. `None` without a token.
pub fn prepare(cfg: &NodeConfig) -> Result<Option<Pending>, SetupError> {
    let Some(token) = token(cfg)? else {
        return Ok(None);
    };
    let path = &cfg.keys.signing_key;
    if !path.exists() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|err| SetupError::Enroll(format!("{}: {err}", dir.display())))?;
        }
        let pair = gearshift_service::keys::new_private_key(path, false).map_err(|source| {
            SetupError::Keys {
                key: "keys.signing_key".into(),
                source,
            }
        })?;
        tracing::info!(path = %path.display(), key = pair.id(), "generated the node's key, to enroll it");
    }
    Ok(Some(Pending {
        token,
        request_key: cfg.enroll.request_key.clone(),
        retry_max: cfg.enroll.retry_max,
        marker: cfg.state.dir.join(MARKER),
    }))
}

/// Enrolls `key` as `name` unless the marker says it already is; returns
/// when enrolled or when `stop` is cancelled. `brokers` checks the answers.
pub async fn run(
    p: Pending,
    bus: SharedBus,
    (name, key, brokers): (String, KeyPair, Keyring),
    rt: SharedRuntime,
    stop: CancellationToken,
) {
    if crate::state::read_json::<Marker>(&p.marker)
        .ok()
        .flatten()
        .is_some_and(|m| m.key == key.id())
    {
        tracing::debug!(key = key.id(), "key already enrolled");
        return;
    }
    for attempt in 0u32.. {
        match attempt_once(&p, &bus, (&name, &key, &brokers), &rt).await {
            Ok(reply) => {
                tracing::info!(key = key.id(), reason = %reply.reason, "enrolled: {}", reply.message);
                let m = Marker {
                    key: key.id().to_string(),
                    at: Utc::now(),
                    reason: reply.reason,
                };
                if let Err(e) = crate::state::write_json(&p.marker, &m, true) {
                    tracing::warn!(error = %e, "cannot record the enrollment (the next start asks again)");
                }
                return;
            }
            Err(why) => tracing::warn!(attempt, "enrollment not done yet: {why}"),
        }
        let wait = gearshift_bus::backoff(attempt, RETRY_MIN, p.retry_max);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One request and its checked answer; `Err` says why it did not enroll.
async fn attempt_once(
    p: &Pending,
    bus: &SharedBus,
    (name, key, brokers): (&str, &KeyPair, &Keyring),
    rt: &SharedRuntime,
) -> Result<EnrollReply, String> {
    // The node's own facts, when its runtime can tell already: the broker
    // agent refuses a token for another group.
    let facts = rt.inventory().await.ok().map(|i| i.facts);
    let body = EnrollRequest {
        public_key: key.public_pem(),
        token: p.token.clone(),
        district: facts
            .as_ref()
            .and_then(|f| f.district.as_ref().map(|d| d.uuid.clone())),
        profile: facts.map(|f| f.profile).filter(|p| !p.is_empty()),
    };
    let env = Envelope::new(name, body).with_ttl(ANSWER_WAIT);
    let msg = OutMessage::new(p.request_key.clone(), key.seal(env)).transient();
    let d = bus
        .request(msg, ANSWER_WAIT)
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let a = Gate::new(brokers, TimePolicy::default())
        .admit(
            &d.payload,
            Expect::kinds(|k| k == Kind::EnrollReply).roles(&[Role::Broker]),
            Utc::now(),
        )
        .map_err(|r| format!("answer refused: {r}"))?;
    match a.envelope.msg {
        Message::EnrollReply(r) if r.ok => Ok(r),
        Message::EnrollReply(r) => Err(format!("refused ({}): {}", r.reason, r.message)),
        other => Err(format!("unexpected answer {}", other.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_makes_a_key_once_and_no_token_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = NodeConfig::default();
        cfg.keys.signing_key = dir.path().join("keys/node.key");
        cfg.state.dir = dir.path().join("state");
        assert!(prepare(&cfg).unwrap().is_none());
        assert!(!cfg.keys.signing_key.exists());
        cfg.enroll.token_file = Some(dir.path().join("token"));
        assert!(
            prepare(&cfg).unwrap().is_none(),
            "a missing token file is no token"
        );
        std::fs::write(dir.path().join("token"), "abc\n").unwrap();
        let p = prepare(&cfg).unwrap().unwrap();
        assert_eq!(p.token, "abc");
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&cfg.keys.signing_key).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let first = std::fs::read(&cfg.keys.signing_key).unwrap();
        prepare(&cfg).unwrap().unwrap();
        assert_eq!(std::fs::read(&cfg.keys.signing_key).unwrap(), first, "kept");
        gearshift_service::keys::load_keypair(&cfg.keys.signing_key).unwrap();
        std::fs::write(dir.path().join("token"), "\n").unwrap();
        assert!(prepare(&cfg).is_err());
        // The nova handler's boot.json: the token is its enroll_token member.
        let boot = r#"{"node":"n-3.example.com","op":"op-7","enroll_token":"tok"}"#;
        std::fs::write(dir.path().join("token"), boot).unwrap();
        assert_eq!(token(&cfg).unwrap().as_deref(), Some("tok"));
        std::fs::write(dir.path().join("token"), r#"{"node":"n","op":"op-7"}"#).unwrap();
        assert_eq!(token(&cfg).unwrap(), None, "a boot.json without a token");
        assert!(!makes_key(&NodeConfig::default()));
    }
}
