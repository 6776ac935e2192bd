//! `enroll.request`, taken on the operator request queue (same routing key,
//! same `reply_to` answer): a node booted by a scale-up, holding only an
//! enrollment token, gets its new key trusted for its host.
//!
//! The chain: decode; proof of possession (the request is signed by the key
//! it presents, as its `from`, fresh: [`verify_possession`]); the token
//! (signed by a trusted operator or broker key, not expired:
//! [`verify_token`]); the decision ([`crate::enroll::decide`]) against the
//! host's current `nodes.d` file and the token ledger. Enrolling writes
//! `nodes.d/<host>.pub` first (the same file the key loader reads), then
//! records the use in the ledger, then rebuilds the live keyring through the
//! reload path ([`super::KeySource`]) and answers. A crash between the file
//! and the ledger leaves the host enrolled and the use unrecorded: the
//! node's retry is answered `already_enrolled` and records it.

use chrono::{DateTime, Utc};
use gearshift_bus::Delivery;
use gearshift_proto::enroll::{Possession, Token, verify_possession, verify_token};
use gearshift_proto::msg::{EnrollReply, Role};
use gearshift_proto::sign::key_id;
use gearshift_proto::{Envelope, Refusal, Step};

use super::deliveries::{Log, ack};
use super::{Agent, RunState};
use crate::enroll::{Ask, Verdict, decide, store::Stored};

/// Why an enrollment did not go through: the reply's reason and a detail.
type No = (&'static str, String);

impl Agent {
    /// One `enroll.request`: decided, carried out, answered, acknowledged.
    /// Never fails the loop: a refusal is an answer.
    pub(super) async fn on_enroll_delivery(&mut self, st: &mut RunState, d: Delivery) {
        let now = Utc::now();
        let (reply, corr) = match Envelope::decode(&d.payload) {
            Err(e) => {
                let r = Refusal {
                    step: Step::Decode,
                    reason: e.reason_label(),
                    detail: gearshift_proto::gate::clip(&e.to_string()),
                    id: None,
                    from: None,
                    kind: None,
                    corr: None,
                };
                self.refuse(st, Log::Admin, &r);
                self.metrics.enrollment("bad_request");
                ack(d).await;
                return;
            }
            Ok(decoded) => {
                let corr = decoded.envelope.corr.clone();
                match verify_possession(decoded, self.gate().time_policy(), now) {
                    Err(r) => {
                        self.refuse(st, Log::Admin, &r);
                        (answer(Err(("bad_request", r.to_string()))), corr)
                    }
                    Ok(p) => (answer(self.enroll(p, now)), corr),
                }
            }
        };
        self.metrics.enrollment(&reply.reason);
        self.reply(&d, reply, corr).await;
        ack(d).await;
    }

    /// Checks the token and decides; enrolls when the decision says so.
    fn enroll(&mut self, p: Possession, now: DateTime<Utc>) -> Result<Verdict, No> {
        let host = p.envelope.from.as_str();
        let token =
            verify_token(&p.request.token, &self.keyring, now).map_err(|e| (e.reason, e.detail))?;
        let dir = self.cfg.keys.node_keys_dir.clone();
        let enrolled = gearshift_service::keys::read_bound_public(&dir, host)
            .map_err(|e| ("failed", e.to_string()))?
            .map(|k| key_id(&k));
        let kid = key_id(&p.key);
        let ask = Ask {
            host,
            key_id: &kid,
            district: p.request.district.as_deref(),
            profile: p.request.profile.as_deref(),
        };
        let mut stored = Stored::open(&self.state_dir, now);
        let verdict = decide(&stored.ledger, &token, ask, enrolled.as_deref(), now);
        if let Verdict::Refuse(reason, detail) = &verdict {
            tracing::warn!(host, token = %token.id, reason = *reason, detail = %detail, "enrollment refused");
            return Err((reason, detail.clone()));
        }
        if verdict == Verdict::Enroll {
            gearshift_service::keys::write_bound_public(&dir, host, &p.key)
                .map_err(|e| ("failed", e.to_string()))?;
        }
        if stored.ledger.record(&token, host) {
            stored
                .save()
                .map_err(|e| ("failed", format!("enrollment ledger: {e}")))?;
        }
        if verdict == Verdict::Enroll {
            self.trust_enrolled(host, &p, &token);
        }
        Ok(verdict)
    }

    /// Rebuilds the live keyring the way a reload does (so the new file is
    /// read by the one key loader); an embedding program that gave its own
    /// keyring gets the key added to it.
    fn trust_enrolled(&mut self, host: &str, p: &Possession, token: &Token) {
        let rebuilt = self.key_source.as_ref().map(|f| f(&self.cfg));
        let ring = match rebuilt {
            Some(Ok(ring)) => ring,
            other => {
                if let Some(Err(e)) = other {
                    tracing::warn!(error = %e, "keys: cannot re-read the key files; adding the enrolled key alone");
                }
                let mut ring = (*self.keyring).clone();
                ring.add_bound(p.key, Role::Node, host, format!("enrolled {host}"));
                ring
            }
        };
        self.keyring = std::sync::Arc::new(ring);
        tracing::info!(host, key = %key_id(&p.key), token = %token.id, issuer = %token.issuer,
            group = %format!("{}/{}", token.grant.district, token.grant.profile), "node enrolled");
    }
}

/// The reply for a decision or a refusal.
fn answer(r: Result<Verdict, No>) -> EnrollReply {
    match r {
        Ok(v) => EnrollReply {
            ok: true,
            reason: v.label().to_string(),
            message: match v {
                Verdict::Already => "this key is already enrolled for this host".into(),
                _ => "enrolled: reports signed by this key are taken from now on".into(),
            },
        },
        Err((reason, detail)) => EnrollReply {
            ok: false,
            reason: reason.to_string(),
            message: gearshift_proto::gate::clip(&detail),
        },
    }
}
