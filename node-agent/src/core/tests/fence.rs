//! Leader epochs: older refused, newer persisted first, equal and absent as before.

use gearshift_proto::msg::{
    Activate, Deactivate, InventoryRequest, Kind, Message, Ping, Refused, STALE_EPOCH,
};

use super::*;

fn deactivate(epoch: u64) -> Deactivate {
    Deactivate {
        reason: "drain".into(),
        epoch,
    }
}

fn activate(epoch: u64) -> Activate {
    Activate {
        reason: "abort".into(),
        epoch,
    }
}

fn refusal(w: &World, id: Uuid) -> Refused {
    match w.outcome(id) {
        Some(Message::Refused(r)) => r.clone(),
        other => panic!("expected event.refused, got {other:?}"),
    }
}

fn persists_epoch(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::PersistEpoch(_)))
}

#[test]
fn a_command_of_an_older_epoch_is_refused_and_not_acted_upon() {
    let mut w = World::new();
    let newer = w.send(deactivate(5), Some("op-new"));
    assert!(matches!(w.outcome(newer), Some(Message::Done(_))));
    assert!(!w.core.active() && !w.disk_active, "epoch 5 acted upon");

    let env = w.cmd(activate(4), Some("op-old"));
    let actions = w.deliver(env.clone(), false);
    let r = refusal(&w, env.id);
    assert_eq!(r.reason, STALE_EPOCH);
    assert_eq!(r.epoch, Some(5), "names the newest epoch seen");
    assert!(
        r.detail.contains("epoch 4") && r.detail.contains("epoch 5"),
        "names both epochs: {}",
        r.detail
    );
    assert!(!w.core.active() && !w.disk_active, "still deactivated");
    assert!(!w.journal.contains_key(&env.id), "never journaled");
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::PersistActive { .. } | Action::RuntimeActive(_))),
        "{actions:?}"
    );
    assert!(
        actions.iter().any(|a| matches!(a, Action::Refused { refusal, broadcast: false } if refusal.reason == STALE_EPOCH)),
        "counted in the node's metrics by reason"
    );
    assert_eq!(w.counted("cmd.activate", "refused"), 1);
    assert!(
        matches!(
            actions.last(),
            Some(Action::Ack {
                journaled: None,
                ..
            })
        ),
        "acknowledged away: it will never succeed"
    );
    assert_eq!((w.core.epoch(), w.disk_epoch), (5, 5), "unchanged");
}

#[test]
fn a_newer_epoch_is_persisted_before_the_command_is_journaled() {
    let mut w = World::new();
    let env = w.cmd(deactivate(3), Some("op"));
    let c = w.command(Ok(env.clone()), false);
    assert!(
        matches!(w.step(Input::Command(c))[..], [Action::PersistEpoch(3)]),
        "the epoch first, nothing else"
    );
    assert_eq!(w.core.epoch(), 0, "not yet durable");
    let next = w.step(Input::EpochPersisted(Ok(())));
    assert!(
        matches!(&next[..], [Action::JournalBegin(e)] if e.id == env.id),
        "{next:?}"
    );
    assert_eq!(w.core.epoch(), 3);
}

#[test]
fn the_persisted_epoch_survives_a_restart() {
    let mut w = World::new();
    w.send(deactivate(7), None);
    assert_eq!(w.disk_epoch, 7);
    w.restart();
    assert_eq!(w.core.epoch(), 7, "read back from the state file");
    let id = w.send(activate(6), None);
    assert_eq!(refusal(&w, id).reason, STALE_EPOCH);
    assert!(!w.core.active(), "a deposed leader's activate did nothing");
    let id = w.send(activate(7), None);
    assert!(matches!(w.outcome(id), Some(Message::Done(_))));
    assert!(w.core.active());
}

#[test]
fn an_equal_epoch_is_accepted_without_persisting_it_again() {
    let mut w = World::new();
    w.send(deactivate(2), None);
    let env = w.cmd(activate(2), None);
    let actions = w.deliver(env.clone(), false);
    assert!(!persists_epoch(&actions), "{actions:?}");
    assert!(matches!(w.outcome(env.id), Some(Message::Done(_))));
    assert!(w.core.active());
}

#[test]
fn a_missing_epoch_is_zero_and_behaves_as_before() {
    let mut w = World::new();
    let env = w.cmd(Deactivate::default(), None);
    let actions = w.deliver(env.clone(), false);
    assert!(!persists_epoch(&actions));
    assert!(matches!(w.outcome(env.id), Some(Message::Done(_))));
    assert_eq!((w.core.epoch(), w.disk_epoch), (0, 0));
    // Once a leader with an epoch spoke, a command without one is older.
    w.send(activate(1), None);
    let id = w.send(Deactivate::default(), None);
    assert_eq!(refusal(&w, id).epoch, Some(1));
    assert!(w.core.active());
}

#[test]
fn a_redelivered_command_of_the_current_epoch_is_answered_as_before() {
    let mut w = World::new();
    let env = w.cmd(deactivate(4), Some("op"));
    w.deliver(env.clone(), false);
    w.events.clear();
    let actions = w.deliver(env.clone(), true);
    assert!(!persists_epoch(&actions));
    assert!(
        matches!(w.outcome(env.id), Some(Message::Done(_))),
        "result published again"
    );
    assert_eq!(w.counted("cmd.deactivate", "duplicate"), 1);
}

#[test]
fn a_command_journaled_before_a_newer_epoch_finishes() {
    // Accepted while its sender led; interrupted by a restart; meanwhile
    // the node saw a newer epoch: the redelivery resumes, it is not new.
    let mut w = World::new();
    w.fail.state = true;
    let env = w.cmd(deactivate(0), Some("op"));
    w.deliver(env.clone(), false);
    let mut entry = w.journal[&env.id].clone();
    entry.status = crate::state::journal::EntryStatus::Running;
    entry.result = None;
    w.journal.insert(env.id, entry);
    w.fail.state = false;
    w.disk_epoch = 2;
    w.restart();
    w.events.clear();
    w.deliver(env.clone(), true);
    assert!(matches!(w.outcome(env.id), Some(Message::Done(_))));
    assert!(!w.core.active());
}

#[test]
fn inventory_is_fenced_and_ping_is_not() {
    let mut w = World::new();
    w.send(deactivate(5), None);
    let id = w.send(InventoryRequest { epoch: 4 }, None);
    assert_eq!(refusal(&w, id).reason, STALE_EPOCH);
    let id = w.send(InventoryRequest { epoch: 6 }, None);
    assert!(matches!(w.outcome(id), Some(Message::Done(_))));
    assert_eq!((w.core.epoch(), w.disk_epoch), (6, 6));
    w.send(Ping {}, None);
    assert_eq!(w.pongs.len(), 1, "pings carry no epoch and are answered");
    assert_eq!(w.counted(Kind::Ping.as_str(), "done"), 1);
}

#[test]
fn an_epoch_that_cannot_be_persisted_fails_the_command_unexecuted() {
    let mut w = World::new();
    w.fail.state = true;
    let id = w.send(deactivate(9), None);
    match w.outcome(id) {
        Some(Message::Failed(f)) => {
            assert!(f.retryable && f.error.contains("leader epoch 9"), "{f:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(w.journal.is_empty() && w.core.active());
    assert_eq!(w.core.epoch(), 0);
}
