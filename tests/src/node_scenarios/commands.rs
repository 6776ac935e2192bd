//! Commands other than evacuation: refusals, deactivation across a
//! restart, pings, inventory, Heat signals and removal.

use std::time::Duration;

use chrono::Utc;
use gearshift_bus::OutMessage;
use gearshift_proto::msg::{
    Activate, CommandResult, Deactivate, Evacuate, HeatAction, HeatSignal, InventoryRequest,
    Message, Move, NodeReport, Ping, Remove,
};
use gearshift_proto::{Envelope, routing};
use uuid::Uuid;

use super::{Bed, done, refused_reason};
use crate::node_harness::*;

/// The reasons of [`forged_commands`], in order, and `malformed`.
const REFUSALS: [&str; 8] = [
    "unknown_key",
    "bad_signature",
    "wrong_role",
    "expired",
    "stale",
    "unsigned",
    "replayed",
    "malformed",
];

/// Forged, altered, wrongly signed, expired, stale, unsigned, malformed and
/// replayed commands are refused with their reason, and the node's state
/// does not change.
pub async fn refusals(url: &str) {
    let b = Bed::new(url, "n-refuse-", 3).await;
    let ctl = &b.ctl;
    let mut events = b.events().await;
    let mut reports = b.reports().await;
    let running = b.start(b.config()).await;
    reports.report(WAIT, "a first report", |r| r.active).await;

    // A valid deactivate, kept to replay it later.
    let deact = ctl.command(
        Deactivate {
            reason: "test".into(),
            epoch: 0,
        },
        Some("op-1"),
    );
    let deact_id = deact.id;
    let deact_bytes = ctl.seal(deact);
    ctl.send_raw(&b.node, deact_bytes.clone()).await;
    assert!(matches!(
        done(&events.outcome(deact_id, WAIT).await),
        CommandResult::Deactivated { .. }
    ));
    let id = ctl.send(&b.node, Activate::default(), Some("op-1")).await;
    assert_eq!(
        done(&events.outcome(id, WAIT).await),
        CommandResult::Activated
    );
    assert!(running.agent.is_active());

    let cases = forged_commands(&b, deact_id, deact_bytes);
    for ((id, bytes), reason) in cases.into_iter().zip(REFUSALS) {
        ctl.send_raw(&b.node, bytes).await;
        let e = events.outcome(id, WAIT).await;
        assert_eq!(refused_reason(&e), reason, "command {id}");
    }
    // Not even an envelope.
    ctl.send_raw(&b.node, b"{\"v\":1,\"id\":\"x\"".to_vec())
        .await;
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
    assert_eq!(b.world.is_active(&b.node), Some(true));
    // seq is the send time in microseconds: take a report sent from now on.
    let now_us = Utc::now().timestamp_micros() as u64;
    let r = reports
        .report(WAIT, "a report after the refusals", |r| r.seq > now_us)
        .await;
    assert!(r.active, "refused commands must not deactivate the node");
    assert_refused_once(&running);
    running.stop().await;
    let st = gearshift_node::status::read(&b.state_dir()).unwrap();
    assert!(st.active, "state file unchanged");
}

/// The commands the node must refuse, in the order of [`REFUSALS`]: signed
/// by a stranger, altered, by a client, expired, stale, unsigned, and the
/// earlier deactivate replayed.
fn forged_commands(b: &Bed, deact_id: Uuid, deact_bytes: Vec<u8>) -> Vec<(Uuid, Vec<u8>)> {
    let (ctl, keys) = (&b.ctl, &b.keys);
    let mut cases = Vec::new();
    let e = ctl.command(Deactivate::default(), None);
    cases.push((e.id, keys.rogue.seal(e)));
    // Signed by the broker, then altered in transit.
    let e = ctl.command(Activate::default(), None);
    let altered = String::from_utf8(ctl.seal(e.clone()))
        .unwrap()
        .replace("cmd.activate", "cmd.deactivate")
        .into_bytes();
    cases.push((e.id, altered));
    // A client key may ping, not deactivate.
    let e = ctl.command(Deactivate::default(), None);
    cases.push((e.id, keys.client.seal(e)));
    let e = Envelope::new_at(
        "broker-agent",
        Deactivate::default(),
        Utc::now() - chrono::Duration::seconds(10),
    )
    .with_ttl(Duration::from_secs(5));
    cases.push((e.id, ctl.seal(e)));
    // Outside the time window, never seen.
    let e = Envelope::new_at(
        "broker-agent",
        Deactivate::default(),
        Utc::now() - chrono::Duration::minutes(30),
    );
    cases.push((e.id, ctl.seal(e)));
    let e = ctl.command(Deactivate::default(), None);
    cases.push((e.id, e.encode()));
    // Replayed after the node was re-activated.
    cases.push((deact_id, deact_bytes));
    cases
}

/// Exactly one refusal of each reason: refused_total counts messages sent
/// to this node; strangers on the broadcast exchange (other tests' forged
/// pings) go to broadcast_refused_total.
fn assert_refused_once(running: &Running) {
    let m = running.agent.metrics();
    for reason in REFUSALS {
        let n = m
            .refused
            .get_or_create(&gearshift_node::metrics::ReasonLabels {
                reason: reason.into(),
            })
            .get();
        assert_eq!(n, 1, "refused_total{{reason={reason}}}");
    }
}

/// The first report of a node of `sim_world` with 4 gears, booted for
/// `scale-up-7` in region `east`, reporting every second.
fn check_first_report(first: &NodeReport) {
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
}

/// A deactivated node stays inactive across a restart and says so in its reports.
pub async fn deactivate_survives_restart(url: &str) {
    let b = Bed::new(url, "n-deact-", 4).await;
    let mut events = b.events().await;
    let mut reports = b.reports().await;
    let mut cfg = b.config();
    cfg.booted_for = Some("scale-up-7".into());
    cfg.region = Some("east".into());
    let running = b.start(cfg).await;
    let first = reports.report(WAIT, "a first report", |_| true).await;
    check_first_report(&first);

    let reason = "scale-down".to_string();
    let id = b
        .ctl
        .send(&b.node, Deactivate { reason, epoch: 0 }, Some("sd-1"))
        .await;
    let out = events.outcome(id, WAIT).await;
    assert_eq!(out.corr.as_deref(), Some("sd-1"));
    match done(&out) {
        CommandResult::Deactivated { gears } => {
            let mut ids: Vec<_> = gears.iter().map(|g| g.id.clone()).collect();
            ids.sort();
            let gears_of = b.world.gears_of(&b.node);
            let mut want: Vec<_> = gears_of.iter().map(|g| g.id.clone()).collect();
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
    let running = b.start(b.config()).await;
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
    assert_eq!(b.world.is_active(&b.node), Some(false));

    let id = b.ctl.send(&b.node, Activate::default(), None).await;
    assert_eq!(
        done(&events.outcome(id, WAIT).await),
        CommandResult::Activated
    );
    reports.report(WAIT, "an active report", |r| r.active).await;
    running.stop().await;
}

/// Broadcast and directed pings are answered with signed pongs; forged ones are not.
pub async fn pings(url: &str) {
    let b = Bed::new(url, "n-ping-", 1).await;
    let mut reports = b.reports().await;
    let running = b.start(b.config()).await;
    reports.report(WAIT, "a first report", |_| true).await;
    let mut ring = gearshift_proto::Keyring::new();
    ring.add(
        b.node_key.public(),
        gearshift_proto::msg::Role::Node,
        "node",
    );
    broadcast_ping(&b, &ring).await;
    directed_ping(&b, &ring).await;

    // Forged broadcast ping: no answer.
    let forged = Envelope::new("client", Ping {});
    let replies = b
        .ctl
        .bus
        .request_all(
            OutMessage::new(routing::PING, b.keys.rogue.seal(forged)),
            Duration::from_millis(700),
        )
        .await
        .unwrap();
    let from_node = replies
        .iter()
        .filter(|d| {
            Envelope::decode(&d.payload)
                .map(|e| e.envelope.from == b.node)
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

/// Broadcast, by a client: the node answers on the reply queue.
async fn broadcast_ping(b: &Bed, ring: &gearshift_proto::Keyring) {
    let ping = Envelope::new("client", Ping {});
    let ping_id = ping.id;
    let replies = b
        .ctl
        .bus
        .request_all(
            OutMessage::new(routing::PING, b.keys.client.seal(ping)),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    let pongs: Vec<_> = replies
        .iter()
        .filter_map(|d| match verified(&d.payload, ring)?.msg {
            Message::Pong(p) if p.agent == b.node => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(pongs.len(), 1, "one pong from the node");
    assert_eq!(pongs[0].ping, ping_id);
    assert_eq!(pongs[0].role, "node");
    assert_eq!(pongs[0].active, Some(true));
}

/// Directed, through the node's command queue.
async fn directed_ping(b: &Bed, ring: &gearshift_proto::Keyring) {
    let ping = b.ctl.command(Ping {}, None);
    let ping_id = ping.id;
    let t0 = std::time::Instant::now();
    let reply = b
        .ctl
        .bus
        .request(
            OutMessage::new(routing::command(&b.node), b.ctl.seal(ping)),
            WAIT,
        )
        .await
        .expect("directed ping answered");
    let rtt = t0.elapsed();
    let pong = verified(&reply.payload, ring).expect("a pong signed by the node");
    assert!(matches!(pong.msg, Message::Pong(ref p) if p.ping == ping_id));
    println!("directed ping round trip: {rtt:?}");
}

/// `cmd.inventory` lists the gears; `cmd.heat_signal` without Heat settings
/// fails without retry; `cmd.remove` is refused while the node is active or
/// holds gears, then runs and the agent stops.
pub async fn inventory_heat_and_remove(url: &str) {
    let b = Bed::new(url, "n-remove-", 2).await;
    let mut events = b.events().await;
    let running = b.start(b.config()).await;
    let id = b.ctl.send(&b.node, InventoryRequest::default(), None).await;
    match done(&events.outcome(id, WAIT).await) {
        CommandResult::Inventory { gears } => assert_eq!(gears.len(), 2),
        other => panic!("{other:?}"),
    }
    let signal = HeatSignal {
        action: HeatAction::ScaleUp,
        reason: "more".into(),
        epoch: 0,
    };
    let id = b.ctl.send(&b.node, signal, None).await;
    match &events.outcome(id, WAIT).await.msg {
        Message::Failed(f) => assert!(!f.retryable, "{f:?}"),
        other => panic!("{other:?}"),
    }
    refused_removals(&b, &mut events).await;
    let moves = b
        .world
        .gears_of(&b.node)
        .iter()
        .map(|g| Move {
            gear: g.id.clone(),
            target: b.targets[0].clone(),
        })
        .collect();
    let evacuate = Evacuate {
        moves,
        parallelism: None,
        deadline: None,
        watch: false,
        epoch: 0,
    };
    let id = b.ctl.send(&b.node, evacuate, Some("rm-1")).await;
    events.outcome(id, WAIT).await;
    let remove = Remove {
        reason: "empty".into(),
        epoch: 0,
    };
    let id = b.ctl.send(&b.node, remove, Some("rm-1")).await;
    match done(&events.outcome(id, WAIT).await) {
        CommandResult::Removed { action, .. } => assert_eq!(action, "none"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        running.join().await,
        gearshift_node::RunExit::Removed,
        "the agent stops after removal"
    );
    let st = gearshift_node::status::read(&b.state_dir()).unwrap();
    assert!(st.removed_at.is_some());
}

/// `cmd.remove` fails (retryably) while the node is active, then while it
/// holds gears; the node is deactivated in between.
async fn refused_removals(b: &Bed, events: &mut Verified) {
    let id = b.ctl.send(&b.node, Remove::default(), Some("rm-1")).await;
    match &events.outcome(id, WAIT).await.msg {
        Message::Failed(f) => assert!(f.retryable && f.error.contains("active"), "{f:?}"),
        other => panic!("{other:?}"),
    }
    let id = b
        .ctl
        .send(&b.node, Deactivate::default(), Some("rm-1"))
        .await;
    events.outcome(id, WAIT).await;
    let id = b.ctl.send(&b.node, Remove::default(), Some("rm-1")).await;
    match &events.outcome(id, WAIT).await.msg {
        Message::Failed(f) => assert!(f.retryable && f.error.contains("2 gears"), "{f:?}"),
        other => panic!("{other:?}"),
    }
}
