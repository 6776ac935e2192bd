//! Signing and verification (Ed25519), keys in PEM files, and the keyring.
//!
//! A signature is the string `ed25519:<keyid>:<base64>` where `<base64>` is the
//! standard-alphabet, padded base64 of the 64-byte Ed25519 signature over
//! [`Envelope::signing_bytes`](crate::Envelope::signing_bytes), and `<keyid>` is
//! the first 16 hex digits of SHA-256 over the 32-byte raw public key.
//! Keys are PKCS#8 (private) and SubjectPublicKeyInfo (public) PEM, as
//! `openssl genpkey -algorithm ed25519` writes them.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Duration, Utc};
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier as _};

/// An Ed25519 public key (what a [`Keyring`] trusts).
pub use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use crate::envelope::{Decoded, Envelope, RawEnvelope, format_ts};
use crate::error::AuthError;
use crate::msg::{Kind, Role};

/// The only signature algorithm of protocol v1.
pub const ALG_ED25519: &str = "ed25519";

/// Errors reading key material.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The PEM text is not an Ed25519 key of the expected type.
    #[error("not an Ed25519 {expected} key in PEM form: {reason}")]
    Pem {
        /// `private` or `public`.
        expected: &'static str,
        /// Decoder's reason.
        reason: String,
    },
    /// The system's random number generator failed.
    #[error("cannot get random bytes: {0}")]
    Random(String),
}

/// Key id of a public key: first 16 hex digits of SHA-256 of its 32 raw bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(&digest[..8])
}

/// DER of a PKCS#8 v1 `PrivateKeyInfo` for Ed25519 up to the seed:
/// SEQUENCE (46 bytes) { INTEGER 0, SEQUENCE { OID 1.3.101.112 },
/// OCTET STRING { OCTET STRING (32 bytes) } }.
const PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A private signing key with its key id.
#[derive(Clone)]
pub struct KeyPair {
    key: SigningKey,
    id: String,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl KeyPair {
    /// A new random key pair.
    pub fn generate() -> Result<KeyPair, KeyError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Self::from_seed(&seed))
    }

    /// A key pair from a 32-byte seed (deterministic; for tests and the simulator).
    pub fn from_seed(seed: &[u8; 32]) -> KeyPair {
        let key = SigningKey::from_bytes(seed);
        let id = key_id(&key.verifying_key());
        KeyPair { key, id }
    }

    /// Reads a PKCS#8 PEM private key.
    pub fn from_pem(pem: &str) -> Result<KeyPair, KeyError> {
        let key = SigningKey::from_pkcs8_pem(pem).map_err(|e| KeyError::Pem {
            expected: "private",
            reason: e.to_string(),
        })?;
        let id = key_id(&key.verifying_key());
        Ok(KeyPair { key, id })
    }

    /// The private key as PKCS#8 v1 PEM (RFC 8410: the 32-byte seed only, 48
    /// bytes of DER), exactly what `openssl genpkey -algorithm ed25519`
    /// writes; OpenSSL 3 and Python's `cryptography` read it. (The v2 form
    /// with the public key, which `ed25519-dalek` writes, they refuse.)
    pub fn to_pem(&self) -> String {
        let mut der = Vec::with_capacity(PKCS8_V1_PREFIX.len() + 32);
        der.extend_from_slice(&PKCS8_V1_PREFIX);
        der.extend_from_slice(&self.key.to_bytes());
        let b64 = B64.encode(&der);
        format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n")
    }

    /// The public key as SubjectPublicKeyInfo PEM.
    pub fn public_pem(&self) -> String {
        public_to_pem(&self.key.verifying_key())
    }

    /// The public half.
    pub fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The key id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Signs `env` in place (sets `sig`).
    pub fn sign(&self, env: &mut Envelope) {
        env.sig = None;
        let sig = self.key.sign(&env.signing_bytes());
        env.sig = Some(format!(
            "{ALG_ED25519}:{}:{}",
            self.id,
            B64.encode(sig.to_bytes())
        ));
    }

    /// Signs an envelope given as JSON, whatever it holds (`sig` is
    /// replaced): for tools and tests that must send what [`Envelope`] would
    /// not build, such as a hostile client's malformed bodies. A value that
    /// is not an object is signed as an empty envelope.
    pub fn seal_value(&self, env: &serde_json::Value) -> Vec<u8> {
        let mut m = env.as_object().cloned().unwrap_or_default();
        m.remove("sig");
        let mut signed = Vec::new();
        crate::canonical::write_object(&m, &mut signed);
        let sig = self.key.sign(&signed);
        let sig = format!("{ALG_ED25519}:{}:{}", self.id, B64.encode(sig.to_bytes()));
        m.insert("sig".into(), serde_json::Value::String(sig));
        serde_json::Value::Object(m).to_string().into_bytes()
    }

    /// Signs and encodes in one step.
    pub fn seal(&self, mut env: Envelope) -> Vec<u8> {
        self.sign(&mut env);
        env.encode()
    }
}

/// A public key as SubjectPublicKeyInfo PEM (what [`public_from_pem`] reads).
pub fn public_to_pem(key: &VerifyingKey) -> String {
    // Encoding 32 bytes of a valid key into SPKI DER cannot fail.
    key.to_public_key_pem(Default::default())
        .unwrap_or_default()
}

/// Reads a SubjectPublicKeyInfo PEM public key.
pub fn public_from_pem(pem: &str) -> Result<VerifyingKey, KeyError> {
    VerifyingKey::from_public_key_pem(pem).map_err(|e| KeyError::Pem {
        expected: "public",
        reason: e.to_string(),
    })
}

/// A trusted public key and the role it may act as.
#[derive(Debug, Clone)]
pub struct TrustedKey {
    /// The key.
    pub key: VerifyingKey,
    /// Its role.
    pub role: Role,
    /// Where it came from (file name), for logs.
    pub label: String,
    /// The one sender (`from`) this key speaks for, when it is bound to an
    /// identity (a node key enrolled for host H speaks only for H); `None`
    /// for a key that may sign as any sender of its role.
    pub speaks_for: Option<String>,
}

/// The public keys a receiver trusts, by key id.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: HashMap<String, TrustedKey>,
}

impl Keyring {
    /// An empty keyring (trusts nobody).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts `key` for `role`, as any sender of that role; returns its
    /// key id.
    pub fn add(&mut self, key: VerifyingKey, role: Role, label: impl Into<String>) -> String {
        self.insert(key, role, None, label.into())
    }

    /// Trusts `key` for `role`, speaking only for the sender `from` (a node
    /// key enrolled for one host): a message it signs with another `from`
    /// is refused (`identity`). Returns its key id.
    pub fn add_bound(
        &mut self,
        key: VerifyingKey,
        role: Role,
        from: impl Into<String>,
        label: impl Into<String>,
    ) -> String {
        self.insert(key, role, Some(from.into()), label.into())
    }

    fn insert(
        &mut self,
        key: VerifyingKey,
        role: Role,
        speaks_for: Option<String>,
        label: String,
    ) -> String {
        let id = key_id(&key);
        self.keys.insert(
            id.clone(),
            TrustedKey {
                key,
                role,
                label,
                speaks_for,
            },
        );
        id
    }

    /// Forgets the key with this id (a revoked key); returns it.
    pub fn remove(&mut self, id: &str) -> Option<TrustedKey> {
        self.keys.remove(id)
    }

    /// The trusted keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = (&str, &TrustedKey)> {
        self.keys.iter().map(|(id, k)| (id.as_str(), k))
    }

    /// Number of trusted keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The trusted key with this id.
    pub fn get(&self, id: &str) -> Option<&TrustedKey> {
        self.keys.get(id)
    }

    /// Checks the signature of a decoded message, that its key's role may
    /// send its kind, and that a key bound to an identity signed as that
    /// identity. Returns the signing key's role.
    pub fn verify_signature(&self, d: &Decoded) -> Result<Role, AuthError> {
        let e = &d.envelope;
        self.verify_parts(e.sig.as_deref(), &d.signed, e.kind(), &e.from)
    }

    /// [`Keyring::verify_signature`] before the body is decoded.
    pub fn verify_raw(&self, r: &RawEnvelope) -> Result<Role, AuthError> {
        self.verify_parts(r.sig.as_deref(), &r.signed, r.kind, &r.from)
    }

    fn verify_parts(
        &self,
        sig: Option<&str>,
        signed: &[u8],
        kind: Kind,
        from: &str,
    ) -> Result<Role, AuthError> {
        let (signature, kid, trusted) = self.signature_of(sig)?;
        trusted
            .key
            .verify(signed, &signature)
            .map_err(|_| AuthError::BadSignature)?;
        after_signature(kid, trusted, kind, from)
    }

    /// The signature of a `sig` field and the trusted key it names (with
    /// that key's id), not yet checked against the signed bytes.
    pub(crate) fn signature_of<'s>(
        &self,
        sig: Option<&'s str>,
    ) -> Result<(Signature, &'s str, &TrustedKey), AuthError> {
        let sig = sig.ok_or(AuthError::Unsigned)?;
        let mut parts = sig.splitn(3, ':');
        let (alg, kid, b64) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(k), Some(b)) => (a, k, b),
            _ => {
                return Err(AuthError::MalformedSignature(
                    "expected alg:keyid:base64".into(),
                ));
            }
        };
        if alg != ALG_ED25519 {
            return Err(AuthError::MalformedSignature(format!(
                "unknown algorithm {:?}",
                alg.chars().take(32).collect::<String>()
            )));
        }
        let trusted = self
            .keys
            .get(kid)
            .ok_or_else(|| AuthError::UnknownKey(kid.chars().take(32).collect()))?;
        let raw = B64
            .decode(b64)
            .map_err(|e| AuthError::MalformedSignature(e.to_string()))?;
        let raw: [u8; 64] = raw
            .try_into()
            .map_err(|_| AuthError::MalformedSignature("signature is not 64 bytes".into()))?;
        Ok((Signature::from_bytes(&raw), kid, trusted))
    }
}

/// The checks after a good signature: the key's role may send `kind`, and a
/// key bound to an identity signed as that identity. Returns the role.
pub(crate) fn after_signature(
    kid: &str,
    trusted: &TrustedKey,
    kind: Kind,
    from: &str,
) -> Result<Role, AuthError> {
    if !kind.allowed_roles().contains(&trusted.role) {
        return Err(AuthError::WrongRole {
            key: kid.to_string(),
            role: trusted.role.to_string(),
            kind: kind.to_string(),
        });
    }
    // After the signature: only a key's holder learns that it is bound.
    if let Some(host) = &trusted.speaks_for
        && host != from
    {
        return Err(AuthError::WrongIdentity {
            key: kid.to_string(),
            bound: host.clone(),
            from: from.chars().take(64).collect(),
        });
    }
    Ok(trusted.role)
}

/// Time checks: `expires` and the accepted skew around the receiver's clock.
#[derive(Debug, Clone, Copy)]
pub struct TimePolicy {
    /// Messages whose `ts` is further than this from `now`, either way, are refused.
    pub window: Duration,
}

impl Default for TimePolicy {
    fn default() -> Self {
        TimePolicy {
            window: Duration::minutes(5),
        }
    }
}

impl TimePolicy {
    /// Checks `expires` and `ts` against `now`.
    pub fn check(&self, env: &Envelope, now: DateTime<Utc>) -> Result<(), AuthError> {
        self.check_times(env.ts, env.expires, now)
    }

    /// [`TimePolicy::check`] on the two header fields.
    pub fn check_times(
        &self,
        ts: DateTime<Utc>,
        expires: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<(), AuthError> {
        if let Some(exp) = expires
            && exp <= now
        {
            return Err(AuthError::Expired(format_ts(exp)));
        }
        if (now - ts).abs() > self.window {
            return Err(AuthError::Stale {
                ts: format_ts(ts),
                window_secs: self.window.num_seconds(),
            });
        }
        Ok(())
    }
}

/// Signature, role and time checks in one call; replay is checked separately
/// (see [`crate::replay::ReplayGuard`]) because a receiver must persist it.
pub fn authenticate(
    keyring: &Keyring,
    time: &TimePolicy,
    d: &Decoded,
    now: DateTime<Utc>,
) -> Result<Role, AuthError> {
    let role = keyring.verify_signature(d)?;
    time.check(&d.envelope, now)?;
    Ok(role)
}

/// Whether `kind` must be authenticated at all: every kind of v1 must.
pub fn requires_signature(_kind: Kind) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Activate, Deactivate, Ping};
    use ed25519_dalek::pkcs8::EncodePrivateKey;

    fn ring(k: &KeyPair, role: Role) -> Keyring {
        let mut r = Keyring::new();
        r.add(k.public(), role, "test");
        r
    }

    #[test]
    fn signs_and_verifies() {
        let k = KeyPair::from_seed(&[7; 32]);
        let bytes = k.seal(Envelope::new("broker", Deactivate::default()));
        let d = Envelope::decode(&bytes).unwrap();
        assert_eq!(
            ring(&k, Role::Broker).verify_signature(&d),
            Ok(Role::Broker)
        );
    }

    #[test]
    fn private_pem_is_pkcs8_v1_and_both_versions_are_read() {
        let k = KeyPair::from_seed(&[9; 32]);
        let pem = k.to_pem();
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = B64.decode(b64).unwrap();
        assert_eq!(der.len(), 48);
        assert_eq!(&der[..16], &PKCS8_V1_PREFIX);
        // The v2 form (with the public key) that earlier versions wrote.
        let v2 = k.key.to_pkcs8_pem(Default::default()).unwrap().to_string();
        assert_ne!(v2, pem);
        assert_eq!(KeyPair::from_pem(&v2).unwrap().id(), k.id());
        assert_eq!(KeyPair::from_pem(&pem).unwrap().id(), k.id());
    }

    #[test]
    fn pem_round_trip_keeps_key_id() {
        let k = KeyPair::generate().unwrap();
        let k2 = KeyPair::from_pem(&k.to_pem()).unwrap();
        assert_eq!(k.id(), k2.id());
        let p = public_from_pem(&k.public_pem()).unwrap();
        assert_eq!(key_id(&p), k.id());
        assert!(KeyPair::from_pem("-----BEGIN NONSENSE-----").is_err());
    }

    #[test]
    fn forged_altered_unknown_and_wrong_role_are_refused() {
        let broker = KeyPair::from_seed(&[1; 32]);
        let rogue = KeyPair::from_seed(&[2; 32]);
        let r = ring(&broker, Role::Broker);

        // Signed by an unknown key.
        let d =
            Envelope::decode(&rogue.seal(Envelope::new("broker", Deactivate::default()))).unwrap();
        assert!(matches!(
            r.verify_signature(&d),
            Err(AuthError::UnknownKey(_))
        ));

        // Signed, then altered in transit.
        let bytes = broker.seal(Envelope::new("broker", Deactivate::default()));
        let text = String::from_utf8(bytes)
            .unwrap()
            .replace("cmd.deactivate", "cmd.activate");
        let d = Envelope::decode(text.as_bytes()).unwrap();
        assert_eq!(d.envelope.msg, Activate::default().into());
        assert_eq!(r.verify_signature(&d), Err(AuthError::BadSignature));

        // A node key may not send commands.
        let rn = ring(&broker, Role::Node);
        let d = Envelope::decode(&broker.seal(Envelope::new("x", Ping {}))).unwrap();
        assert!(matches!(
            rn.verify_signature(&d),
            Err(AuthError::WrongRole { .. })
        ));

        // Unsigned.
        let d = Envelope::decode(&Envelope::new("broker", Ping {}).encode()).unwrap();
        assert_eq!(r.verify_signature(&d), Err(AuthError::Unsigned));
    }

    #[test]
    fn expiry_and_skew() {
        let now = Utc::now();
        let p = TimePolicy::default();
        let e = Envelope::new_at("b", Ping {}, now).with_ttl(std::time::Duration::from_secs(10));
        assert!(p.check(&e, now).is_ok());
        assert!(matches!(
            p.check(&e, now + Duration::seconds(11)),
            Err(AuthError::Expired(_))
        ));
        let old = Envelope::new_at("b", Ping {}, now - Duration::minutes(10));
        assert!(matches!(p.check(&old, now), Err(AuthError::Stale { .. })));
    }
}
