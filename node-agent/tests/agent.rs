//! The node agent's scenarios on the in-process bus. The same scenarios run
//! on RabbitMQ over AMQP and STOMP in `tests/tests/it/node_commands.rs`.

#[path = "../../tests/src/node_harness.rs"]
#[allow(dead_code)]
mod node_harness;
#[path = "../../tests/src/node_scenarios.rs"]
#[allow(dead_code)]
mod node_scenarios;

fn memory_url() -> String {
    format!("memory://{}", node_harness::unique("node-tests-"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals() {
    node_scenarios::refusals(&memory_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deactivate_survives_restart() {
    node_scenarios::deactivate_survives_restart(&memory_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evacuation_with_progress() {
    node_scenarios::evacuation_with_progress(&memory_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evacuation_resumes_after_restart() {
    node_scenarios::evacuation_resumes_after_restart(&memory_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pings() {
    node_scenarios::pings(&memory_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inventory_heat_and_remove() {
    node_scenarios::inventory_heat_and_remove(&memory_url()).await;
}
