//! Node agent scenarios, each a function of the bus URL, so that the same
//! checks run on the in-process bus (`node-agent/tests`) and on RabbitMQ
//! over AMQP and STOMP (`tests/tests/it/node_*.rs`).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::OutMessage;
use gearshift_node::runtime::sim::{SimRuntime, SimWorld};
use gearshift_node::runtime::{NodeFacts, SharedRuntime};
use gearshift_proto::msg::{
    Activate, CommandResult, Deactivate, DistrictInfo, Evacuate, GearOutcome, HeatAction,
    HeatSignal, InventoryRequest, Message, Move, Ping, Remove,
};
use gearshift_proto::{Envelope, routing};
use uuid::Uuid;

use super::node_harness::*;

fn facts() -> NodeFacts {
    NodeFacts {
        profile: "small".into(),
        max_active_gears: 50,
        district: Some(DistrictInfo {
            uuid: "d1".into(),
            active: true,
            first_uid: Some(1000),
            max_uid: Some(6999),
        }),
    }
}

/// A simulated world with `node` holding `gears` gears and two empty targets.
pub fn sim_world(node: &str, gears: u32) -> (Arc<SimWorld>, SharedRuntime, [String; 2]) {
    let w = SimWorld::new();
    let targets = [format!("{node}-t1"), format!("{node}-t2")];
    w.add_node(node, facts());
    for t in &targets {
        w.add_node(t, facts());
    }
    w.populate(node, gears, 25);
    let rt: SharedRuntime = Arc::new(SimRuntime::new(w.clone(), node));
    (w, rt, targets)
}

fn refused_reason(e: &Envelope) -> String {
    match &e.msg {
        Message::Refused(r) => r.reason.clone(),
        other => panic!("expected event.refused, got {other:?}"),
    }
}

fn done(e: &Envelope) -> CommandResult {
    match &e.msg {
        Message::Done(d) => d.result.clone(),
        other => panic!("expected event.done, got {other:?}"),
    }
}

/// Forged, altered, wrongly signed, expired, stale, unsigned, malformed and
/// replayed commands are refused with their reason, and the node's state
/// does not change.
pub async fn refusals(url: &str) {
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let node = unique("n-refuse-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (world, rt, _) = sim_world(&node, 3);
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let mut reports = ctl.reports(&node, &node_key).await;
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node)),
        connect(url, &node).await,
        rt,
    );
    reports.report(WAIT, "a first report", |r| r.active).await;

    // A valid deactivate, kept to replay it later.
    let deact = ctl.command(
        Deactivate {
            reason: "test".into(),
        },
        Some("op-1"),
    );
    let deact_id = deact.id;
    let deact_bytes = ctl.seal(deact);
    ctl.send_raw(&node, deact_bytes.clone()).await;
    assert!(matches!(
        done(&events.outcome(deact_id, WAIT).await),
        CommandResult::Deactivated { .. }
    ));
    let id = ctl.send(&node, Activate::default(), Some("op-1")).await;
    assert_eq!(
        done(&events.outcome(id, WAIT).await),
        CommandResult::Activated
    );
    assert!(running.agent.is_active());

    let mut cases: Vec<(&str, Uuid, Vec<u8>)> = Vec::new();
    // Signed by a key nobody trusts.
    let e = ctl.command(Deactivate::default(), None);
    cases.push(("unknown_key", e.id, keys.rogue.seal(e)));
    // Signed by the broker, then altered in transit.
    let e = ctl.command(Activate::default(), None);
    let altered = String::from_utf8(ctl.seal(e.clone()))
        .unwrap()
        .replace("cmd.activate", "cmd.deactivate")
        .into_bytes();
    cases.push(("bad_signature", e.id, altered));
    // A client key may ping, not deactivate.
    let e = ctl.command(Deactivate::default(), None);
    cases.push(("wrong_role", e.id, keys.client.seal(e)));
    // Expired.
    let e = Envelope::new_at(
        "broker-agent",
        Deactivate::default(),
        Utc::now() - chrono::Duration::seconds(10),
    )
    .with_ttl(Duration::from_secs(5));
    cases.push(("expired", e.id, ctl.seal(e)));
    // Outside the time window, never seen.
    let e = Envelope::new_at(
        "broker-agent",
        Deactivate::default(),
        Utc::now() - chrono::Duration::minutes(30),
    );
    cases.push(("stale", e.id, ctl.seal(e)));
    // Unsigned.
    let e = ctl.command(Deactivate::default(), None);
    cases.push(("unsigned", e.id, e.encode()));
    // The deactivate from before, replayed after the node was re-activated.
    cases.push(("replayed", deact_id, deact_bytes));

    for (reason, id, bytes) in cases {
        ctl.send_raw(&node, bytes).await;
        let e = events.outcome(id, WAIT).await;
        assert_eq!(refused_reason(&e), reason, "command {id}");
    }
    // Not even an envelope.
    ctl.send_raw(&node, b"{\"v\":1,\"id\":\"x\"".to_vec()).await;
    let e = events
        .until(
            WAIT,
            "refusal of a malformed message",
            |e| matches!(&e.msg, Message::Refused(r) if r.cmd.is_none()),
        )
        .await;
    assert_eq!(refused_reason(&e), "malformed");

    // Nothing changed: still active, in memory, on disk and in reports.
    assert!(running.agent.is_active());
    assert_eq!(world.is_active(&node), Some(true));
    // seq is the send time in microseconds: take a report sent from now on.
    let now_us = Utc::now().timestamp_micros() as u64;
    let r = reports
        .report(WAIT, "a report after the refusals", |r| r.seq > now_us)
        .await;
    assert!(r.active, "refused commands must not deactivate the node");
    let m = running.agent.metrics();
    for reason in [
        "unknown_key",
        "bad_signature",
        "wrong_role",
        "expired",
        "stale",
        "unsigned",
        "replayed",
        "malformed",
    ] {
        let n = m
            .refused
            .get_or_create(&gearshift_node::metrics::ReasonLabels {
                reason: reason.into(),
            })
            .get();
        // Exactly once: refused_total counts messages sent to this node;
        // strangers on the broadcast exchange (other tests' forged pings)
        // go to broadcast_refused_total.
        assert_eq!(n, 1, "refused_total{{reason={reason}}}");
    }
    running.stop().await;
    let st = gearshift_node::status::read(&state_dir(dir.path(), &node)).unwrap();
    assert!(st.active, "state file unchanged");
}

/// A deactivated node stays inactive across a restart and says so in its reports.
pub async fn deactivate_survives_restart(url: &str) {
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let node = unique("n-deact-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let sd = state_dir(dir.path(), &node);
    let (world, rt, _) = sim_world(&node, 4);
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let mut reports = ctl.reports(&node, &node_key).await;
    let mut cfg = agent_config(&node, &node_key, &keys, &sd);
    cfg.booted_for = Some("scale-up-7".into());
    cfg.region = Some("east".into());
    let running = Running::start(cfg, connect(url, &node).await, rt.clone());
    let first = reports.report(WAIT, "a first report", |_| true).await;
    assert!(first.active);
    assert_eq!(first.booted_for.as_deref(), Some("scale-up-7"));
    assert_eq!(first.region.as_deref(), Some("east"));
    assert_eq!(first.profile, "small");
    assert_eq!(first.max_active_gears, 50);
    assert_eq!(first.interval_secs, 1);
    assert!(first.mem_total_mb > 0 && first.mem_free_mb <= first.mem_total_mb);
    assert!(!first.agent_version.is_empty());
    assert_eq!(first.gears.total(), 4);
    assert_eq!(
        first.gears.active(),
        first.gears.total() - first.gears.idle - first.gears.stopped
    );
    assert_eq!(first.district_uuid(), Some("d1"));

    let id = ctl
        .send(
            &node,
            Deactivate {
                reason: "scale-down".into(),
            },
            Some("sd-1"),
        )
        .await;
    let out = events.outcome(id, WAIT).await;
    assert_eq!(out.corr.as_deref(), Some("sd-1"));
    match done(&out) {
        CommandResult::Deactivated { gears } => {
            let mut ids: Vec<_> = gears.iter().map(|g| g.id.clone()).collect();
            ids.sort();
            let mut want: Vec<_> = world.gears_of(&node).iter().map(|g| g.id.clone()).collect();
            want.sort();
            assert_eq!(ids, want, "deactivate answers with the inventory");
        }
        other => panic!("{other:?}"),
    }
    let r = reports
        .report(WAIT, "an inactive report", |r| !r.active)
        .await;
    assert!(r.seq > first.seq);
    let last_seq = r.seq;
    assert_eq!(running.stop().await, gearshift_node::RunExit::Stopped);

    // Restart on the same state directory.
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &sd),
        connect(url, &node).await,
        rt,
    );
    assert!(!running.agent.is_active(), "still inactive after a restart");
    let r = reports
        .report(WAIT, "the first report after the restart", |r| {
            r.started_at > first.started_at
        })
        .await;
    assert!(!r.active, "the restarted node reports itself inactive");
    assert!(
        r.seq > last_seq,
        "seq increases across restarts ({} > {last_seq})",
        r.seq
    );
    assert_eq!(world.is_active(&node), Some(false));

    let id = ctl.send(&node, Activate::default(), None).await;
    assert_eq!(
        done(&events.outcome(id, WAIT).await),
        CommandResult::Activated
    );
    reports.report(WAIT, "an active report", |r| r.active).await;
    running.stop().await;
}

/// An evacuation: ack, a progress event after every gear, retries, a final
/// result; every gear ends exactly once at its target.
pub async fn evacuation_with_progress(url: &str) {
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let node = unique("n-evac-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (world, rt, targets) = sim_world(&node, 10);
    world.set_move_time(Duration::from_millis(5));
    let gears: Vec<String> = world.gears_of(&node).iter().map(|g| g.id.clone()).collect();
    world.fail_next_moves(&gears[2], 1);
    world.fail_next_moves(&gears[7], 100);
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let mut reports = ctl.reports(&node, &node_key).await;
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node)),
        connect(url, &node).await,
        rt,
    );
    reports.report(WAIT, "a first report", |_| true).await;
    let moves: Vec<Move> = gears
        .iter()
        .enumerate()
        .map(|(i, g)| Move {
            gear: g.clone(),
            target: targets[i % 2].clone(),
        })
        .collect();
    let id = ctl
        .send(
            &node,
            Evacuate {
                moves: moves.clone(),
                parallelism: Some(3),
                deadline: None,
            },
            Some("evac-1"),
        )
        .await;
    let ack = events.next(WAIT).await;
    assert!(
        matches!(&ack.msg, Message::Ack(a) if a.cmd == id && a.command == "cmd.evacuate"),
        "{ack:?}"
    );
    assert_eq!(ack.corr.as_deref(), Some("evac-1"));
    let mut progress = Vec::new();
    let final_event = loop {
        let e = events.next(WAIT).await;
        match &e.msg {
            Message::Progress(p) => {
                assert_eq!(p.cmd, id);
                assert_eq!(e.corr.as_deref(), Some("evac-1"));
                assert_eq!(p.results.len(), 1, "one progress event per gear");
                assert_eq!(p.total, 10);
                assert_eq!(p.moved + p.failed + p.remaining, 10);
                progress.push(p.clone());
            }
            Message::Done(_) => break e,
            other => panic!("unexpected event {other:?}"),
        }
    };
    assert_eq!(progress.len(), 10);
    assert!(
        progress.windows(2).all(|w| w[1].remaining < w[0].remaining),
        "remaining decreases"
    );
    match done(&final_event) {
        CommandResult::Evacuated {
            moved,
            failed,
            results,
            gears_left,
        } => {
            assert_eq!((moved, failed, gears_left), (9, 1, 1));
            let r2 = results.iter().find(|r| r.gear == gears[2]).unwrap();
            assert_eq!(
                (r2.outcome, r2.attempts),
                (GearOutcome::Moved, 2),
                "retried once"
            );
            let r7 = results.iter().find(|r| r.gear == gears[7]).unwrap();
            assert_eq!(r7.outcome, GearOutcome::Failed);
            assert_eq!(r7.attempts, 3, "the configured attempts");
            assert!(r7.error.is_some());
        }
        other => panic!("{other:?}"),
    }
    for m in &moves {
        let at = world.locate(&m.gear);
        if m.gear == gears[7] {
            assert_eq!(at, vec![node.clone()]);
        } else {
            assert_eq!(
                at,
                vec![m.target.clone()],
                "gear {} exactly once at its target",
                m.gear
            );
        }
    }
    let r = reports
        .report(WAIT, "a report without the finished operation", |r| {
            r.operation.is_none()
        })
        .await;
    assert_eq!(r.gears.total(), 1);

    // The same operation sent again: only the failed gear is tried again.
    world.fail_next_moves(&gears[7], 0);
    let before = world.moves();
    let id2 = ctl
        .send(
            &node,
            Evacuate {
                moves,
                parallelism: None,
                deadline: None,
            },
            Some("evac-1"),
        )
        .await;
    let e = events.outcome(id2, WAIT).await;
    match done(&e) {
        CommandResult::Evacuated { moved, failed, .. } => assert_eq!((moved, failed), (10, 0)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        world.moves(),
        before + 1,
        "finished gears are not moved again"
    );
    running.stop().await;
}

/// An evacuation interrupted by a stop resumes after the restart; no gear
/// is moved twice or lost.
pub async fn evacuation_resumes_after_restart(url: &str) {
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let node = unique("n-resume-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let sd = state_dir(dir.path(), &node);
    let (world, rt, targets) = sim_world(&node, 12);
    world.set_move_time(Duration::from_millis(150));
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &sd),
        connect(url, &node).await,
        rt.clone(),
    );
    let moves: Vec<Move> = world
        .gears_of(&node)
        .iter()
        .enumerate()
        .map(|(i, g)| Move {
            gear: g.id.clone(),
            target: targets[i % 2].clone(),
        })
        .collect();
    let id = ctl
        .send(
            &node,
            Evacuate {
                moves: moves.clone(),
                parallelism: Some(2),
                deadline: None,
            },
            Some("resume-1"),
        )
        .await;
    events
        .until(
            WAIT,
            "the third progress event",
            |e| matches!(&e.msg, Message::Progress(p) if p.moved >= 3),
        )
        .await;
    running.stop().await;
    let left_after_stop = world.gears_of(&node).len();
    assert!(left_after_stop > 0, "stopped mid-way");
    let st = gearshift_node::status::read(&sd).unwrap();
    let op = st
        .operation
        .expect("the unfinished evacuation is in the state directory");
    assert_eq!(op.remaining as usize, left_after_stop);

    let running = Running::start(
        agent_config(&node, &node_key, &keys, &sd),
        connect(url, &node).await,
        rt,
    );
    let e = events.outcome(id, WAIT).await;
    match done(&e) {
        CommandResult::Evacuated {
            moved,
            failed,
            gears_left,
            ..
        } => assert_eq!((moved, failed, gears_left), (12, 0, 0)),
        other => panic!("{other:?}"),
    }
    for m in &moves {
        assert_eq!(world.locate(&m.gear), vec![m.target.clone()]);
    }
    assert_eq!(world.moves(), 12, "each gear moved exactly once");
    running.stop().await;
}

/// Broadcast and directed pings are answered with signed pongs; forged ones are not.
pub async fn pings(url: &str) {
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let node = unique("n-ping-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (_world, rt, _) = sim_world(&node, 1);
    ctl.prepare(&node).await;
    let mut reports = ctl.reports(&node, &node_key).await;
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node)),
        connect(url, &node).await,
        rt,
    );
    reports.report(WAIT, "a first report", |_| true).await;
    let mut ring = gearshift_proto::Keyring::new();
    ring.add(node_key.public(), gearshift_proto::msg::Role::Node, "node");

    // Broadcast, by a client: the node answers on the reply queue.
    let ping = Envelope::new("client", Ping {});
    let ping_id = ping.id;
    let replies = ctl
        .bus
        .request_all(
            OutMessage::new(routing::PING, keys.client.seal(ping)),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    let pongs: Vec<_> = replies
        .iter()
        .filter_map(|d| {
            let dec = Envelope::decode(&d.payload).ok()?;
            ring.verify_signature(&dec).ok()?;
            match dec.envelope.msg {
                Message::Pong(p) if p.agent == node => Some(p),
                _ => None,
            }
        })
        .collect();
    assert_eq!(pongs.len(), 1, "one pong from the node");
    assert_eq!(pongs[0].ping, ping_id);
    assert_eq!(pongs[0].role, "node");
    assert_eq!(pongs[0].active, Some(true));

    // Directed, through the node's command queue.
    let ping = ctl.command(Ping {}, None);
    let ping_id = ping.id;
    let t0 = std::time::Instant::now();
    let reply = ctl
        .bus
        .request(
            OutMessage::new(routing::command(&node), ctl.seal(ping)),
            WAIT,
        )
        .await
        .expect("directed ping answered");
    let rtt = t0.elapsed();
    let dec = Envelope::decode(&reply.payload).unwrap();
    ring.verify_signature(&dec).unwrap();
    assert!(matches!(dec.envelope.msg, Message::Pong(ref p) if p.ping == ping_id));
    println!("directed ping round trip: {rtt:?}");

    // Forged broadcast ping: no answer.
    let forged = Envelope::new("client", Ping {});
    let replies = ctl
        .bus
        .request_all(
            OutMessage::new(routing::PING, keys.rogue.seal(forged)),
            Duration::from_millis(700),
        )
        .await
        .unwrap();
    let from_node = replies
        .iter()
        .filter(|d| {
            Envelope::decode(&d.payload)
                .map(|e| e.envelope.from == node)
                .unwrap_or(false)
        })
        .count();
    assert_eq!(from_node, 0, "a forged ping gets no pong");
    // Counted as a refused broadcast (at least once: other tests' nodes and
    // pings share the broadcast exchange), not as a refused command.
    let m = running.agent.metrics();
    let unknown = gearshift_node::metrics::ReasonLabels {
        reason: "unknown_key".into(),
    };
    assert!(m.broadcast_refused.get_or_create(&unknown).get() >= 1);
    assert_eq!(m.refused.get_or_create(&unknown).get(), 0);
    running.stop().await;
}

/// `cmd.inventory` lists the gears; `cmd.heat_signal` without Heat settings
/// fails without retry; `cmd.remove` is refused while the node is active or
/// holds gears, then runs and the agent stops.
pub async fn inventory_heat_and_remove(url: &str) {
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let node = unique("n-remove-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (world, rt, targets) = sim_world(&node, 2);
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node)),
        connect(url, &node).await,
        rt,
    );
    let id = ctl.send(&node, InventoryRequest {}, None).await;
    match done(&events.outcome(id, WAIT).await) {
        CommandResult::Inventory { gears } => assert_eq!(gears.len(), 2),
        other => panic!("{other:?}"),
    }
    let id = ctl
        .send(
            &node,
            HeatSignal {
                action: HeatAction::ScaleUp,
                reason: "more".into(),
            },
            None,
        )
        .await;
    match &events.outcome(id, WAIT).await.msg {
        Message::Failed(f) => assert!(!f.retryable, "{f:?}"),
        other => panic!("{other:?}"),
    }
    let id = ctl.send(&node, Remove::default(), Some("rm-1")).await;
    match &events.outcome(id, WAIT).await.msg {
        Message::Failed(f) => assert!(f.retryable && f.error.contains("active"), "{f:?}"),
        other => panic!("{other:?}"),
    }
    let id = ctl.send(&node, Deactivate::default(), Some("rm-1")).await;
    events.outcome(id, WAIT).await;
    let id = ctl.send(&node, Remove::default(), Some("rm-1")).await;
    match &events.outcome(id, WAIT).await.msg {
        Message::Failed(f) => assert!(f.retryable && f.error.contains("2 gears"), "{f:?}"),
        other => panic!("{other:?}"),
    }
    let moves = world
        .gears_of(&node)
        .iter()
        .map(|g| Move {
            gear: g.id.clone(),
            target: targets[0].clone(),
        })
        .collect();
    let id = ctl
        .send(
            &node,
            Evacuate {
                moves,
                parallelism: None,
                deadline: None,
            },
            Some("rm-1"),
        )
        .await;
    events.outcome(id, WAIT).await;
    let id = ctl
        .send(
            &node,
            Remove {
                reason: "empty".into(),
            },
            Some("rm-1"),
        )
        .await;
    match done(&events.outcome(id, WAIT).await) {
        CommandResult::Removed { action, .. } => assert_eq!(action, "none"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        running.join().await,
        gearshift_node::RunExit::Removed,
        "the agent stops after removal"
    );
    let st = gearshift_node::status::read(&state_dir(dir.path(), &node)).unwrap();
    assert!(st.removed_at.is_some());
}
