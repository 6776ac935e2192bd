//! The v1 envelope: every message on the bus is one JSON object of this shape.
//!
//! ```json
//! {"v":1,"id":"…uuid…","kind":"report","from":"node-1.example.com",
//!  "ts":"2026-11-22T10:00:00.000Z","expires":null,"corr":null,
//!  "body":{…},"sig":"ed25519:4f2a…:base64…"}
//! ```

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::canonical;
use crate::error::ProtoError;
use crate::msg::{Kind, Message};

/// The protocol version this crate speaks.
pub const VERSION: u64 = 1;
/// Largest encoded message accepted, in bytes (4 MiB: an evacuation of 20,000 gears fits).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Longest `from` accepted.
pub const MAX_FROM: usize = 255;
/// Longest `corr` accepted.
pub const MAX_CORR: usize = 128;
/// Longest `sig` accepted.
pub const MAX_SIG: usize = 512;

/// One message: header fields plus a typed body.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Unique message id; receivers use it for idempotence and replay detection.
    pub id: Uuid,
    /// The sender's identity (node host name, or the broker agent's name).
    pub from: String,
    /// When the message was created (UTC).
    pub ts: DateTime<Utc>,
    /// After this instant the message must not be acted upon.
    pub expires: Option<DateTime<Utc>>,
    /// Operation id that ties commands, events and decisions of one operation together.
    pub corr: Option<String>,
    /// The kind and body.
    pub msg: Message,
    /// `alg:keyid:base64` signature over [`Envelope::signing_bytes`].
    pub sig: Option<String>,
}

impl Envelope {
    /// A new unsigned envelope with a fresh id, created at `ts`.
    pub fn new_at(from: impl Into<String>, msg: impl Into<Message>, ts: DateTime<Utc>) -> Self {
        Envelope {
            id: Uuid::new_v4(),
            from: from.into(),
            ts: truncate_millis(ts),
            expires: None,
            corr: None,
            msg: msg.into(),
            sig: None,
        }
    }

    /// A new unsigned envelope with a fresh id, created now.
    pub fn new(from: impl Into<String>, msg: impl Into<Message>) -> Self {
        Self::new_at(from, msg, Utc::now())
    }

    /// Sets the operation id.
    pub fn with_corr(mut self, corr: impl Into<String>) -> Self {
        self.corr = Some(corr.into());
        self
    }

    /// Sets `expires` to `ts + ttl`.
    pub fn with_ttl(mut self, ttl: std::time::Duration) -> Self {
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(365));
        self.expires = Some(truncate_millis(self.ts + ttl));
        self
    }

    /// The kind of the body.
    pub fn kind(&self) -> Kind {
        self.msg.kind()
    }

    fn to_value(&self, with_sig: bool) -> Value {
        let mut m = Map::new();
        m.insert("v".into(), Value::from(VERSION));
        m.insert("id".into(), Value::String(self.id.to_string()));
        m.insert("kind".into(), Value::String(self.kind().as_str().into()));
        m.insert("from".into(), Value::String(self.from.clone()));
        m.insert("ts".into(), Value::String(format_ts(self.ts)));
        m.insert(
            "expires".into(),
            self.expires
                .map_or(Value::Null, |e| Value::String(format_ts(e))),
        );
        m.insert(
            "corr".into(),
            self.corr.clone().map_or(Value::Null, Value::String),
        );
        m.insert("body".into(), self.msg.body_value());
        if with_sig && let Some(sig) = &self.sig {
            m.insert("sig".into(), Value::String(sig.clone()));
        }
        Value::Object(m)
    }

    /// The bytes a signature covers: the canonical JSON of the envelope without `sig`.
    pub fn signing_bytes(&self) -> Vec<u8> {
        canonical::to_vec(&self.to_value(false))
    }

    /// The message as it goes on the wire (canonical JSON, `sig` included when set).
    pub fn encode(&self) -> Vec<u8> {
        canonical::to_vec(&self.to_value(true))
    }

    /// Decodes and validates a message; the result keeps the exact bytes its
    /// signature must cover so that verification does not re-encode the body.
    pub fn decode(bytes: &[u8]) -> Result<Decoded, ProtoError> {
        Self::decode_raw(bytes)?.typed()
    }

    /// Decodes and validates the header fields only, leaving the body as
    /// JSON: a receiver checks the signature (and so the sender's role)
    /// before it spends anything on the body ([`crate::gate`]).
    pub fn decode_raw(bytes: &[u8]) -> Result<RawEnvelope, ProtoError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(ProtoError::TooLarge {
                size: bytes.len(),
                limit: MAX_MESSAGE_BYTES,
            });
        }
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| ProtoError::Malformed(e.to_string()))?;
        let Value::Object(mut m) = value else {
            return Err(ProtoError::Malformed("not a JSON object".into()));
        };
        let v = m
            .get("v")
            .and_then(Value::as_u64)
            .ok_or_else(|| ProtoError::Malformed("missing or non-integer v".into()))?;
        if v != VERSION {
            return Err(ProtoError::Version(v));
        }
        let sig = match m.remove("sig") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.len() <= MAX_SIG => Some(s),
            Some(Value::String(_)) => {
                return Err(ProtoError::Field {
                    field: "sig",
                    reason: format!("longer than {MAX_SIG} bytes"),
                });
            }
            Some(_) => return Err(ProtoError::Malformed("sig is not a string".into())),
        };
        // The signed bytes are the canonical form of what we received minus `sig`.
        let mut signed = Vec::with_capacity(bytes.len());
        canonical::write_object(&m, &mut signed);

        let id = str_field(&m, "id")?;
        let id = Uuid::parse_str(id).map_err(|e| ProtoError::Field {
            field: "id",
            reason: e.to_string(),
        })?;
        let kind = Kind::parse(str_field(&m, "kind")?)?;
        let from = str_field(&m, "from")?.to_string();
        if from.is_empty() || from.len() > MAX_FROM || from.chars().any(char::is_control) {
            return Err(ProtoError::Field {
                field: "from",
                reason: format!("must be 1..={MAX_FROM} bytes without control characters"),
            });
        }
        let ts = parse_ts("ts", str_field(&m, "ts")?)?;
        let expires = match m.get("expires") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(parse_ts("expires", s)?),
            Some(_) => return Err(ProtoError::Malformed("expires is not a string".into())),
        };
        let corr = match m.get("corr") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_CORR => Some(s.clone()),
            Some(Value::String(_)) => {
                return Err(ProtoError::Field {
                    field: "corr",
                    reason: format!("must be 1..={MAX_CORR} bytes"),
                });
            }
            Some(_) => return Err(ProtoError::Malformed("corr is not a string".into())),
        };
        let body = m
            .remove("body")
            .ok_or_else(|| ProtoError::Malformed("missing body".into()))?;
        Ok(RawEnvelope {
            id,
            from,
            ts,
            expires,
            corr,
            kind,
            body,
            sig,
            signed,
        })
    }
}

/// An envelope whose header is decoded and checked and whose body is still
/// JSON ([`Envelope::decode_raw`]).
#[derive(Debug, Clone)]
pub struct RawEnvelope {
    /// See [`Envelope::id`].
    pub id: Uuid,
    /// See [`Envelope::from`].
    pub from: String,
    /// See [`Envelope::ts`].
    pub ts: DateTime<Utc>,
    /// See [`Envelope::expires`].
    pub expires: Option<DateTime<Utc>>,
    /// See [`Envelope::corr`].
    pub corr: Option<String>,
    /// The kind named by the header.
    pub kind: Kind,
    /// The body, not yet checked against its kind's shape.
    pub body: Value,
    /// See [`Envelope::sig`].
    pub sig: Option<String>,
    /// Canonical bytes of the received envelope without `sig`.
    pub signed: Vec<u8>,
}

impl RawEnvelope {
    /// The header alone (the body replaced by `null`), for a refusal that
    /// must name the message after its body was consumed.
    pub fn clone_header(&self) -> RawEnvelope {
        RawEnvelope {
            id: self.id,
            from: self.from.clone(),
            ts: self.ts,
            expires: self.expires,
            corr: self.corr.clone(),
            kind: self.kind,
            body: Value::Null,
            sig: None,
            signed: Vec::new(),
        }
    }

    /// Checks the body against its kind's shape and bounds.
    pub fn typed(self) -> Result<Decoded, ProtoError> {
        let msg = Message::from_parts(self.kind, self.body)?;
        Ok(Decoded {
            envelope: Envelope {
                id: self.id,
                from: self.from,
                ts: self.ts,
                expires: self.expires,
                corr: self.corr,
                msg,
                sig: self.sig,
            },
            signed: self.signed,
        })
    }
}

/// A decoded message and the bytes its signature covers.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The message.
    pub envelope: Envelope,
    /// Canonical bytes of the received envelope without `sig`.
    pub signed: Vec<u8>,
}

fn str_field<'a>(m: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, ProtoError> {
    m.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ProtoError::Malformed(format!("missing or non-string {field}")))
}

fn parse_ts(field: &'static str, s: &str) -> Result<DateTime<Utc>, ProtoError> {
    // The wire carries milliseconds: finer digits are dropped so that a
    // decoded envelope encodes and decodes to itself (found by fuzzing).
    DateTime::parse_from_rfc3339(s)
        .map(|t| truncate_millis(t.with_timezone(&Utc)))
        .map_err(|e| ProtoError::Field {
            field,
            reason: format!("{s:?} is not RFC 3339: {e}"),
        })
}

/// Formats a timestamp as the wire does: RFC 3339, UTC, milliseconds, `Z`.
pub fn format_ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn truncate_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    let ms = t.timestamp_millis();
    DateTime::from_timestamp_millis(ms).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Deactivate, Evacuate, Move};

    #[test]
    fn encode_decode_round_trip() {
        let e = Envelope::new(
            "broker",
            Evacuate {
                moves: vec![Move {
                    gear: "g1".into(),
                    target: "node-2".into(),
                }],
                parallelism: Some(4),
                deadline: None,
                watch: false,
                epoch: 0,
            },
        )
        .with_corr("op-1")
        .with_ttl(std::time::Duration::from_secs(60));
        let bytes = e.encode();
        let d = Envelope::decode(&bytes).unwrap();
        assert_eq!(d.envelope, e);
        assert_eq!(d.signed, e.signing_bytes());
    }

    #[test]
    fn rejects_wrong_version_unknown_kind_and_bad_body() {
        let e = Envelope::new("b", Deactivate::default());
        let mut v: Value = serde_json::from_slice(&e.encode()).unwrap();
        v["v"] = Value::from(2);
        assert_eq!(
            Envelope::decode(v.to_string().as_bytes()).unwrap_err(),
            ProtoError::Version(2)
        );
        v["v"] = Value::from(1);
        v["kind"] = Value::from("cmd.selfdestruct");
        assert!(matches!(
            Envelope::decode(v.to_string().as_bytes()).unwrap_err(),
            ProtoError::UnknownKind(_)
        ));
        v["kind"] = Value::from("cmd.evacuate");
        assert!(matches!(
            Envelope::decode(v.to_string().as_bytes()).unwrap_err(),
            ProtoError::Body { .. }
        ));
    }

    #[test]
    fn bodies_and_nested_structs_must_be_objects() {
        let e = Envelope::new(
            "b",
            Evacuate {
                moves: vec![Move {
                    gear: "g".into(),
                    target: "a".into(),
                }],
                parallelism: None,
                deadline: None,
                watch: false,
                epoch: 0,
            },
        );
        let good: Value = serde_json::from_slice(&e.encode()).unwrap();
        let body_error = |v: &Value| match Envelope::decode(v.to_string().as_bytes()) {
            Err(ProtoError::Body { reason, .. }) => reason,
            other => panic!("expected a body error, got {other:?}"),
        };
        // The body as the sequence form of its struct.
        let mut v = good.clone();
        v["kind"] = Value::from("cmd.deactivate");
        v["body"] = serde_json::json!(["reason"]);
        assert!(body_error(&v).contains("not a JSON object"));
        // A nested struct (one move) as an array.
        let mut v = good.clone();
        v["body"]["moves"][0] = serde_json::json!(["g", "a"]);
        assert_eq!(
            body_error(&v),
            "body.moves[0] is a JSON array where an object is expected"
        );
        assert!(Envelope::decode(good.to_string().as_bytes()).is_ok());
    }

    #[test]
    fn rejects_oversized_and_garbage() {
        let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            Envelope::decode(&big),
            Err(ProtoError::TooLarge { .. })
        ));
        assert!(matches!(
            Envelope::decode(b"[1,2]"),
            Err(ProtoError::Malformed(_))
        ));
        assert!(matches!(
            Envelope::decode(b"\xff\xfe"),
            Err(ProtoError::Malformed(_))
        ));
    }

    #[test]
    fn duplicate_gears_in_evacuate_are_refused() {
        let e = Envelope::new(
            "b",
            Evacuate {
                moves: vec![
                    Move {
                        gear: "g".into(),
                        target: "a".into(),
                    },
                    Move {
                        gear: "g".into(),
                        target: "b".into(),
                    },
                ],
                parallelism: None,
                deadline: None,
                watch: false,
                epoch: 0,
            },
        );
        assert!(matches!(
            Envelope::decode(&e.encode()),
            Err(ProtoError::Body { .. })
        ));
    }
}
