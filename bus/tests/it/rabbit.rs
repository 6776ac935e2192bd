//! The real RabbitMQ of these tests: its URLs, `rabbitmqctl`, unique names.

/// The AMQP URL of the test broker (`GEARSHIFT_TEST_AMQP_URL`).
pub fn amqp_url() -> String {
    std::env::var("GEARSHIFT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The STOMP URL of the test broker (`GEARSHIFT_TEST_STOMP_URL`).
pub fn stomp_url() -> String {
    std::env::var("GEARSHIFT_TEST_STOMP_URL")
        .unwrap_or_else(|_| "stomp://guest:guest@127.0.0.1:61613".into())
}

/// A name no other test (or helper running beside us) uses.
pub fn uniq() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// Runs `rabbitmqctl` on this machine; its standard output.
pub async fn rabbitmqctl(args: &[&str]) -> String {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .expect("run rabbitmqctl (is RabbitMQ installed on this machine?)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
