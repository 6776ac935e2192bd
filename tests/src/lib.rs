//! Shared helpers for gearshift's cross-crate integration tests (`tests/tests/it/`).
//!
//! Real components: RabbitMQ over AMQP and STOMP (made ready by
//! `scripts/setup-rabbitmq`), Python clients and servers from the virtualenv
//! that `scripts/test-deps` creates. A missing component fails the test with
//! a message that says which script to run; nothing is skipped.
//!
//! ## Layout
//! - The tests themselves: one binary, `tests/tests/it/main.rs`, a module
//!   per concern (`broker_sagas`, `node_commands`, `handlers_nova`, ...).
//! - [`broker_harness`]: a test bed for the broker agent on the simulator's
//!   fleet and cloud ([`gearshift_sim::fleet`]) with test timers, a fast
//!   broker configuration, a watcher of signed decisions.
//! - [`node_harness`], [`node_scenarios`]: the node agent's controller and
//!   scenarios (also compiled into `node-agent/tests` by `#[path]`);
//!   [`node_process`], [`node_proxy`]: its binary, a bus link to cut.
//! - [`broker_process`], [`bins`]: the agents' binaries as child processes.
//! - [`fake_openstack`], [`pushstats_gnocchi`], [`pushstats`]: the OpenStack
//!   APIs, Gnocchi and CloudWatch (moto), which cannot run here for real.
//! - [`oo_standin`]: the OpenShift broker-host stand-ins (district tools and
//!   node roots) a test points the broker agent's `[paas]` at.

pub mod bins;
pub mod broker_harness;
pub mod broker_process;
pub mod fake_openstack;
pub mod node_harness;
pub mod node_process;
pub mod node_proxy;
pub mod node_scenarios;
pub mod oo_standin;
pub mod pushstats;
pub mod pushstats_gnocchi;

use std::path::PathBuf;
use std::time::Duration;

use gearshift_bus::{ConnectOptions, SharedBus};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// AMQP URL of the test broker.
pub fn amqp_url() -> String {
    std::env::var("GEARSHIFT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// STOMP URL of the test broker.
pub fn stomp_url() -> String {
    std::env::var("GEARSHIFT_TEST_STOMP_URL")
        .unwrap_or_else(|_| "stomp://guest:guest@127.0.0.1:61613".into())
}

/// STOMP URL of the private ActiveMQ of `scripts/setup-activemq`
/// (`GEARSHIFT_TEST_ACTIVEMQ_URL`, else `target/activemq/url`, which the
/// script writes). Panics naming the script when neither is there: a test
/// on ActiveMQ fails loudly, it is never skipped.
pub fn activemq_url() -> String {
    if let Ok(u) = std::env::var("GEARSHIFT_TEST_ACTIVEMQ_URL") {
        return u;
    }
    let path = repo_root().join("target/activemq/url");
    match std::fs::read_to_string(&path) {
        Ok(u) if !u.trim().is_empty() => u.trim().to_string(),
        other => panic!(
            "no ActiveMQ for this test: GEARSHIFT_TEST_ACTIVEMQ_URL is not set and {} \
             cannot be read ({other:?}); run scripts/setup-activemq",
            path.display()
        ),
    }
}

/// The real-broker transports every bus-level integration test runs on.
pub fn real_bus_urls() -> [(&'static str, String); 2] {
    [("amqp", amqp_url()), ("stomp", stomp_url())]
}

/// Connection options for tests: fast reconnects, bounded waits.
pub fn test_options(name: &str) -> ConnectOptions {
    ConnectOptions {
        name: format!("gearshift-test-{name}"),
        heartbeat: Duration::from_secs(5),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
        op_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(10),
        ..ConnectOptions::default()
    }
}

/// Connects to `url`, failing the test loudly if the broker is not there.
pub async fn connect(url: &str, name: &str) -> SharedBus {
    match gearshift_bus::connect(url, test_options(name)).await {
        Ok(b) => b,
        Err(e) => panic!(
            "cannot reach the test broker at {} ({e}); run scripts/setup-rabbitmq",
            gearshift_bus::url::redact(url)
        ),
    }
}

/// The Python interpreter with the test packages (`scripts/test-deps`).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("GEARSHIFT_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = repo_root().join("target/test-venv/bin/python3");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test-deps (it creates the test virtualenv)",
        venv.display()
    );
    venv
}

/// A short unique token for queue names, routing keys and node names.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Installs a test log subscriber once (RUST_LOG controls it; default warn).
pub fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new().with_default(tracing::Level::WARN)
        });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .try_init();
}
