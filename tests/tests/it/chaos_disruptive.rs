//! The fault campaign of `gearshift-sim chaos`, bounded: five rounds over
//! the real RabbitMQ, one of each fault — SIGKILL of the real
//! `gearshift-broker` during a drain and during a scale-up, SIGKILL of the
//! real `gearshift-node` being drained, `rabbitmqctl close_all_connections`,
//! and a 30 s outage (`rabbitmqctl stop_app` / `start_app`) — with every
//! invariant checked after each round.
//!
//! Disruptive: it closes every connection of the shared broker and stops its
//! app for 30 s, so the test script runs it in its serial pass.

use std::time::Duration;

use gearshift_sim::chaos::{ChaosArgs, run};
use gearshift_tests::bins::{broker_binary, node_binary};
use gearshift_tests::{amqp_url, init_logging};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_disruptive_campaign_keeps_every_invariant() {
    init_logging();
    let mut args = ChaosArgs::bounded(&amqp_url(), 5, Duration::from_secs(30));
    args.broker_bin = Some(broker_binary());
    args.node_bin = Some(node_binary());
    let report = tokio::time::timeout(Duration::from_secs(900), run(args))
        .await
        .expect("the campaign is bounded in time")
        .expect("the campaign ran to its end");
    eprintln!("{}", report.render());
    assert_eq!(report.rounds, 5);
    assert_eq!(report.faults_injected, 5, "{:?}", report.faults);
    for kind in [
        "KillBrokerDrain",
        "KillNode",
        "CloseConnections",
        "Outage",
        "KillBrokerScaleUp",
    ] {
        assert_eq!(
            report.faults.get(kind),
            Some(&1),
            "{kind}: {:?}",
            report.faults
        );
    }
    // Three inventory checks and one deadline check per round, plus three
    // after the outage.
    assert_eq!(report.checks, 5 * 4 + 3, "{}", report.render());
    let failed: Vec<_> = report.details.iter().filter(|c| !c.ok).collect();
    assert!(failed.is_empty(), "invariants broken: {failed:#?}");
}
