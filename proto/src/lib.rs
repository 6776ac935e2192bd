//! # gearshift-proto: the wire protocol, version 1
//!
//! Everything two gearshift agents (or a third-party client) must agree on,
//! and nothing else: no sockets, no files, no clocks except where a caller
//! passes `now`.
//!
//! ## Layout
//! - [`envelope`]: the JSON envelope (`v`, `id`, `kind`, `from`, `ts`,
//!   `expires`, `corr`, `body`, `sig`), its bounded decoder and encoder.
//! - [`msg`]: every message body, grouped by family (reports, commands,
//!   node events, decisions and explanations, placement, admin), and
//!   [`Message`], the typed union.
//! - [`canonical`]: the canonical JSON form that signatures cover.
//! - [`sign`]: Ed25519 keys (PEM), the [`Keyring`] of trusted keys with
//!   their roles, signature and time checks.
//! - [`replay`]: the replay window.
//! - [`gate`]: the one receiving chain (decode, kind, signature and role,
//!   time, replay) every receiver runs, returning the message or a
//!   [`gate::Refusal`] with its reason.
//! - [`enroll`]: enrollment tokens and the proof that a node holds the key
//!   it enrolls.
//! - [`routing`]: routing keys, queue names and the segment encoding.
//!
//! `docs/protocol.md` at the repository root is the specification a
//! third-party client follows; this crate is its reference implementation.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod batch;
pub mod canonical;
pub mod enroll;
pub mod envelope;
pub mod error;
pub mod gate;
pub mod msg;
pub mod replay;
pub mod routing;
pub mod sign;

pub use envelope::{Decoded, Envelope, RawEnvelope};
pub use error::{AuthError, ProtoError};
pub use gate::{Admitted, Expect, Gate, Refusal, Step};
pub use msg::{Kind, Message, Role};
pub use replay::ReplayGuard;
pub use sign::{KeyPair, Keyring, TimePolicy};
