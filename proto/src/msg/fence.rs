//! Epochs and fencing: which messages carry the leader's epoch, reading it
//! and stamping it.
//!
//! Of two or three broker agents, one leads; each takeover raises the
//! leader epoch (a `u64`). The leader stamps its epoch in the body of every
//! command that changes a node (`cmd.deactivate`, `cmd.activate`,
//! `cmd.evacuate`, `cmd.remove`, `cmd.heat_signal`, and `cmd.inventory`)
//! and of every `decision`. A node persists the newest epoch it has seen
//! and refuses a new command of an older one with `event.refused`, reason
//! [`STALE_EPOCH`]: a deposed leader that has not noticed cannot act.
//!
//! `epoch` is absent from the JSON when it is 0, and an absent `epoch`
//! reads as 0: a single broker agent without high availability, and every
//! client that predates epochs, keep the exact bytes they had. `cmd.ping`
//! carries none: it changes nothing, and clients send it too.

use super::Message;

/// `event.refused` reason of a command whose epoch is below the newest the
/// node has seen (the refused event's `epoch` names that newest one).
pub const STALE_EPOCH: &str = "stale_epoch";

/// serde's `skip_serializing_if` for epochs: 0 is not written.
pub(crate) fn is_zero(e: &u64) -> bool {
    *e == 0
}

impl Message {
    /// The leader epoch this message carries (0 when absent), or `None`
    /// for a kind that carries none (reports, events, pings, placement,
    /// admin, explanations).
    pub fn epoch(&self) -> Option<u64> {
        match self {
            Message::Deactivate(m) => Some(m.epoch),
            Message::Activate(m) => Some(m.epoch),
            Message::Evacuate(m) => Some(m.epoch),
            Message::Remove(m) => Some(m.epoch),
            Message::HeatSignal(m) => Some(m.epoch),
            Message::Inventory(m) => Some(m.epoch),
            Message::Decision(m) => Some(m.epoch),
            _ => None,
        }
    }

    /// Sets the epoch of a message that carries one; false (and nothing
    /// changed) for the other kinds.
    pub fn set_epoch(&mut self, epoch: u64) -> bool {
        let slot = match self {
            Message::Deactivate(m) => &mut m.epoch,
            Message::Activate(m) => &mut m.epoch,
            Message::Evacuate(m) => &mut m.epoch,
            Message::Remove(m) => &mut m.epoch,
            Message::HeatSignal(m) => &mut m.epoch,
            Message::Inventory(m) => &mut m.epoch,
            Message::Decision(m) => &mut m.epoch,
            _ => return false,
        };
        *slot = epoch;
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::msg::{
        Activate, Deactivate, Decision, DecisionKind, Evacuate, HeatAction, HeatSignal,
        InventoryRequest, Kind, Move, Ping, Refused, Remove,
    };
    use crate::{Envelope, KeyPair};

    fn fenced() -> Vec<Message> {
        vec![
            Deactivate::default().into(),
            Activate::default().into(),
            Evacuate {
                moves: vec![Move {
                    gear: "g1".into(),
                    target: "n2".into(),
                }],
                parallelism: None,
                deadline: None,
                watch: false,
                epoch: 0,
            }
            .into(),
            Remove::default().into(),
            HeatSignal {
                action: HeatAction::MarkUnhealthy,
                reason: String::new(),
                epoch: 0,
            }
            .into(),
            InventoryRequest::default().into(),
            Decision {
                decision: DecisionKind::ScaleUp,
                district: "d1".into(),
                profile: "small".into(),
                op: None,
                node: None,
                reason: "r".into(),
                handler: None,
                stats: None,
                dry_run: false,
                epoch: 0,
            }
            .into(),
        ]
    }

    /// Signs, encodes and decodes `m` as the broker would send it.
    fn round_trip(m: Message) -> (Message, serde_json::Value) {
        let k = KeyPair::generate().unwrap();
        let bytes = k.seal(Envelope::new("broker", m));
        let wire: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let d = Envelope::decode(&bytes).unwrap();
        (d.envelope.msg, wire["body"].clone())
    }

    #[test]
    fn a_present_epoch_round_trips_on_every_fenced_kind() {
        for mut m in fenced() {
            assert!(m.set_epoch(u64::MAX - 1), "{}", m.kind());
            let (back, body) = round_trip(m.clone());
            assert_eq!(back, m, "{}", m.kind());
            assert_eq!(back.epoch(), Some(u64::MAX - 1));
            assert_eq!(body["epoch"], json!(u64::MAX - 1), "{}", m.kind());
        }
    }

    #[test]
    fn epoch_zero_is_not_written_and_an_absent_one_reads_as_zero() {
        for m in fenced() {
            let (back, body) = round_trip(m.clone());
            assert!(body.get("epoch").is_none(), "{}: {body}", m.kind());
            assert_eq!(back.epoch(), Some(0), "{}", m.kind());
            // A body written before epochs existed, taken as it is.
            let old = Message::from_parts(m.kind(), body).unwrap();
            assert_eq!(old.epoch(), Some(0));
        }
    }

    #[test]
    fn a_malformed_epoch_is_a_bad_body() {
        for bad in [json!(-1), json!("5"), json!(1.5), json!(null)] {
            let body = json!({"reason": "x", "epoch": bad});
            assert!(
                Message::from_parts(Kind::Deactivate, body).is_err(),
                "epoch {bad} accepted"
            );
        }
    }

    #[test]
    fn kinds_without_an_epoch_are_left_alone() {
        let mut ping: Message = Ping {}.into();
        assert_eq!(ping.epoch(), None);
        assert!(!ping.set_epoch(3));
        let mut refused: Message = Refused {
            cmd: None,
            reason: STALE_EPOCH.into(),
            detail: "d".into(),
            epoch: Some(7),
        }
        .into();
        assert_eq!(
            refused.epoch(),
            None,
            "a refusal names an epoch, it is not stamped"
        );
        assert!(!refused.set_epoch(3));
        let (back, body) = round_trip(refused.clone());
        assert_eq!(back, refused);
        assert_eq!(body["epoch"], json!(7));
    }

    #[test]
    fn every_command_but_ping_is_fenced() {
        let kinds: Vec<Kind> = fenced().iter().map(Message::kind).collect();
        for k in Kind::ALL.iter().filter(|k| k.is_command()) {
            assert_eq!(kinds.contains(k), *k != Kind::Ping, "{k}");
        }
    }
}
