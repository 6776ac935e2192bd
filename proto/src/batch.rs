//! Many messages through the gate at once, their signatures checked in one
//! Ed25519 batch verification.
//!
//! A receiver that takes its queue in batches (the broker agent's reports)
//! hands the gate every header of the batch. The gate runs the cheap steps
//! per message, then checks every signature that names a trusted key in one
//! batch: a single multiscalar multiplication costs about half of verifying
//! each alone. When the batch fails, some signature in it is bad: each is
//! then verified alone, so every message gets exactly the verdict it would
//! have had on its own, and a forged message costs its batch the single
//! checks (never a good message's admission).
//!
//! A batch accepts what verifying alone accepts; it also accepts a
//! signature whose `R` is encoded non-canonically (the same signature
//! re-encoded by a third party): that changes no byte the signer signed,
//! and replays are refused by id and sequence, not by signature bytes.

use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};

use crate::envelope::{Envelope, RawEnvelope};
use crate::error::AuthError;
use crate::gate::{Admitted, Expect, Gate, Refusal, check_kind};
use crate::msg::Role;
use crate::sign::{Keyring, TrustedKey, after_signature};

/// Below this many signatures a batch is not worth its set-up: each is
/// verified alone.
pub const MIN_BATCH: usize = 4;

/// A signature ready to check: which message, its signature, its key.
struct Pending<'a> {
    at: usize,
    signature: Signature,
    kid: &'a str,
    trusted: &'a TrustedKey,
}

impl Keyring {
    /// [`Keyring::verify_raw`] of many headers, the signatures checked in
    /// one batch (see the module's documentation); the verdicts in order.
    pub fn verify_raw_many(&self, raws: &[&RawEnvelope]) -> Vec<Result<Role, AuthError>> {
        let mut verdicts: Vec<Result<Role, AuthError>> = Vec::with_capacity(raws.len());
        let mut pending = vec![];
        for (at, raw) in raws.iter().enumerate() {
            match self.signature_of(raw.sig.as_deref()) {
                Ok((signature, kid, trusted)) => {
                    pending.push(Pending {
                        at,
                        signature,
                        kid,
                        trusted,
                    });
                    // Replaced once the signature is checked.
                    verdicts.push(Err(AuthError::BadSignature));
                }
                Err(e) => verdicts.push(Err(e)),
            }
        }
        let good = signatures_good(raws, &pending);
        for (p, ok) in pending.iter().zip(good) {
            let raw = raws[p.at];
            verdicts[p.at] = if ok {
                after_signature(p.kid, p.trusted, raw.kind, &raw.from)
            } else {
                Err(AuthError::BadSignature)
            };
        }
        verdicts
    }
}

/// Whether each pending signature is good: one batch, and each alone only
/// when the batch fails (or is too small to be worth it).
fn signatures_good(raws: &[&RawEnvelope], pending: &[Pending<'_>]) -> Vec<bool> {
    if pending.len() >= MIN_BATCH {
        let messages: Vec<&[u8]> = pending.iter().map(|p| &raws[p.at].signed[..]).collect();
        let signatures: Vec<Signature> = pending.iter().map(|p| p.signature).collect();
        let keys: Vec<VerifyingKey> = pending.iter().map(|p| p.trusted.key).collect();
        if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok() {
            return vec![true; pending.len()];
        }
    }
    pending
        .iter()
        .map(|p| {
            p.trusted
                .key
                .verify(&raws[p.at].signed, &p.signature)
                .is_ok()
        })
        .collect()
}

impl Gate<'_> {
    /// [`Gate::admit`] of many messages, their signatures checked in one
    /// batch; the verdicts in order, each what `admit` gives alone.
    pub fn admit_many(
        &self,
        messages: &[&[u8]],
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Vec<Result<Admitted, Refusal>> {
        let heads: Vec<Result<RawEnvelope, Refusal>> = messages
            .iter()
            .map(|bytes| {
                let raw =
                    Envelope::decode_raw(bytes).map_err(|e| Refusal::undecodable(bytes, &e))?;
                check_kind(&raw, expect)?;
                Ok(raw)
            })
            .collect();
        let to_verify: Vec<&RawEnvelope> = heads.iter().filter_map(|h| h.as_ref().ok()).collect();
        let mut roles = self.keyring().verify_raw_many(&to_verify).into_iter();
        heads
            .into_iter()
            .map(|head| {
                let raw = head?;
                let role = roles.next().unwrap_or(Err(AuthError::BadSignature));
                let role = role.map_err(|e| Refusal::raw_auth(&raw, &e))?;
                self.after_signature(raw, role, expect, now)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Kind, NodeReport};
    use crate::sign::{KeyPair, TimePolicy};

    const REPORTS: Expect = Expect::kinds(|k| k == Kind::Report);

    /// Nodes n0..n{count}, each with its own key bound to its name.
    fn fleet(count: u8) -> (Vec<KeyPair>, Keyring) {
        let mut ring = Keyring::new();
        let keys: Vec<KeyPair> = (0..count)
            .map(|i| {
                let k = KeyPair::from_seed(&[i + 1; 32]);
                ring.add_bound(k.public(), Role::Node, format!("n{i}"), format!("n{i}"));
                k
            })
            .collect();
        (keys, ring)
    }

    fn report(key: &KeyPair, from: &str, seq: u64, now: DateTime<Utc>) -> Vec<u8> {
        // Only the fields a report must carry; the rest take their defaults.
        let r: NodeReport = serde_json::from_value(serde_json::json!({
            "node": from, "seq": seq, "profile": "small", "max_active_gears": 100,
            "gears": {}, "active": true, "started_at": now, "interval_secs": 60,
        }))
        .unwrap();
        key.seal(Envelope::new_at(from, r, now))
    }

    /// The batch's verdicts, as reason labels (`ok` when admitted).
    fn batch_labels(g: &Gate<'_>, msgs: &[Vec<u8>], now: DateTime<Utc>) -> Vec<String> {
        let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
        g.admit_many(&refs, REPORTS, now)
            .into_iter()
            .map(|r| r.map_or_else(|e| e.reason.to_string(), |_| "ok".into()))
            .collect()
    }

    /// Each alone through `admit_raw`.
    fn single_labels(g: &Gate<'_>, msgs: &[Vec<u8>], now: DateTime<Utc>) -> Vec<String> {
        msgs.iter()
            .map(|m| {
                g.admit(m, REPORTS, now)
                    .map_or_else(|e| e.reason.to_string(), |_| "ok".into())
            })
            .collect()
    }

    #[test]
    fn a_good_batch_is_admitted_whole() {
        let (keys, ring) = fleet(12);
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        let msgs: Vec<Vec<u8>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| report(k, &format!("n{i}"), 7, now))
            .collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
        let admitted = g.admit_many(&refs, REPORTS, now);
        assert_eq!(admitted.len(), 12);
        for (i, a) in admitted.into_iter().enumerate() {
            let a = a.unwrap();
            assert_eq!(a.envelope.from, format!("n{i}"));
            assert_eq!(a.role, Role::Node);
        }
    }

    #[test]
    fn every_message_gets_the_verdict_it_gets_alone() {
        let (keys, ring) = fleet(8);
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        let mut msgs: Vec<Vec<u8>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| report(k, &format!("n{i}"), 1, now))
            .collect();
        // A forged figure under n1's signature.
        let forged =
            String::from_utf8(msgs[1].clone())
                .unwrap()
                .replacen("\"seq\":1", "\"seq\":9", 1);
        msgs[1] = forged.into_bytes();
        // n2's key signing as n3 (a bound key speaks only for its host).
        msgs[2] = report(&keys[2], "n3", 1, now);
        // A key nobody trusts, a command among reports, an old report,
        // bytes that are no envelope.
        msgs[3] = report(&KeyPair::from_seed(&[99; 32]), "n3", 1, now);
        let cmd = crate::msg::Deactivate::default();
        msgs[4] = keys[4].seal(Envelope::new_at("n4", cmd, now));
        msgs[5] = report(&keys[5], "n5", 1, now - chrono::Duration::hours(1));
        msgs[6] = b"{not json".to_vec();
        let got = batch_labels(&g, &msgs, now);
        assert_eq!(got, single_labels(&g, &msgs, now));
        assert_eq!(
            got,
            [
                "ok",
                "bad_signature",
                "identity",
                "unknown_key",
                "unexpected_kind",
                "stale",
                "malformed",
                "ok"
            ]
        );
    }

    #[test]
    fn small_and_empty_batches() {
        let (keys, ring) = fleet(2);
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        assert!(g.admit_many(&[], REPORTS, now).is_empty());
        let msgs = vec![
            report(&keys[0], "n0", 1, now),
            report(&keys[1], "n0", 1, now),
        ];
        assert_eq!(batch_labels(&g, &msgs, now), ["ok", "identity"]);
    }
}
