//! Message bodies of protocol v1, one module per family, and [`Message`], the
//! typed union that an [`Envelope`](crate::Envelope) carries.
//!
//! Every body is a plain JSON object. Receivers ignore fields they do not know,
//! so a later minor revision may add optional fields without breaking v1 peers.

mod admin;
mod command;
mod decision;
mod enroll;
mod event;
pub mod fence;
mod lead;
mod placement;
mod report;

pub use admin::*;
pub use command::*;
pub use decision::*;
pub use enroll::*;
pub use event::*;
pub use fence::STALE_EPOCH;
pub use lead::*;
pub use placement::*;
pub use report::*;

use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::error::ProtoError;

/// Who may send a message of some kind; checked against the role of the key that signed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The broker agent: signs commands, decisions, explanations and replies.
    Broker,
    /// A node agent: signs reports, events and pongs.
    Node,
    /// A human operator's CLI (`gearshift-broker status|evacuate|...`).
    Operator,
    /// A third-party client such as the PaaS broker asking for placement.
    Client,
}

impl Role {
    /// The lowercase name used in key files and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Broker => "broker",
            Role::Node => "node",
            Role::Operator => "operator",
            Role::Client => "client",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "broker" => Ok(Role::Broker),
            "node" => Ok(Role::Node),
            "operator" => Ok(Role::Operator),
            "client" => Ok(Role::Client),
            other => Err(format!(
                "unknown role {other:?} (expected broker, node, operator or client)"
            )),
        }
    }
}

macro_rules! kinds {
    ($( $(#[$doc:meta])* $variant:ident($body:ty) = $name:literal, roles [$($role:ident),+] ;)+) => {
        /// The `kind` field: which body the envelope carries.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kind {
            $( $(#[$doc])* $variant, )+
        }

        impl Kind {
            /// Every kind of protocol v1.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant),+];

            /// The wire name, for example `cmd.evacuate`.
            pub fn as_str(self) -> &'static str {
                match self { $(Kind::$variant => $name,)+ }
            }

            /// Parses a wire name.
            pub fn parse(s: &str) -> Result<Kind, ProtoError> {
                match s {
                    $($name => Ok(Kind::$variant),)+
                    other => Err(ProtoError::UnknownKind(other.chars().take(64).collect())),
                }
            }

            /// The roles whose keys may sign a message of this kind.
            pub fn allowed_roles(self) -> &'static [Role] {
                match self { $(Kind::$variant => &[$(Role::$role),+],)+ }
            }
        }

        /// A typed message: a kind and its body.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Message {
            $( $(#[$doc])* $variant($body), )+
        }

        impl Message {
            /// The kind of this message.
            pub fn kind(&self) -> Kind {
                match self { $(Message::$variant(_) => Kind::$variant,)+ }
            }

            /// The body as a JSON value.
            pub fn body_value(&self) -> Value {
                match self { $(Message::$variant(b) => to_value(b),)+ }
            }

            /// The body as compact JSON text, written straight from the typed
            /// body (no tree in between; keys in declaration order, so this is
            /// not the signed canonical form).
            pub fn body_json(&self) -> String {
                match self { $(Message::$variant(b) => to_json(b),)+ }
            }

            /// Builds a typed message from a kind and a JSON body.
            pub fn from_parts(kind: Kind, body: Value) -> Result<Message, ProtoError> {
                match kind { $(Kind::$variant => from_value::<$body>(kind, body).map(Message::$variant),)+ }
            }
        }

        $(
            impl From<$body> for Message {
                fn from(b: $body) -> Message { Message::$variant(b) }
            }
        )+
    };
}

kinds! {
    /// `report`: a node's capacity report.
    Report(NodeReport) = "report", roles [Node];
    /// `cmd.deactivate`: stop placing gears on the node.
    Deactivate(Deactivate) = "cmd.deactivate", roles [Broker, Operator];
    /// `cmd.activate`: accept gears again.
    Activate(Activate) = "cmd.activate", roles [Broker, Operator];
    /// `cmd.evacuate`: move a list of gears to their targets.
    Evacuate(Evacuate) = "cmd.evacuate", roles [Broker, Operator];
    /// `cmd.remove`: run the node's configured removal action, then stop.
    Remove(Remove) = "cmd.remove", roles [Broker, Operator];
    /// `cmd.ping`: answer with a `pong` (directed or broadcast on `ping`).
    Ping(Ping) = "cmd.ping", roles [Broker, Operator, Client];
    /// `cmd.heat_signal`: send a Heat signal with the node's own credentials.
    HeatSignal(HeatSignal) = "cmd.heat_signal", roles [Broker, Operator];
    /// `cmd.inventory`: list the node's gears.
    Inventory(InventoryRequest) = "cmd.inventory", roles [Broker, Operator];
    /// `event.ack`: a command was accepted and its effect is being applied.
    Ack(Ack) = "event.ack", roles [Node];
    /// `event.progress`: evacuation progress after a gear finished.
    Progress(Progress) = "event.progress", roles [Node];
    /// `event.done`: a command finished successfully.
    Done(Done) = "event.done", roles [Node];
    /// `event.failed`: a command failed.
    Failed(Failed) = "event.failed", roles [Node];
    /// `event.refused`: a command was refused before anything happened.
    Refused(Refused) = "event.refused", roles [Node];
    /// `pong`: answer to `cmd.ping`.
    Pong(Pong) = "pong", roles [Node, Broker];
    /// `decision`: a decision of the broker agent.
    Decision(Decision) = "decision", roles [Broker];
    /// `explain`: why an evaluation did or did not scale a node group.
    Explain(Explanation) = "explain", roles [Broker];
    /// `placement.request`: where should a new gear go?
    PlacementRequest(PlacementRequest) = "placement.request", roles [Client, Operator, Broker];
    /// `placement.reply`: the chosen node, or a refusal with its reason.
    PlacementReply(PlacementReply) = "placement.reply", roles [Broker];
    /// `admin.request`: an operator command to the broker agent.
    AdminRequest(AdminRequest) = "admin.request", roles [Operator, Broker];
    /// `admin.reply`: the broker agent's answer to an operator command.
    AdminReply(AdminReply) = "admin.reply", roles [Broker];
    /// `lead.token`: a broker agent's candidacy for leadership.
    LeadToken(LeadToken) = "lead.token", roles [Broker];
    /// `leader`: the leading broker agent's announcement.
    Leader(LeaderAnnouncement) = "leader", roles [Broker];
    /// `journal.snapshot`: the leader's journal, replicated to standbys.
    JournalSnapshot(JournalSnapshot) = "journal.snapshot", roles [Broker];
    /// `enroll.token`: what an enrollment token allows (a statement carried
    /// inside `enroll.request`, never sent alone).
    EnrollToken(EnrollToken) = "enroll.token", roles [Operator, Broker];
    /// `enroll.request`: a node asks the broker agent to trust its new key.
    EnrollRequest(EnrollRequest) = "enroll.request", roles [Node];
    /// `enroll.reply`: the broker agent's answer to an `enroll.request`.
    EnrollReply(EnrollReply) = "enroll.reply", roles [Broker];
}

impl Kind {
    /// True for the commands a broker agent sends to one node (`cmd.*`).
    pub fn is_command(self) -> bool {
        self.as_str().starts_with("cmd.")
    }

    /// True for the events a node publishes about its commands (`event.*`).
    pub fn is_node_event(self) -> bool {
        self.as_str().starts_with("event.")
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn to_value<T: Serialize>(b: &T) -> Value {
    // Bodies are plain data (strings, integers, finite floats, maps with string
    // keys), for which serde_json serialization cannot fail.
    serde_json::to_value(b).unwrap_or(Value::Null)
}

fn to_json<T: Serialize>(b: &T) -> String {
    // As `to_value`: plain data, so serialization cannot fail.
    serde_json::to_string(b).unwrap_or_else(|_| "null".into())
}

fn from_value<T: DeserializeOwned + Serialize + Validate>(
    kind: Kind,
    body: Value,
) -> Result<T, ProtoError> {
    let refuse = |reason: String| ProtoError::Body {
        kind: kind.as_str().to_string(),
        reason,
    };
    if !body.is_object() {
        return Err(refuse("the body is not a JSON object".into()));
    }
    let b = T::deserialize(&body).map_err(|e| refuse(e.to_string()))?;
    // serde also accepts a struct written as a JSON array of its fields (its
    // "sequence form"); the protocol does not: every struct is an object.
    // Only a body with an array can hold one (most reports have none).
    if has_array(&body)
        && let Some(path) = array_for_object(&body, &to_value(&b), &mut String::new())
    {
        return Err(refuse(format!(
            "{path} is a JSON array where an object is expected"
        )));
    }
    b.validate().map_err(refuse)?;
    Ok(b)
}

/// Whether `v` holds an array anywhere.
fn has_array(v: &Value) -> bool {
    match v {
        Value::Array(_) => true,
        Value::Object(m) => m.values().any(has_array),
        _ => false,
    }
}

/// Where `input` holds an array at a place where the typed value (`typed`,
/// the body serialized back) holds an object: the path of the first such
/// place, or `None`.
fn array_for_object(input: &Value, typed: &Value, path: &mut String) -> Option<String> {
    match (input, typed) {
        (Value::Array(_), Value::Object(_)) => Some(if path.is_empty() {
            "body".to_string()
        } else {
            format!("body{path}")
        }),
        (Value::Object(i), Value::Object(t)) => i.iter().find_map(|(k, iv)| {
            let tv = t.get(k)?;
            let len = path.len();
            path.push('.');
            path.push_str(k);
            let found = array_for_object(iv, tv, path);
            path.truncate(len);
            found
        }),
        (Value::Array(i), Value::Array(t)) => {
            i.iter().zip(t).enumerate().find_map(|(n, (iv, tv))| {
                let len = path.len();
                path.push_str(&format!("[{n}]"));
                let found = array_for_object(iv, tv, path);
                path.truncate(len);
                found
            })
        }
        _ => None,
    }
}

/// Bounds every body checks after decoding, beyond what its type expresses.
pub trait Validate {
    /// Returns a human-readable reason when the body is out of bounds.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Longest node, gear, district or profile name accepted (bytes).
pub const MAX_NAME: usize = 255;
/// Most moves one `cmd.evacuate` may carry.
pub const MAX_MOVES: usize = 20_000;
/// Most entries in any other list of a body (gears, nodes, results).
pub const MAX_LIST: usize = 100_000;
/// Longest free-text field (reasons, errors, details), in bytes.
pub const MAX_TEXT: usize = 16 * 1024;

/// Checks a name field (node, district, profile): 1..=[`MAX_NAME`] bytes, no
/// control characters; the error names `field`.
pub fn check_name(field: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{field} is empty"));
    }
    if s.len() > MAX_NAME {
        return Err(format!(
            "{field} is {} bytes long (limit {MAX_NAME})",
            s.len()
        ));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(format!("{field} contains control characters"));
    }
    Ok(())
}

pub(crate) fn check_opt_name(field: &str, s: &Option<String>) -> Result<(), String> {
    match s {
        Some(s) => check_name(field, s),
        None => Ok(()),
    }
}

pub(crate) fn check_text(field: &str, s: &str) -> Result<(), String> {
    if s.len() > MAX_TEXT {
        return Err(format!(
            "{field} is {} bytes long (limit {MAX_TEXT})",
            s.len()
        ));
    }
    Ok(())
}

pub(crate) fn check_len<T>(field: &str, v: &[T], max: usize) -> Result<(), String> {
    if v.len() > max {
        return Err(format!("{field} has {} entries (limit {max})", v.len()));
    }
    Ok(())
}
