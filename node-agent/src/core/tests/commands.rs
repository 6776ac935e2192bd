//! Intake: refusals, the journal's decisions, queueing, pings, inventory, pruning.

use chrono::Duration;
use gearshift_proto::msg::{
    Activate, CommandResult, Deactivate, InventoryRequest, Kind, Message, Ping, Role,
};
use gearshift_proto::{Expect, Gate, KeyPair, Keyring, TimePolicy};

use super::*;

fn refused_reason(w: &World, id: Uuid) -> String {
    match w.outcome(id) {
        Some(Message::Refused(r)) => r.reason.clone(),
        other => panic!("expected event.refused, got {other:?}"),
    }
}

#[test]
fn the_gates_refusals_are_answered_counted_and_acknowledged() {
    let broker = KeyPair::from_seed(&[1; 32]);
    let client = KeyPair::from_seed(&[2; 32]);
    let rogue = KeyPair::from_seed(&[3; 32]);
    let mut ring = Keyring::new();
    ring.add(broker.public(), Role::Broker, "broker");
    ring.add(client.public(), Role::Client, "client");
    let gate = Gate::new(&ring, TimePolicy::default());
    let commands = Expect::kinds(Kind::is_command).any_age();
    let mut w = World::new();
    let now = w.now;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "unknown_key",
            rogue.seal(w.cmd(Deactivate::default(), None)),
        ),
        (
            "wrong_role",
            client.seal(w.cmd(Deactivate::default(), None)),
        ),
        ("unsigned", w.cmd(Deactivate::default(), None).encode()),
    ];
    for (reason, bytes) in cases {
        let admitted = gate.admit(&bytes, commands, now).map(|a| a.envelope);
        let id = admitted.as_ref().err().and_then(|r| r.id).unwrap();
        let c = w.command(admitted, false);
        let actions = w.feed(Input::Command(c));
        assert_eq!(refused_reason(&w, id), reason);
        assert!(
            matches!(
                actions.last(),
                Some(Action::Ack {
                    journaled: None,
                    ..
                })
            ),
            "refused commands are acknowledged away: {actions:?}"
        );
        assert!(actions.iter().any(|a| matches!(
            a,
            Action::Refused {
                broadcast: false,
                ..
            }
        )));
    }
    // A message that is not even an envelope.
    let r = gate.admit(b"{\"v\":1", commands, now).unwrap_err();
    let c = w.command(Err(r), false);
    w.feed(Input::Command(c));
    assert!(w.events.iter().any(
        |e| matches!(&e.msg, Message::Refused(r) if r.cmd.is_none() && r.reason == "malformed")
    ));
    assert_eq!(w.counted("unknown", "refused"), 1);
    assert_eq!(w.counted("cmd.deactivate", "refused"), 3);
    assert!(w.core.active() && w.journal.is_empty(), "nothing changed");
}

#[test]
fn stale_and_expired_new_commands_are_refused_by_the_core() {
    let mut w = World::new();
    let stale = Envelope::new_at("b", Deactivate::default(), w.now - Duration::minutes(30));
    let stale_id = stale.id;
    w.deliver(stale, false);
    assert_eq!(refused_reason(&w, stale_id), "stale");
    let expired = Envelope::new_at("b", Deactivate::default(), w.now - Duration::seconds(10))
        .with_ttl(std::time::Duration::from_secs(5));
    let expired_id = expired.id;
    w.deliver(expired, false);
    assert_eq!(refused_reason(&w, expired_id), "expired");
    assert!(w.core.active() && w.journal.is_empty());
}

#[test]
fn a_journaled_command_is_resumed_whatever_its_age() {
    let mut w = World::new();
    w.fail.state = true;
    let env = w.cmd(Deactivate::default(), Some("op"));
    w.deliver(env.clone(), false);
    assert!(matches!(w.outcome(env.id), Some(Message::Failed(_))));
    // Failed, so finished; fake an interruption instead: a running entry.
    let mut entry = w.journal[&env.id].clone();
    entry.status = crate::state::journal::EntryStatus::Running;
    entry.result = None;
    w.journal.insert(env.id, entry);
    w.restart();
    w.fail.state = false;
    w.events.clear();
    w.now += Duration::hours(2);
    w.deliver(env.clone(), true);
    assert!(
        matches!(w.outcome(env.id), Some(Message::Done(d)) if matches!(d.result, CommandResult::Deactivated { .. })),
        "{:?}",
        w.events
    );
    assert!(!w.core.active());
}

#[test]
fn redelivery_republishes_and_a_replay_is_refused() {
    let mut w = World::new();
    let env = w.cmd(Deactivate::default(), Some("op"));
    w.deliver(env.clone(), false);
    assert!(w.journal[&env.id].acked);
    // Finished but the acknowledgement got lost: a redelivery, not a replay.
    let mut unacked = w.journal[&env.id].clone();
    unacked.acked = false;
    w.journal.insert(env.id, unacked);
    w.restart();
    w.events.clear();
    let actions = w.deliver(env.clone(), false);
    assert!(
        matches!(w.outcome(env.id), Some(Message::Done(_))),
        "result published again"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::PersistActive { .. })),
        "not executed again"
    );
    assert_eq!(w.counted("cmd.deactivate", "duplicate"), 1);
    assert!(w.acked(env.id));

    // Now acknowledged: the same message again is a replay...
    w.events.clear();
    w.deliver(env.clone(), false);
    assert_eq!(refused_reason(&w, env.id), "replayed");
    // ... unless the bus says it delivers it again.
    w.events.clear();
    w.deliver(env.clone(), true);
    assert!(matches!(w.outcome(env.id), Some(Message::Done(_))));
}

#[test]
fn commands_wait_for_the_one_in_progress() {
    let mut w = World::new();
    let first = w.cmd(Deactivate::default(), None);
    let second = w.cmd(Activate::default(), None);
    let c1 = w.command(Ok(first.clone()), false);
    let c2 = w.command(Ok(second.clone()), false);
    assert!(matches!(
        w.step(Input::Command(c1))[..],
        [Action::JournalBegin(_)]
    ));
    assert!(w.step(Input::Command(c2)).is_empty(), "queued");
    assert!(matches!(
        w.step(Input::Journaled(Ok(())))[..],
        [Action::PersistActive { active: false, .. }]
    ));
    let a = w.step(Input::Persisted(Ok(())));
    assert!(matches!(a.last(), Some(Action::Scan(Scan::Deactivated))));
    let a = w.step(Input::Scanned {
        scan: Scan::Deactivated,
        result: Ok(vec![]),
    });
    let ack = pos(
        &a,
        |a| matches!(a, Action::Ack { journaled: Some(id), .. } if *id == first.id),
    )
    .unwrap();
    let next = pos(
        &a,
        |a| matches!(a, Action::JournalBegin(e) if e.id == second.id),
    )
    .unwrap();
    assert!(
        ack < next,
        "the second starts once the first is acknowledged: {a:?}"
    );
}

#[test]
fn a_journal_that_cannot_be_written_fails_the_command_unexecuted() {
    let mut w = World::new();
    w.fail.journal = true;
    let id = w.send(Deactivate::default(), None);
    match w.outcome(id) {
        Some(Message::Failed(f)) => {
            assert!(
                f.retryable && f.error.contains("cannot persist the command"),
                "{f:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !w.log
            .iter()
            .any(|a| matches!(a, Action::PersistActive { .. }))
    );
    assert!(
        w.acks.iter().any(|(_, j)| j.is_none()),
        "acknowledged, not journaled"
    );
    assert!(w.core.active());
}

#[test]
fn directed_pings_are_answered_once() {
    let mut w = World::new();
    let ping = w.cmd(Ping {}, Some("c"));
    let mut c = w.command(Ok(ping.clone()), false);
    c.reply = Reply {
        queue: Some("amq.gen-1".into()),
        correlation_id: Some("x".into()),
    };
    let a = w.feed(Input::Command(c));
    assert!(
        pos(&a, |a| matches!(a, Action::Pong { .. }))
            < pos(&a, |a| matches!(a, Action::Ack { .. }))
    );
    let (pong, reply) = &w.pongs[0];
    assert_eq!(
        (pong.ping, pong.active, pong.agent.as_str()),
        (ping.id, Some(true), "n1")
    );
    assert_eq!(reply.queue.as_deref(), Some("amq.gen-1"));
    assert_eq!(w.counted("cmd.ping", "done"), 1);
    assert!(w.journal.is_empty(), "read-only commands are not journaled");
    w.deliver(ping.clone(), false);
    assert_eq!(refused_reason(&w, ping.id), "replayed");
    assert_eq!(w.pongs.len(), 1);
}

#[test]
fn broadcast_pings_are_refused_quietly() {
    let mut w = World::new();
    let ping = w.cmd(Ping {}, None);
    w.feed(Input::BroadcastPing {
        reply: Reply::default(),
        admitted: Ok(ping.clone()),
    });
    assert_eq!(w.pongs.len(), 1);
    // The same ping again, and a forged one: no pong, no event, no ack.
    let forged = Refusal::of(&ping, "unknown_key", "forged");
    for admitted in [Ok(ping), Err(forged)] {
        let a = w.feed(Input::BroadcastPing {
            reply: Reply::default(),
            admitted,
        });
        assert!(
            matches!(
                a[..],
                [Action::Refused {
                    broadcast: true,
                    ..
                }]
            ),
            "{a:?}"
        );
    }
    assert_eq!(w.pongs.len(), 1);
    assert!(w.events.is_empty());
}

#[test]
fn inventory_lists_the_gears_or_says_why_not() {
    let mut w = World::new();
    let id = w.send(InventoryRequest::default(), None);
    assert!(
        matches!(w.outcome(id), Some(Message::Done(d)) if matches!(&d.result, CommandResult::Inventory { gears } if gears.len() == 2))
    );
    w.fail.scan = true;
    let id = w.send(InventoryRequest::default(), None);
    assert!(
        matches!(w.outcome(id), Some(Message::Failed(f)) if f.retryable && f.error.contains("runtime down"))
    );
    assert_eq!(w.counted("cmd.inventory", "failed"), 1);
    assert!(w.journal.is_empty());
}

#[test]
fn prune_forgets_old_finished_entries() {
    let mut w = World::new();
    let old = w.send(Deactivate::default(), None);
    w.now += Duration::hours(1);
    let recent = w.send(Activate::default(), None);
    let a = w.feed(Input::Prune);
    assert!(
        matches!(&a[..], [Action::JournalForget(ids)] if ids == &vec![old]),
        "{a:?}"
    );
    assert!(!w.journal.contains_key(&old) && w.journal.contains_key(&recent));
    assert!(w.feed(Input::Prune).is_empty());
}

#[test]
fn nothing_starts_once_stopping() {
    let mut w = World::new();
    w.feed(Input::Stop);
    let a = w.deliver(w.cmd(Deactivate::default(), None), false);
    assert!(
        a.is_empty(),
        "left unacknowledged for the next agent: {a:?}"
    );
    assert!(w.core.settled());
}

fn refused_events(w: &World) -> Vec<gearshift_proto::msg::Refused> {
    w.events
        .iter()
        .filter_map(|e| match &e.msg {
            Message::Refused(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_flood_of_refusals_is_answered_within_a_budget_per_reason() {
    use crate::core::{ANSWER_BURST, ANSWER_WINDOW};
    let mut w = World::new();
    let gate_ring = Keyring::new();
    let gate = Gate::new(&gate_ring, TimePolicy::default());
    let commands = Expect::kinds(Kind::is_command).any_age();
    let flood = 1_000;
    for _ in 0..flood {
        let bytes = w.cmd(Deactivate::default(), None).encode();
        let c = w.command(
            gate.admit(&bytes, commands, w.now).map(|a| a.envelope),
            false,
        );
        let actions = w.feed(Input::Command(c));
        assert!(has_ack(&actions), "every refused command is acknowledged");
    }
    // Another reason has its own budget.
    let c = w.command(
        gate.admit(b"[]", commands, w.now).map(|a| a.envelope),
        false,
    );
    w.feed(Input::Command(c));
    assert_eq!(w.counted("cmd.deactivate", "refused"), flood);
    let answered = refused_events(&w);
    let burst = ANSWER_BURST as usize;
    assert_eq!(answered.len(), burst + 1, "{answered:?}");
    assert!(answered[..burst].iter().all(|r| r.reason == "unsigned"));
    assert_eq!(answered[burst].reason, "malformed");
    assert_eq!(w.acks.len(), flood + 1);

    // After the window, the next refusal of that reason says how many were held back.
    w.now += chrono::Duration::from_std(ANSWER_WINDOW).unwrap();
    let bytes = w.cmd(Deactivate::default(), None).encode();
    let c = w.command(
        gate.admit(&bytes, commands, w.now).map(|a| a.envelope),
        false,
    );
    w.feed(Input::Command(c));
    let last = refused_events(&w).pop().unwrap();
    let held = flood - burst;
    assert!(
        last.cmd.is_some()
            && last.detail.contains(&format!(
                "({held} more refused for this reason since 2026-11-24T12:00:00Z"
            )),
        "{last:?}"
    );

    // A flood that stops is summed up at the next housekeeping.
    for _ in 0..(burst + 5) {
        let bytes = w.cmd(Deactivate::default(), None).encode();
        let c = w.command(
            gate.admit(&bytes, commands, w.now).map(|a| a.envelope),
            false,
        );
        w.feed(Input::Command(c));
    }
    let before = refused_events(&w).len();
    w.feed(Input::Prune);
    assert_eq!(
        refused_events(&w).len(),
        before,
        "the window is not over yet"
    );
    w.now += chrono::Duration::from_std(ANSWER_WINDOW).unwrap();
    w.feed(Input::Prune);
    let summary = refused_events(&w).pop().unwrap();
    assert_eq!((summary.cmd, summary.reason.as_str()), (None, "unsigned"));
    assert!(
        summary.detail.starts_with("6 refused since "),
        "{summary:?}"
    );
}
