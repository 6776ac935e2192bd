//! The node agent over real RabbitMQ, on AMQP and on STOMP: refusals,
//! persistent deactivation, evacuation with progress and resumption, pings,
//! inventory and removal. (The same scenarios run on the in-process bus in
//! `node-agent/tests/agent.rs`.)

use gearshift_tests::node_scenarios as s;
use gearshift_tests::{amqp_url, init_logging, stomp_url};

macro_rules! on_both_transports {
    ($($name:ident),+ $(,)?) => {
        mod amqp {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::init_logging();
                    super::s::$name(&super::amqp_url()).await;
                }
            )+
        }
        mod stomp {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::init_logging();
                    super::s::$name(&super::stomp_url()).await;
                }
            )+
        }
    };
}

on_both_transports!(
    refusals,
    deactivate_survives_restart,
    evacuation_with_progress,
    evacuation_resumes_after_restart,
    pings,
    inventory_heat_and_remove,
);
