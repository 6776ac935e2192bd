//! The signed-message gate: the one chain every receiver runs before it acts
//! on bytes from the bus.
//!
//! 1. **decode** the envelope's header (bounded; see
//!    [`Envelope::decode_raw`]); the body stays JSON for now;
//! 2. **kind**: refuse a kind the receiver does not expect on this
//!    destination (cheap, and before any signature work, so that a flood of
//!    junk costs only its counting);
//! 3. **signature, key and role** ([`Keyring::verify_raw`]);
//! 4. **time**: `expires` and the skew window ([`TimePolicy`]), unless the
//!    receiver reads from a durable queue where age is no reason to refuse;
//! 5. **body**: its shape and bounds for its kind (only a message from a
//!    trusted sender costs a full decode);
//! 6. **replay**: the id was not seen within the window, when the receiver
//!    keeps a replay record ([`Replay`]).
//!
//! The gate decides; it does not count, log or answer. A [`Refusal`] carries
//! the stable reason label (`refused_total{reason}`), a bounded detail, and
//! whatever of the envelope could still be read (id, sender, kind, `corr`)
//! so that the receiver can answer with `event.refused` where it should.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::envelope::{Decoded, Envelope, RawEnvelope};
use crate::error::{AuthError, ProtoError};
use crate::msg::{Kind, Role};
use crate::replay::ReplayGuard;
use crate::sign::{Keyring, TimePolicy};

/// Longest refusal detail kept, in bytes: details end up in logs and in
/// `event.refused` bodies, and a hostile message must not make them large.
pub const MAX_DETAIL: usize = 2048;

/// Reason label of a message whose kind the receiver does not take here.
pub const UNEXPECTED_KIND: &str = "unexpected_kind";

/// What a receiver takes on one destination.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    kinds: fn(Kind) -> bool,
    roles: Option<&'static [Role]>,
    time: bool,
}

impl Expect {
    /// Messages whose kind satisfies `kinds`, with the time checks on.
    pub const fn kinds(kinds: fn(Kind) -> bool) -> Self {
        Expect {
            kinds,
            roles: None,
            time: true,
        }
    }

    /// Any kind, with the time checks on.
    pub const fn any() -> Self {
        Expect::kinds(|_| true)
    }

    /// Leaves out the time checks: for durable queues, where a message's age
    /// is no reason to refuse it and its effect is idempotent on its id.
    pub const fn any_age(mut self) -> Self {
        self.time = false;
        self
    }

    /// Takes only keys of these roles (on top of the roles the kind allows).
    pub const fn roles(mut self, roles: &'static [Role]) -> Self {
        self.roles = Some(roles);
        self
    }

    /// Whether the time checks are on.
    pub const fn checks_time(&self) -> bool {
        self.time
    }
}

/// A receiver's record of message ids already acted upon.
///
/// [`ReplayGuard`] keeps it in memory; a receiver that must survive restarts
/// implements it over its own journal.
pub trait Replay {
    /// Records `id` (sent at `ts`); refuses it if it was already seen.
    fn check_and_record(
        &mut self,
        id: Uuid,
        ts: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), AuthError>;
}

impl Replay for ReplayGuard {
    fn check_and_record(
        &mut self,
        id: Uuid,
        ts: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), AuthError> {
        ReplayGuard::check_and_record(self, id, ts, now)
    }
}

/// A message that passed the gate.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The message.
    pub envelope: Envelope,
    /// The role of the key that signed it.
    pub role: Role,
}

/// The step of the gate that refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The bytes are not a v1 envelope, or its body does not have its
    /// kind's shape.
    Decode,
    /// The kind is not taken on this destination.
    Kind,
    /// Signature, key or role (or a replayed id).
    Auth,
    /// `expires` or the skew window.
    Time,
}

/// Why the gate refused a message, and what could be read of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The step that refused it.
    pub step: Step,
    /// Stable label for metrics and `event.refused` (`bad_signature`, ...).
    pub reason: &'static str,
    /// Human-readable detail, at most [`MAX_DETAIL`] bytes.
    pub detail: String,
    /// The envelope id, when it could be read (even from a malformed message).
    pub id: Option<Uuid>,
    /// The claimed sender, when the envelope decoded.
    pub from: Option<String>,
    /// The kind, when the envelope decoded.
    pub kind: Option<Kind>,
    /// The operation id, when the envelope decoded.
    pub corr: Option<String>,
}

impl Refusal {
    /// A refusal of a message that decoded, for `reason`.
    pub fn of(env: &Envelope, reason: &'static str, detail: impl AsRef<str>) -> Refusal {
        Refusal {
            step: Step::Auth,
            reason,
            detail: clip(detail.as_ref()),
            id: Some(env.id),
            from: Some(env.from.clone()),
            kind: Some(env.kind()),
            corr: env.corr.clone(),
        }
    }

    fn of_raw(
        raw: &RawEnvelope,
        step: Step,
        reason: &'static str,
        detail: impl AsRef<str>,
    ) -> Refusal {
        Refusal {
            step,
            reason,
            detail: clip(detail.as_ref()),
            id: Some(raw.id),
            from: Some(raw.from.clone()),
            kind: Some(raw.kind),
            corr: raw.corr.clone(),
        }
    }

    pub(crate) fn raw_auth(raw: &RawEnvelope, e: &AuthError) -> Refusal {
        let step = match e {
            AuthError::Expired(_) | AuthError::Stale { .. } => Step::Time,
            _ => Step::Auth,
        };
        let detail = format!("{} from {}: {e}", raw.kind, raw.from);
        Refusal::of_raw(raw, step, e.reason_label(), detail)
    }

    pub(crate) fn undecodable(bytes: &[u8], e: &ProtoError) -> Refusal {
        Refusal {
            step: Step::Decode,
            reason: e.reason_label(),
            detail: clip(&e.to_string()),
            id: lenient_id(bytes),
            from: None,
            kind: None,
            corr: None,
        }
    }

    /// A refusal of a message the transport dropped for its size before
    /// anyone read it (`too_large`, step 1): nothing of the envelope is known.
    pub fn oversized(size: u64, limit: usize) -> Refusal {
        let e = ProtoError::TooLarge {
            size: usize::try_from(size).unwrap_or(usize::MAX),
            limit,
        };
        Refusal::undecodable(&[], &e)
    }

    /// A refusal for `e`, found by the gate or by a receiver's own checks
    /// after it (the time of a new command, a replay record of its own).
    pub fn auth(env: &Envelope, e: &AuthError) -> Refusal {
        let step = match e {
            AuthError::Expired(_) | AuthError::Stale { .. } => Step::Time,
            _ => Step::Auth,
        };
        Refusal {
            step,
            ..Refusal::of(
                env,
                e.reason_label(),
                format!("{} from {}: {e}", env.kind(), env.from),
            )
        }
    }

    /// The kind as a label (`unknown` when the message did not decode).
    pub fn kind_label(&self) -> &'static str {
        self.kind.map_or("unknown", Kind::as_str)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

/// The trusted keys and time policy of one receiver. It borrows the
/// keyring: build one per message or keep one, whichever suits the receiver.
#[derive(Debug, Clone, Copy)]
pub struct Gate<'k> {
    keyring: &'k Keyring,
    time: TimePolicy,
}

impl<'k> Gate<'k> {
    /// A gate trusting `keyring`, with `time` for the time checks.
    pub fn new(keyring: &'k Keyring, time: TimePolicy) -> Gate<'k> {
        Gate { keyring, time }
    }

    /// The trusted keys.
    pub fn keyring(&self) -> &'k Keyring {
        self.keyring
    }

    /// The time policy.
    pub fn time_policy(&self) -> TimePolicy {
        self.time
    }

    /// Steps 1 to 5: header, kind, signature and role, time, body.
    pub fn admit(
        &self,
        bytes: &[u8],
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<Admitted, Refusal> {
        let raw = Envelope::decode_raw(bytes).map_err(|e| Refusal::undecodable(bytes, &e))?;
        self.admit_raw(raw, expect, now)
    }

    /// Steps 2 to 5 on a header already decoded (a receiver that looked at
    /// it first, for example to keep only the newest report of each node).
    pub fn admit_raw(
        &self,
        raw: RawEnvelope,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<Admitted, Refusal> {
        check_kind(&raw, expect)?;
        let role = self
            .keyring
            .verify_raw(&raw)
            .map_err(|e| Refusal::raw_auth(&raw, &e))?;
        self.after_signature(raw, role, expect, now)
    }

    /// Steps 3 (role) to 5 on a header whose signature is good.
    pub(crate) fn after_signature(
        &self,
        raw: RawEnvelope,
        role: Role,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<Admitted, Refusal> {
        if let Some(roles) = expect.roles
            && !roles.contains(&role)
        {
            let e = wrong_role(raw.sig.as_deref(), role, raw.kind);
            return Err(Refusal::raw_auth(&raw, &e));
        }
        if expect.time {
            self.time
                .check_times(raw.ts, raw.expires, now)
                .map_err(|e| Refusal::raw_auth(&raw, &e))?;
        }
        let head = raw.clone_header();
        let decoded = raw
            .typed()
            .map_err(|e| Refusal::of_raw(&head, Step::Decode, e.reason_label(), e.to_string()))?;
        Ok(Admitted {
            envelope: decoded.envelope,
            role,
        })
    }

    /// Steps 2 to 4 on a message already decoded in full (its body was
    /// checked by [`Envelope::decode`]).
    pub fn admit_decoded(
        &self,
        decoded: Decoded,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<Admitted, Refusal> {
        let env = &decoded.envelope;
        if !(expect.kinds)(env.kind()) {
            return Err(Refusal {
                step: Step::Kind,
                ..Refusal::of(
                    env,
                    UNEXPECTED_KIND,
                    format!("{} from {} is not taken here", env.kind(), env.from),
                )
            });
        }
        let role = self
            .keyring
            .verify_signature(&decoded)
            .map_err(|e| Refusal::auth(env, &e))?;
        if let Some(roles) = expect.roles
            && !roles.contains(&role)
        {
            let e = wrong_role(env.sig.as_deref(), role, env.kind());
            return Err(Refusal::auth(env, &e));
        }
        if expect.time {
            self.time
                .check(env, now)
                .map_err(|e| Refusal::auth(env, &e))?;
        }
        Ok(Admitted {
            envelope: decoded.envelope,
            role,
        })
    }

    /// Steps 1 to 6: [`Gate::admit`], then the replay record.
    pub fn admit_once(
        &self,
        bytes: &[u8],
        expect: Expect,
        now: DateTime<Utc>,
        replay: &mut impl Replay,
    ) -> Result<Admitted, Refusal> {
        let a = self.admit(bytes, expect, now)?;
        replay
            .check_and_record(a.envelope.id, a.envelope.ts, now)
            .map_err(|e| Refusal::auth(&a.envelope, &e))?;
        Ok(a)
    }
}

/// Step 2: the kind is one the receiver takes here.
pub(crate) fn check_kind(raw: &RawEnvelope, expect: Expect) -> Result<(), Refusal> {
    if (expect.kinds)(raw.kind) {
        return Ok(());
    }
    let detail = format!("{} from {} is not taken here", raw.kind, raw.from);
    Err(Refusal::of_raw(raw, Step::Kind, UNEXPECTED_KIND, detail))
}

fn wrong_role(sig: Option<&str>, role: Role, kind: Kind) -> AuthError {
    AuthError::WrongRole {
        key: sig
            .and_then(|s| s.split(':').nth(1))
            .unwrap_or_default()
            .chars()
            .take(32)
            .collect(),
        role: role.to_string(),
        kind: kind.to_string(),
    }
}

/// Cuts `s` to at most [`MAX_DETAIL`] bytes at a character boundary, marking
/// the cut with `…`.
pub fn clip(s: &str) -> String {
    if s.len() <= MAX_DETAIL {
        return s.to_string();
    }
    let mut end = MAX_DETAIL;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The envelope id of bytes that failed to decode, when it can still be read
/// (so that the refusal can name the command it refuses).
fn lenient_id(bytes: &[u8]) -> Option<Uuid> {
    if bytes.len() > crate::envelope::MAX_MESSAGE_BYTES {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Uuid::parse_str(v.get("id")?.as_str()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Ack, Deactivate, Ping};
    use crate::sign::KeyPair;

    fn ring() -> (KeyPair, Keyring) {
        let broker = KeyPair::from_seed(&[3; 32]);
        let mut ring = Keyring::new();
        ring.add(broker.public(), Role::Broker, "broker");
        (broker, ring)
    }

    const COMMANDS: Expect = Expect::kinds(Kind::is_command);

    #[test]
    fn admits_a_signed_fresh_command() {
        let (k, ring) = ring();
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        let bytes = k.seal(Envelope::new_at("broker", Deactivate::default(), now));
        let a = g.admit(&bytes, COMMANDS, now).unwrap();
        assert_eq!(a.role, Role::Broker);
        assert_eq!(a.envelope.kind(), Kind::Deactivate);
    }

    #[test]
    fn each_step_refuses_with_its_reason() {
        let (k, ring) = ring();
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();

        let junk = br#"{"v":1,"id":"6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9","kind":"nope"}"#;
        let r = g.admit(junk, COMMANDS, now).unwrap_err();
        assert_eq!(r.reason, "unknown_kind");
        assert_eq!(
            r.id.unwrap().to_string(),
            "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
        );

        // The kind is checked before the signature: an unsigned event on a
        // command queue costs no signature work.
        let unsigned = Envelope::new_at(
            "n1",
            Ack {
                cmd: Uuid::nil(),
                command: "cmd.ping".into(),
            },
            now,
        )
        .encode();
        let r = g.admit(&unsigned, COMMANDS, now).unwrap_err();
        assert_eq!(r.reason, UNEXPECTED_KIND);
        assert_eq!(r.from.as_deref(), Some("n1"));

        let unsigned = Envelope::new_at("b", Deactivate::default(), now).encode();
        assert_eq!(
            g.admit(&unsigned, COMMANDS, now).unwrap_err().reason,
            "unsigned"
        );

        let rogue = KeyPair::from_seed(&[4; 32]);
        let forged = rogue.seal(Envelope::new_at("b", Deactivate::default(), now));
        assert_eq!(
            g.admit(&forged, COMMANDS, now).unwrap_err().reason,
            "unknown_key"
        );

        let old = k.seal(Envelope::new_at(
            "b",
            Deactivate::default(),
            now - chrono::Duration::minutes(10),
        ));
        assert_eq!(g.admit(&old, COMMANDS, now).unwrap_err().reason, "stale");
        assert!(g.admit(&old, COMMANDS.any_age(), now).is_ok());

        let fresh = k.seal(Envelope::new_at("b", Deactivate::default(), now));
        let operators_only = COMMANDS.roles(&[Role::Operator]);
        assert_eq!(
            g.admit(&fresh, operators_only, now).unwrap_err().reason,
            "wrong_role"
        );
    }

    #[test]
    fn the_signer_is_checked_before_the_body() {
        let (k, ring) = ring();
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        // A broker key may not send events: wrong_role, although the body is
        // not an event's either.
        let env = Envelope::new_at("b", Deactivate::default(), now);
        let mut v: serde_json::Value = serde_json::from_slice(&env.encode()).unwrap();
        v["kind"] = "event.ack".into();
        let bytes = k.seal_value(&v);
        let r = g.admit(&bytes, Expect::any(), now).unwrap_err();
        assert_eq!(r.reason, "wrong_role");
        assert_eq!(r.step, Step::Auth);

        // A trusted sender with a malformed body: bad_body, after the checks.
        let mut v: serde_json::Value = serde_json::from_slice(&env.encode()).unwrap();
        v["body"] = serde_json::json!(["reason"]);
        let bytes = k.seal_value(&v);
        let r = g.admit(&bytes, COMMANDS, now).unwrap_err();
        assert_eq!((r.reason, r.step), ("bad_body", Step::Decode));
        assert_eq!(r.kind, Some(Kind::Deactivate));
    }

    #[test]
    fn replays_are_refused_once_recorded() {
        let (k, ring) = ring();
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        let mut seen = ReplayGuard::new(chrono::Duration::minutes(10), 16);
        let bytes = k.seal(Envelope::new_at("b", Ping {}, now));
        assert!(g.admit_once(&bytes, Expect::any(), now, &mut seen).is_ok());
        let r = g
            .admit_once(&bytes, Expect::any(), now, &mut seen)
            .unwrap_err();
        assert_eq!(r.reason, "replayed");
        assert_eq!(r.kind, Some(Kind::Ping));
    }

    #[test]
    fn a_bound_key_speaks_only_for_its_sender() {
        let a = KeyPair::from_seed(&[5; 32]);
        let mut ring = Keyring::new();
        ring.add_bound(a.public(), Role::Node, "node-a", "nodes.d/node-a.pub");
        let g = Gate::new(&ring, TimePolicy::default());
        let now = Utc::now();
        let ack = || Ack {
            cmd: Uuid::nil(),
            command: "cmd.ping".into(),
        };
        let own = a.seal(Envelope::new_at("node-a", ack(), now));
        assert_eq!(g.admit(&own, Expect::any(), now).unwrap().role, Role::Node);
        // A's key signing as B: a valid signature by a trusted key, refused.
        let forged = a.seal(Envelope::new_at("node-b", ack(), now));
        let r = g.admit(&forged, Expect::any(), now).unwrap_err();
        assert_eq!((r.reason, r.step), ("identity", Step::Auth));
        assert_eq!(r.from.as_deref(), Some("node-b"));
        let d = Envelope::decode(&forged).unwrap();
        assert_eq!(
            g.admit_decoded(d, Expect::any(), now).unwrap_err().reason,
            "identity"
        );
        // Revoked: the key is unknown from then on.
        ring.remove(a.id());
        let g = Gate::new(&ring, TimePolicy::default());
        assert_eq!(
            g.admit(&own, Expect::any(), now).unwrap_err().reason,
            "unknown_key"
        );
    }

    #[test]
    fn details_are_bounded() {
        let long = "é".repeat(MAX_DETAIL);
        let c = clip(&long);
        assert!(c.len() <= MAX_DETAIL + "…".len());
        assert!(c.ends_with('…'));
        assert_eq!(clip("short"), "short");
    }
}
