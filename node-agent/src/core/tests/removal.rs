//! `cmd.remove` and `cmd.heat_signal`.

use gearshift_proto::msg::{CommandResult, Deactivate, HeatAction, HeatSignal, Message, Remove};

use super::*;

fn inactive_and_empty() -> World {
    let mut w = World::new();
    w.send(Deactivate::default(), None);
    w.gears.clear();
    w
}

fn failed(w: &World, id: Uuid) -> gearshift_proto::msg::Failed {
    match w.outcome(id) {
        Some(Message::Failed(f)) => f.clone(),
        other => panic!("expected event.failed, got {other:?}"),
    }
}

#[test]
fn remove_is_refused_while_active_or_holding_gears() {
    let mut w = World::new();
    let id = w.send(Remove::default(), Some("rm"));
    let f = failed(&w, id);
    assert!(f.retryable && f.error.contains("active"), "{f:?}");
    w.send(Deactivate::default(), None);
    let id = w.send(Remove::default(), Some("rm"));
    let f = failed(&w, id);
    assert!(f.retryable && f.error.contains("2 gears"), "{f:?}");
    w.fail.scan = true;
    let id = w.send(Remove::default(), Some("rm"));
    assert!(
        failed(&w, id)
            .error
            .contains("cannot check that the node is empty")
    );
    assert!(!w.core.removed());
}

#[test]
fn remove_is_acknowledged_once_its_result_is_on_the_bus() {
    let mut w = inactive_and_empty();
    w.auto_confirm = false;
    let id = w.send(Remove::default(), Some("rm"));
    match w.outcome(id) {
        Some(Message::Done(d)) => {
            assert!(matches!(&d.result, CommandResult::Removed { action, .. } if action == "none"))
        }
        other => panic!("{other:?}"),
    }
    assert!(w.removed_at.is_some());
    assert!(!w.acked(id), "not before the bus confirmed the result");
    assert!(!w.core.removed());
    let a = w.feed(Input::Confirmed {
        confirm: Confirm::Remove,
        ok: true,
    });
    let ack = pos(&a, |a| matches!(a, Action::Ack { .. })).unwrap();
    assert!(
        pos(&a, |a| matches!(a, Action::Removed)) > Some(ack),
        "{a:?}"
    );
    assert!(w.acked(id) && w.core.removed());
    // The agent is going away: nothing else starts.
    assert!(
        w.deliver(w.cmd(Deactivate::default(), None), false)
            .is_empty()
    );
}

#[test]
fn stopping_does_not_wait_for_the_removal_to_be_confirmed() {
    let mut w = inactive_and_empty();
    w.auto_confirm = false;
    let id = w.send(Remove::default(), None);
    let a = w.feed(Input::Stop);
    assert!(a.iter().any(|a| matches!(a, Action::Removed)));
    assert!(w.acked(id) && w.core.settled());
}

#[test]
fn remove_runs_the_heat_action_when_configured() {
    let mut w = inactive_and_empty();
    w.config.remove_action = Some(HeatAction::MarkUnhealthy);
    w.config.heat = true;
    let id = w.send(
        Remove {
            reason: "empty".into(),
            epoch: 0,
        },
        None,
    );
    assert!(w.log.iter().any(|a| matches!(a, Action::Signal { action: HeatAction::MarkUnhealthy, reason } if reason == "empty")));
    match w.outcome(id) {
        Some(Message::Done(d)) => assert!(
            matches!(&d.result, CommandResult::Removed { action, detail } if action == "heat:mark_unhealthy" && detail.contains("HTTP 200"))
        ),
        other => panic!("{other:?}"),
    }
    assert!(w.core.removed());

    let mut w = inactive_and_empty();
    w.config.remove_action = Some(HeatAction::ScaleDown);
    w.config.heat = false;
    let id = w.send(Remove::default(), None);
    let f = failed(&w, id);
    assert!(
        !f.retryable && f.error.contains("needs Heat credentials"),
        "{f:?}"
    );
    assert!(!w.core.removed());
}

#[test]
fn a_removal_interrupted_by_a_restart_does_not_scale_twice() {
    let mut w = inactive_and_empty();
    w.config.remove_action = Some(HeatAction::ScaleDown);
    w.config.heat = true;
    let env = w.cmd(Remove::default(), None);
    w.begin(&env);
    let a = w.step(Input::Scanned {
        scan: Scan::Remove,
        result: Ok(vec![]),
    });
    assert!(matches!(a.last(), Some(Action::Signal { .. })), "{a:?}");
    // The signal was in flight when the agent died.
    w.restart();
    w.deliver(env.clone(), true);
    let f = failed(&w, env.id);
    assert!(!f.retryable && f.error.contains("restarted"), "{f:?}");
    assert!(!w.core.removed());
}

#[test]
fn heat_signals() {
    let mut w = World::new();
    let signal = |action| HeatSignal {
        action,
        reason: String::new(),
        epoch: 0,
    };
    let id = w.send(signal(HeatAction::ScaleUp), None);
    let f = failed(&w, id);
    assert!(
        !f.retryable && f.error.contains("no Heat configuration"),
        "{f:?}"
    );

    w.config.heat = true;
    let id = w.send(signal(HeatAction::ScaleUp), Some("up"));
    assert!(w.log.iter().any(|a| matches!(a, Action::Signal { reason, .. } if reason == "gearshift scale_up from node n1")));
    assert!(
        w.events
            .iter()
            .any(|e| matches!(&e.msg, Message::Ack(a) if a.cmd == id))
    );
    assert!(
        matches!(w.outcome(id), Some(Message::Done(d)) if matches!(d.result, CommandResult::HeatSignalled { status: 200, .. }))
    );
    assert!(w.acked(id));

    w.signal = Err(SignalError {
        message: "cooldown".into(),
        http_status: Some(409),
        retryable: true,
    });
    let id = w.send(signal(HeatAction::ScaleDown), None);
    let f = failed(&w, id);
    assert_eq!(
        (f.retryable, f.http_status, f.error.as_str()),
        (true, Some(409), "cooldown")
    );
}

#[test]
fn only_idempotent_signals_are_sent_again_after_a_restart() {
    for (action, sent_again) in [
        (HeatAction::ScaleUp, false),
        (HeatAction::MarkUnhealthy, true),
    ] {
        let mut w = World::new();
        w.config.heat = true;
        let env = w.cmd(
            HeatSignal {
                action,
                reason: String::new(),
                epoch: 0,
            },
            None,
        );
        let a = w.begin(&env);
        assert!(matches!(a.last(), Some(Action::Signal { .. })), "{a:?}");
        w.restart();
        w.log.clear();
        w.deliver(env.clone(), true);
        let signalled = w.log.iter().any(|a| matches!(a, Action::Signal { .. }));
        assert_eq!(signalled, sent_again, "{action:?}");
        assert_eq!(
            matches!(w.outcome(env.id), Some(Message::Done(_))),
            sent_again
        );
    }
}
