//! One conformance suite, the same cases for every transport.
//!
//! `memory` runs in-process. `amqp` and `stomp` talk to the real RabbitMQ
//! named by `GEARSHIFT_TEST_AMQP_URL` / `GEARSHIFT_TEST_STOMP_URL` (defaults:
//! the local broker with guest/guest, as `scripts/setup-rabbitmq` prepares it);
//! `activemq` to the private ActiveMQ Classic of `scripts/setup-activemq`
//! (`GEARSHIFT_TEST_ACTIVEMQ_URL`, default: the URL in `target/activemq/url`).
//! A missing broker is a test failure with a clear message, never a skip.
//! Where the brokers differ, a case states what it expects of each
//! ([`harness::Quirks`]).
//!
//! Tests whose name contains `disruptive` make the broker drop every
//! connection (`rabbitmqctl close_all_connections`; for ActiveMQ, the
//! harness's proxy cuts its own); the test script runs them in a separate,
//! serial pass so that they cannot disturb other tests.

mod cases;
mod durability;
mod election;
pub(crate) mod harness;

macro_rules! conformance {
    ($module:ident, $harness:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::harness::*;
            use super::{cases, durability, election};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pubsub_by_pattern() {
                cases::pubsub_by_pattern(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn node_queue_keeps_commands_while_consumer_away() {
                cases::node_queue_keeps_commands_while_consumer_away(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nack_redelivers() {
                cases::nack_redelivers(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ack_all_settles_its_batch_and_nothing_after_it() {
                durability::ack_all_settles_its_batch_and_nothing_after_it(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn requeue_and_the_other_unsettled_deliveries() {
                durability::requeue_and_the_other_unsettled_deliveries(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_durable_queue_keeps_what_is_published_before_its_first_consumer() {
                durability::a_durable_queue_keeps_what_is_published_before_its_first_consumer(
                    &$harness,
                )
                .await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn consumer_dying_before_ack_redelivers() {
                cases::consumer_dying_before_ack_redelivers(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn confirmed_publishes_are_all_delivered() {
                cases::confirmed_publishes_are_all_delivered(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn request_reply() {
                cases::request_reply(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn request_all_gathers_every_responder() {
                cases::request_all_gathers_every_responder(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn prefetch_bounds_unacked_deliveries() {
                cases::prefetch_bounds_unacked_deliveries(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_bounded_queue_keeps_the_newest() {
                cases::a_bounded_queue_keeps_the_newest(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn single_active_consumer_hands_over() {
                election::single_active_consumer_hands_over(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn oversized_and_invalid_inputs_are_refused() {
                cases::oversized_and_invalid_inputs_are_refused(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn settling_after_the_subscription_is_gone() {
                cases::settling_after_the_subscription_is_gone(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn disruptive_recovery_after_broker_drops_every_connection() {
                cases::recovery_after_broker_drops_every_connection(&$harness).await;
            }
        }
    };
}

conformance!(memory, Memory::new());
conformance!(amqp, Real::amqp());
conformance!(stomp, Real::stomp());
conformance!(activemq, ActiveMq::new());
