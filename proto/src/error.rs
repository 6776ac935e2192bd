//! Errors of the wire protocol layer.

use thiserror::Error;

/// Everything that can be wrong with bytes that claim to be a gearshift message.
///
/// Each variant names one reason, so that a receiver can log it and count it
/// by reason (`refused messages by reason`) without string matching.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The message is larger than [`crate::envelope::MAX_MESSAGE_BYTES`].
    #[error("message too large: {size} bytes (limit {limit})")]
    TooLarge {
        /// Size of the offered message.
        size: usize,
        /// The limit it exceeded.
        limit: usize,
    },
    /// The bytes are not a JSON object of the envelope's shape.
    #[error("malformed envelope: {0}")]
    Malformed(String),
    /// `v` is not a protocol version this code speaks.
    #[error("unsupported protocol version {0} (this agent speaks 1)")]
    Version(u64),
    /// `kind` is not one of the kinds of protocol v1.
    #[error("unknown message kind {0:?}")]
    UnknownKind(String),
    /// The body does not match the shape its `kind` requires.
    #[error("invalid body for kind {kind}: {reason}")]
    Body {
        /// The message kind.
        kind: String,
        /// What is wrong with the body.
        reason: String,
    },
    /// A field is present but its value is not acceptable (too long, empty, ...).
    #[error("invalid field {field}: {reason}")]
    Field {
        /// The field name.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
}

/// Why a message that decoded correctly is nevertheless refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// `sig` is missing while the receiver requires a signature.
    #[error("message is not signed")]
    Unsigned,
    /// `sig` does not have the `alg:keyid:base64` form or uses an unknown algorithm.
    #[error("malformed signature: {0}")]
    MalformedSignature(String),
    /// The key id in `sig` is not in the receiver's keyring.
    #[error("unknown signing key {0:?}")]
    UnknownKey(String),
    /// The key is known, but its role may not send this kind of message.
    #[error("key {key:?} (role {role}) may not send {kind} messages")]
    WrongRole {
        /// Key id.
        key: String,
        /// Role of that key.
        role: String,
        /// Kind of the message.
        kind: String,
    },
    /// The key is bound to one sender and signed as another: a node key
    /// speaking for a node it was not enrolled for.
    #[error("key {key:?} is enrolled for {bound:?} and may not speak for {from:?}")]
    WrongIdentity {
        /// Key id.
        key: String,
        /// The sender the key is enrolled for.
        bound: String,
        /// The `from` it signed.
        from: String,
    },
    /// The signature does not verify: the message was altered or forged.
    #[error("bad signature (forged or altered message)")]
    BadSignature,
    /// `expires` lies in the past.
    #[error("message expired at {0}")]
    Expired(String),
    /// `ts` is outside the accepted window around the receiver's clock.
    #[error("timestamp {ts} outside the accepted window of {window_secs} s")]
    Stale {
        /// The message's `ts`.
        ts: String,
        /// The window in seconds.
        window_secs: i64,
    },
    /// The message id was already seen within the replay window.
    #[error("replayed message id {0}")]
    Replayed(String),
}

impl AuthError {
    /// A short stable label for metrics (`refused_total{reason=...}`).
    pub fn reason_label(&self) -> &'static str {
        match self {
            AuthError::Unsigned => "unsigned",
            AuthError::MalformedSignature(_) => "malformed_signature",
            AuthError::UnknownKey(_) => "unknown_key",
            AuthError::WrongRole { .. } => "wrong_role",
            AuthError::WrongIdentity { .. } => "identity",
            AuthError::BadSignature => "bad_signature",
            AuthError::Expired(_) => "expired",
            AuthError::Stale { .. } => "stale",
            AuthError::Replayed(_) => "replayed",
        }
    }
}

impl ProtoError {
    /// A short stable label for metrics (`refused_total{reason=...}`).
    pub fn reason_label(&self) -> &'static str {
        match self {
            ProtoError::TooLarge { .. } => "too_large",
            ProtoError::Malformed(_) => "malformed",
            ProtoError::Version(_) => "version",
            ProtoError::UnknownKind(_) => "unknown_kind",
            ProtoError::Body { .. } => "bad_body",
            ProtoError::Field { .. } => "bad_field",
        }
    }
}
