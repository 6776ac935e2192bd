//! The leader epoch: stamped on every command and decision the core emits,
//! and what a node's `stale_epoch` refusal means.
//!
//! Whoever decides leadership (the agent's election) calls
//! [`Core::set_epoch`] at takeover; from then on every command, decision and
//! create/remove request carries it ([`Action::stamped`]). The epoch lives
//! in the journal's meta record, so a restarted agent never stamps a lower
//! one. A node that has seen a newer epoch refuses our commands with
//! `stale_epoch`: [`Core::on_event`] turns that into
//! [`Action::StaleEpoch`] for the agent to act on (step down), and leaves
//! the operation alone: the leader that fenced us carries it on.

use gearshift_proto::msg::{Refused, STALE_EPOCH};

use super::Core;
use super::actions::{Action, StaleEpoch};

impl Core {
    /// The leader epoch stamped on what the core emits (0: never set, a
    /// single agent without high availability).
    pub fn epoch(&self) -> u64 {
        self.meta.epoch
    }

    /// Stamps `epoch` on every command, decision and create/remove request
    /// emitted from now on. Epochs only rise: a lower one is ignored (and
    /// logged). Returns the epoch in force. The change is journaled with
    /// the next [`Core::take_changes`], before anything stamped with it
    /// goes out.
    pub fn set_epoch(&mut self, epoch: u64) -> u64 {
        if epoch < self.meta.epoch {
            tracing::warn!(
                epoch,
                current = self.meta.epoch,
                "a lower leader epoch was asked for: kept the current one"
            );
        } else if epoch > self.meta.epoch {
            tracing::info!(epoch, previous = self.meta.epoch, "leader epoch raised");
            self.meta.epoch = epoch;
            self.changes.meta = true;
        }
        self.meta.epoch
    }

    /// A node's `event.refused` of reason `stale_epoch` (any other refusal:
    /// `None`, for the operation's machine to read).
    pub(crate) fn stale_epoch(&self, from: &str, r: &Refused) -> Option<Action> {
        if r.reason != STALE_EPOCH {
            return None;
        }
        tracing::warn!(
            node = from,
            ours = self.meta.epoch,
            theirs = ?r.epoch,
            detail = %r.detail,
            "a node refused our command as from a deposed leader"
        );
        Some(Action::StaleEpoch(StaleEpoch {
            node: from.to_string(),
            cmd: r.cmd,
            ours: self.meta.epoch,
            theirs: r.epoch,
            detail: r.detail.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use gearshift_proto::msg::{Refused, STALE_EPOCH};

    use crate::core::testkit::*;

    /// Every epoch-carrying thing in `a`: (what, epoch).
    fn stamps(a: &[Action]) -> Vec<(String, u64)> {
        a.iter()
            .filter_map(|x| match x {
                Action::Send { msg, .. } => Some((msg.kind().to_string(), msg.epoch()?)),
                Action::Decide(d) => Some((format!("decision.{}", d.decision.as_str()), d.epoch)),
                Action::Call {
                    call: HandlerCall::Create(r),
                    ..
                } => Some(("create".into(), r.epoch)),
                Action::Call {
                    call: HandlerCall::Remove(r),
                    ..
                } => Some(("remove".into(), r.epoch)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn commands_decisions_and_requests_carry_the_set_epoch() {
        let mut h = H::new(cfg_with(short_windows));
        assert_eq!(h.core.set_epoch(5), 5);
        // A scale-down to its removal request.
        drain_to_removal(&mut h, 3);
        // A scale-up to its create request, in another district.
        h.report(rep("x", "d2", "small", 100, 95, 0));
        let (up, a) = h
            .core
            .start_scale_up(&g("d2", "small"), "test".into(), h.now);
        h.out.extend(a);
        let tag = CallTag::Op { op: up, seq: 1 };
        let a = h
            .core
            .on_handler_result(tag, CallResult::Capacity(Ok(Capacity::unknown())), h.now);
        h.out.extend(a);
        let seen = stamps(&h.out);
        let has = |what: &str| seen.iter().any(|(w, _)| w == what);
        for what in [
            "cmd.deactivate",
            "cmd.evacuate",
            "decision.scale_down",
            "decision.scale_up",
            "remove",
            "create",
        ] {
            assert!(has(what), "no {what} in {seen:?}");
        }
        assert!(seen.iter().all(|(_, e)| *e == 5), "{seen:?}");
    }

    #[test]
    fn without_an_epoch_decisions_and_commands_are_as_before() {
        let mut h = H::new(cfg_with(short_windows));
        start_drain(&mut h);
        let seen = stamps(&h.out);
        assert!(!seen.is_empty() && seen.iter().all(|(_, e)| *e == 0));
        let body = h
            .out
            .iter()
            .find_map(|a| match a {
                Action::Send { msg, .. } => Some(msg.body_value()),
                _ => None,
            })
            .unwrap();
        assert!(body.get("epoch").is_none(), "{body}");
    }

    #[test]
    fn an_operators_activate_carries_the_epoch() {
        let mut h = H::new(cfg_with(short_windows));
        let mut r = rep("c", "d1", "small", 100, 0, 0);
        r.active = false;
        h.report(r);
        h.core.set_epoch(8);
        let none = std::collections::BTreeMap::new();
        let req = gearshift_proto::msg::AdminRequest::Activate { node: "c".into() };
        let (reply, acts) = h.core.on_operator("alice", req, "broker-1", &none, h.now);
        assert!(reply.ok, "{}", reply.message);
        assert_eq!(stamps(&acts), vec![("cmd.activate".to_string(), 8)]);
    }

    #[test]
    fn the_epoch_only_rises_and_survives_a_restart() {
        let mut h = H::new(cfg_with(|_| {}));
        assert_eq!(h.core.epoch(), 0);
        h.core.set_epoch(5);
        assert!(h.core.take_changes().meta, "journaled with the next commit");
        assert_eq!(h.core.set_epoch(3), 5, "never lowered");
        assert!(!h.core.take_changes().meta);
        // Through the real journal file.
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::journal::Journal::open(dir.path()).unwrap();
        h.core.set_epoch(6);
        let ch = h.core.take_changes();
        journal.commit(&h.core, &ch).unwrap();
        drop(journal);
        let restored = crate::journal::Journal::open(dir.path())
            .unwrap()
            .load()
            .unwrap();
        let mut h2 = H::new(cfg_with(|_| {}));
        h2.core.restore(restored);
        assert_eq!(h2.core.epoch(), 6);
    }

    #[test]
    fn a_stale_epoch_refusal_goes_to_the_agent_not_to_the_saga() {
        let mut h = H::new(cfg_with(short_windows));
        h.core.set_epoch(4);
        let (op, cmd) = start_drain(&mut h);
        let _ = h.core.take_changes();
        let before = down(&h, &op);
        let refused = Message::Refused(Refused {
            cmd: Some(cmd),
            reason: STALE_EPOCH.into(),
            detail: "cmd.deactivate of leader epoch 4: this node has seen epoch 6".into(),
            epoch: Some(6),
        });
        let a = h.core.on_event("c", Some(op.as_str()), &refused, h.now);
        let [Action::StaleEpoch(s)] = &a[..] else {
            panic!("{a:?}")
        };
        assert_eq!(
            (s.node.as_str(), s.cmd, s.ours, s.theirs),
            ("c", Some(cmd), 4, Some(6))
        );
        assert_eq!(down(&h, &op), before, "the saga is left as it was");
        assert!(h.core.take_changes().is_empty(), "nothing to journal");
        // The node's summary of answers held back names no command and no operation.
        let summary = Message::Refused(Refused {
            cmd: None,
            reason: STALE_EPOCH.into(),
            detail: "12 refused since …".into(),
            epoch: None,
        });
        let a = h.core.on_event("c", None, &summary, h.now);
        assert!(matches!(&a[..], [Action::StaleEpoch(s)] if s.cmd.is_none() && s.theirs.is_none()));
        // Any other refusal is still the saga's.
        let other = Message::Refused(Refused {
            cmd: Some(cmd),
            reason: "bad_signature".into(),
            detail: "x".into(),
            epoch: None,
        });
        h.core.on_event("c", Some(op.as_str()), &other, h.now);
        assert_ne!(down(&h, &op), before);
    }
}
