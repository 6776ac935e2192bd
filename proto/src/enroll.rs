//! Enrollment: tokens, and the proof that a node holds the key it enrolls.
//!
//! A **token** is a signed statement of kind `enroll.token` (an ordinary
//! envelope: `id` is the token id, `from` its issuer, `ts` when it was
//! minted, `expires` its `not_after`, the body an [`EnrollToken`]), carried
//! as the unpadded base64url of its JSON bytes so that it fits in a shell
//! variable, a Heat parameter or a TOML string. It is signed by an operator
//! key or by the broker agent's own key; the broker agent checks it with the
//! keyring it already trusts, so a token needs no key of its own.
//!
//! An **`enroll.request`** is signed by the key it presents: the signature
//! proves that the sender holds that key, and binding the key to the
//! envelope's `from` for the check means the request speaks for one host.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

use crate::envelope::{Decoded, Envelope};
use crate::gate::{Expect, Gate, Refusal};
use crate::msg::{EnrollRequest, EnrollToken, Kind, MAX_TOKEN, Message, Role};
use crate::sign::{KeyPair, Keyring, TimePolicy, VerifyingKey, public_from_pem};

/// A token may be minted at most this far in the future of the verifier's
/// clock (clock skew between the operator's host and the broker's).
pub const MINT_SKEW: Duration = Duration::minutes(5);

/// A token that passed every check of [`verify_token`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token id (its envelope's `id`): uses are counted per id.
    pub id: Uuid,
    /// Who minted it (its envelope's `from`).
    pub issuer: String,
    /// The role of the key that signed it (operator or broker).
    pub role: Role,
    /// When it stops being accepted.
    pub not_after: DateTime<Utc>,
    /// What it allows.
    pub grant: EnrollToken,
}

/// Why a token was refused: a stable reason label and a bounded detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct TokenError {
    /// `bad_token` (undecodable, unsigned, untrusted, tampered, no
    /// `not_after`) or `token_expired`.
    pub reason: &'static str,
    /// What exactly, for the logs.
    pub detail: String,
}

fn bad(detail: impl Into<String>) -> TokenError {
    TokenError {
        reason: "bad_token",
        detail: crate::gate::clip(&detail.into()),
    }
}

/// Mints a token signed by `key` (sent as `issuer`), valid from `now` for `ttl`.
pub fn mint_token(
    key: &KeyPair,
    issuer: &str,
    grant: EnrollToken,
    now: DateTime<Utc>,
    ttl: Duration,
) -> String {
    let mut env = Envelope::new_at(issuer, grant, now);
    env.expires = Some(now + ttl);
    B64URL.encode(key.seal(env))
}

/// The tokens a verifier takes: signed by an operator or a broker agent,
/// checked for age by [`verify_token`] itself (a token lives for days, not
/// within the envelope time window).
const TOKENS: Expect = Expect::kinds(|k| k == Kind::EnrollToken)
    .roles(&[Role::Operator, Role::Broker])
    .any_age();

/// Checks a token's form, signature (a key of `trusted`, operator or broker
/// role) and `not_after` at `now`.
pub fn verify_token(
    text: &str,
    trusted: &Keyring,
    now: DateTime<Utc>,
) -> Result<Token, TokenError> {
    if text.is_empty() || text.len() > MAX_TOKEN {
        return Err(bad(format!("a token is 1..={MAX_TOKEN} characters")));
    }
    let bytes = B64URL
        .decode(text.trim())
        .map_err(|e| bad(format!("not base64url: {e}")))?;
    let a = Gate::new(trusted, TimePolicy::default())
        .admit(&bytes, TOKENS, now)
        .map_err(|r: Refusal| bad(r.to_string()))?;
    let env = a.envelope;
    let Message::EnrollToken(grant) = env.msg else {
        return Err(bad("not an enroll.token"));
    };
    let not_after = env.expires.ok_or_else(|| bad("the token has no expiry"))?;
    if env.ts > now + MINT_SKEW {
        return Err(bad(format!("minted in the future ({})", env.ts)));
    }
    if not_after <= now {
        return Err(TokenError {
            reason: "token_expired",
            detail: format!("token {} expired at {not_after}", env.id),
        });
    }
    Ok(Token {
        id: env.id,
        issuer: env.from,
        role: a.role,
        not_after,
        grant,
    })
}

/// An `enroll.request` whose signature is by the key it presents.
#[derive(Debug, Clone)]
pub struct Possession {
    /// The request's envelope (its `from` is the host to enroll).
    pub envelope: Envelope,
    /// Its body.
    pub request: EnrollRequest,
    /// The presented key, which signed it.
    pub key: VerifyingKey,
}

/// Checks that `d` is an `enroll.request` signed by the key it presents, as
/// its `from`, fresh within `time`. Refusals carry the gate's reasons
/// (`bad_signature`, `stale`, ...) or `bad_request` for an unreadable key.
pub fn verify_possession(
    d: Decoded,
    time: TimePolicy,
    now: DateTime<Utc>,
) -> Result<Possession, Refusal> {
    let Message::EnrollRequest(request) = d.envelope.msg.clone() else {
        return Err(Refusal::of(
            &d.envelope,
            crate::gate::UNEXPECTED_KIND,
            "not an enroll.request",
        ));
    };
    let key = public_from_pem(&request.public_key)
        .map_err(|e| Refusal::of(&d.envelope, "bad_request", format!("public_key: {e}")))?;
    let mut own = Keyring::new();
    own.add_bound(key, Role::Node, d.envelope.from.clone(), "enroll.request");
    let a =
        Gate::new(&own, time).admit_decoded(d, Expect::kinds(|k| k == Kind::EnrollRequest), now)?;
    Ok(Possession {
        envelope: a.envelope,
        request,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(uses: u32) -> EnrollToken {
        EnrollToken {
            district: "d1".into(),
            profile: "small".into(),
            max_uses: uses,
            host: None,
        }
    }

    fn ring(k: &KeyPair, role: Role) -> Keyring {
        let mut r = Keyring::new();
        r.add(k.public(), role, "test");
        r
    }

    #[test]
    fn a_minted_token_verifies_until_it_expires() {
        let op = KeyPair::from_seed(&[1; 32]);
        let now = Utc::now();
        let t = mint_token(&op, "alice", grant(3), now, Duration::days(7));
        assert!(t.len() < 800, "{}", t.len());
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let v = verify_token(&t, &ring(&op, Role::Operator), now + Duration::days(6)).unwrap();
        assert_eq!(
            (v.issuer.as_str(), v.role, v.grant),
            ("alice", Role::Operator, grant(3))
        );
        // Times travel with millisecond precision.
        assert!(
            (v.not_after - (now + Duration::days(7)))
                .num_milliseconds()
                .abs()
                <= 1
        );
        let e = verify_token(&t, &ring(&op, Role::Operator), now + Duration::days(7)).unwrap_err();
        assert_eq!(e.reason, "token_expired");
        // The broker agent's own key mints too (one-use tokens at a scale-up).
        assert!(verify_token(&t, &ring(&op, Role::Broker), now).is_ok());
    }

    #[test]
    fn wrong_signer_tampered_and_junk_are_bad_tokens() {
        let op = KeyPair::from_seed(&[1; 32]);
        let now = Utc::now();
        let t = mint_token(&op, "alice", grant(1), now, Duration::hours(1));
        let rogue = KeyPair::from_seed(&[2; 32]);
        let e = verify_token(&t, &ring(&rogue, Role::Operator), now).unwrap_err();
        assert_eq!(e.reason, "bad_token");
        assert!(e.detail.contains("unknown_key"), "{e}");
        // A node key may not mint: wrong role.
        let e = verify_token(&t, &ring(&op, Role::Node), now).unwrap_err();
        assert!(e.detail.contains("wrong_role"), "{e}");
        // Tampered: max_uses raised after signing.
        let json = String::from_utf8(B64URL.decode(&t).unwrap()).unwrap();
        let forged = B64URL.encode(json.replace("\"max_uses\":1", "\"max_uses\":99"));
        let e = verify_token(&forged, &ring(&op, Role::Operator), now).unwrap_err();
        assert!(e.detail.contains("bad_signature"), "{e}");
        for junk in ["", "!!!", "aGVsbG8"] {
            assert_eq!(
                verify_token(junk, &ring(&op, Role::Operator), now)
                    .unwrap_err()
                    .reason,
                "bad_token"
            );
        }
        assert_eq!(
            verify_token(&"A".repeat(MAX_TOKEN + 1), &ring(&op, Role::Operator), now)
                .unwrap_err()
                .reason,
            "bad_token"
        );
        // No expiry, or minted far in the future.
        let mut env = Envelope::new_at("alice", grant(1), now);
        let no_expiry = B64URL.encode(op.seal(env.clone()));
        let e = verify_token(&no_expiry, &ring(&op, Role::Operator), now).unwrap_err();
        assert!(e.detail.contains("expiry"), "{e}");
        env.ts = now + Duration::hours(1);
        env.expires = Some(now + Duration::hours(2));
        let future = B64URL.encode(op.seal(env));
        let e = verify_token(&future, &ring(&op, Role::Operator), now).unwrap_err();
        assert!(e.detail.contains("future"), "{e}");
    }

    fn request(key: &KeyPair, from: &str, presented: &KeyPair, now: DateTime<Utc>) -> Vec<u8> {
        let body = EnrollRequest {
            public_key: presented.public_pem(),
            token: "t".into(),
            district: None,
            profile: Some("small".into()),
        };
        key.seal(Envelope::new_at(from, body, now))
    }

    #[test]
    fn a_request_proves_possession_of_the_key_it_presents() {
        let node = KeyPair::from_seed(&[5; 32]);
        let other = KeyPair::from_seed(&[6; 32]);
        let now = Utc::now();
        let ok = Envelope::decode(&request(&node, "n1", &node, now)).unwrap();
        let p = verify_possession(ok, TimePolicy::default(), now).unwrap();
        assert_eq!(p.envelope.from, "n1");
        assert_eq!(crate::sign::key_id(&p.key), node.id());
        // Presents one key, signed by another: the presenter does not hold it.
        let stolen = Envelope::decode(&request(&other, "n1", &node, now)).unwrap();
        let r = verify_possession(stolen, TimePolicy::default(), now).unwrap_err();
        assert_eq!(r.reason, "unknown_key");
        // Old requests are stale (a captured request replayed later).
        let old = Envelope::decode(&request(&node, "n1", &node, now - Duration::hours(1))).unwrap();
        let r = verify_possession(old, TimePolicy::default(), now).unwrap_err();
        assert_eq!(r.reason, "stale");
    }
}
