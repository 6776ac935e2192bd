//! A deposed leader (protocol section 11): a command of leader epoch 5 is
//! acted upon; one of epoch 4 from the broker agent that led before is
//! refused with `stale_epoch`, counted, and not acted upon (the node's
//! state file and reports unchanged), also after the node restarted; the
//! refusal reaches the broker side, whose core hands it to the agent as
//! [`Action::StaleEpoch`]. Commands of the current epoch go on working.

use std::sync::Arc;

use chrono::Utc;
use gearshift_broker::BrokerConfig;
use gearshift_broker::core::{Action, Core};
use gearshift_broker::planner::{EvacuationPlanner, PlanInput};
use gearshift_proto::Envelope;
use gearshift_proto::msg::{Activate, CommandResult, Deactivate, Message, Move, STALE_EPOCH};
use serde_json::Value;
use uuid::Uuid;

use super::{HostileNode, WAIT, eventually};

/// The node's `state.json`.
fn state(n: &HostileNode) -> Value {
    let path = n._dir.path().join("state/state.json");
    serde_json::from_slice(&std::fs::read(path).expect("state.json")).expect("state.json is JSON")
}

fn deactivate(epoch: u64) -> Deactivate {
    Deactivate {
        reason: format!("leader of epoch {epoch}: drain"),
        epoch,
    }
}

fn activate(epoch: u64) -> Activate {
    Activate {
        reason: format!("leader of epoch {epoch}: abort the drain"),
        epoch,
    }
}

/// Sends `msg` as the broker agent and waits for the node's answer.
async fn ask(
    n: &HostileNode,
    events: &mut gearshift_tests::node_harness::Verified,
    msg: impl Into<Message>,
) -> Envelope {
    let id: Uuid = n.ctl.send(&n.name, msg, Some("op-fence")).await;
    events.outcome(id, WAIT).await
}

fn assert_stale(e: &Envelope, ours: u64, theirs: u64) {
    let Message::Refused(r) = &e.msg else {
        panic!("expected event.refused, got {:?}", e.msg)
    };
    assert_eq!(r.reason, STALE_EPOCH, "{}", r.detail);
    assert_eq!(r.epoch, Some(theirs), "names the newest epoch seen");
    assert!(
        r.detail.contains(&format!("epoch {ours}"))
            && r.detail.contains(&format!("epoch {theirs}")),
        "names both epochs: {}",
        r.detail
    );
}

/// The broker agent's core, as a deposed leader of `epoch`.
fn broker_core(epoch: u64) -> Core {
    struct NoPlan;
    impl EvacuationPlanner for NoPlan {
        fn plan(&self, _: &PlanInput<'_>) -> Result<Vec<Move>, String> {
            Err("not needed".into())
        }
    }
    let cfg = Arc::new(BrokerConfig::defaults());
    let mut core = Core::new(cfg, Arc::new(NoPlan), Utc::now());
    core.set_epoch(epoch);
    core
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_a_deposed_leaders_commands_are_refused_and_not_acted_upon() {
    let mut n = HostileNode::new("1s", true).await;
    let mut events = n.ctl.events(&n.name, &n.node_key).await;
    let mut reports = n.ctl.reports(&n.name, &n.node_key).await;
    n.proc.start();
    reports.next(WAIT).await;

    // The leader of epoch 5 deactivates the node.
    let done = ask(&n, &mut events, deactivate(5)).await;
    assert!(
        matches!(&done.msg, Message::Done(d) if matches!(d.result, CommandResult::Deactivated { .. })),
        "{:?}\n{}",
        done.msg,
        n.log_tail()
    );
    let st = state(&n);
    assert_eq!(
        (st["active"].clone(), st["epoch"].clone()),
        (false.into(), 5.into())
    );

    // The deposed leader of epoch 4 tries to put it back into service.
    let refused = ask(&n, &mut events, activate(4)).await;
    assert_stale(&refused, 4, 5);
    eventually(WAIT, "refused_total stale_epoch", || {
        n.refused(STALE_EPOCH) >= 1.0
    })
    .await;
    let st = state(&n);
    assert_eq!(
        (st["active"].clone(), st["epoch"].clone()),
        (false.into(), 5.into()),
        "not acted upon"
    );
    let after = Utc::now();
    let e = reports
        .until(WAIT, "a report after the refusal", |e| e.ts > after)
        .await;
    assert!(
        matches!(&e.msg, Message::Report(r) if !r.active),
        "the node still reports itself inactive: {:?}",
        e.msg
    );
    assert_eq!(n.metric("gearshift_node_active "), 0.0);

    // The broker side: the deposed agent's core reads the refusal as such.
    let mut core = broker_core(4);
    let acts = core.on_event(
        &refused.from,
        refused.corr.as_deref(),
        &refused.msg,
        Utc::now(),
    );
    match &acts[..] {
        [Action::StaleEpoch(s)] => {
            assert_eq!(
                (s.node.as_str(), s.ours, s.theirs),
                (n.name.as_str(), 4, Some(5))
            );
        }
        other => panic!("expected Action::StaleEpoch, got {other:?}"),
    }

    // The epoch is persisted: after a restart the node still refuses it.
    assert_eq!(
        n.proc.terminate(std::time::Duration::from_secs(20)),
        Some(0)
    );
    n.proc.start();
    let refused = ask(&n, &mut events, activate(4)).await;
    assert_stale(&refused, 4, 5);
    assert_eq!(state(&n)["active"], false);

    // The leader of epoch 5 goes on as before.
    let done = ask(&n, &mut events, activate(5)).await;
    assert!(matches!(done.msg, Message::Done(_)), "{:?}", done.msg);
    assert_eq!(state(&n)["active"], true);
    assert_eq!(
        n.proc.terminate(std::time::Duration::from_secs(20)),
        Some(0)
    );
}
