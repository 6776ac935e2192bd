//! The node agent's Heat actions and the `heat-via-node` handler against
//! real Heat, with the node's own (application credential) credentials.

use std::sync::Arc;
use std::time::Duration;

use gearshift_cloud::heat::StackId;
use gearshift_cloud::heat::scaling::SignalTarget;
use gearshift_handlers::config::HeatViaNodeConfig;
use gearshift_handlers::heat_via_node::HeatViaNodeHandler;
use gearshift_handlers::{
    CreateRequest, FleetView, GroupKey, Handler, HandlerContext, NodeShape, RemoveRequest,
};
use gearshift_node::config::{CredentialSource, HeatSection};
use gearshift_node::heat::{HeatSignaller, Signaller};
use gearshift_proto::msg::HeatAction;
use gearshift_proto::{KeyPair, Keyring, Role};
use gearshift_tests::node_harness::{
    Controller, Keys, Running, agent_config, connect, state_dir, temp_dir,
};
use gearshift_tests::node_process::{node_binary, write_file};
use gearshift_tests::node_scenarios::sim_world;
use serde_json::json;

use super::real::{self, Real, Stacks, added, members, removed, settle};

struct OneNode(String);
impl FleetView for OneNode {
    fn active_nodes(&self, _g: &GroupKey) -> Vec<String> {
        vec![self.0.clone()]
    }
}

fn group() -> GroupKey {
    GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    }
}

/// `[heat]` of a node whose member holds `server_id`, with the restricted
/// application credential (what a node would be given).
async fn section(r: &Real, top: &StackId, server_id: Option<&str>) -> HeatSection {
    let heat = &r.heat;
    HeatSection {
        scale_up_url: Some(real::output(heat, top, "scale_up_url").await),
        scale_down_url: Some(real::output(heat, top, "scale_down_url").await),
        signal_url: Some(real::output(heat, top, "scale_up_signal_url").await),
        stack_name: Some(top.name.clone()),
        stack_id: Some(top.id.clone()),
        server_id: server_id.map(str::to_string),
        credentials: CredentialSource::AuthEnv,
        auth_env: Some(r.appcred_env()),
        timeout: Duration::from_secs(30),
        ..HeatSection::default()
    }
}

pub async fn node_actions(r: Arc<Real>, stacks: Arc<Stacks>) {
    let heat = &r.heat;
    let top = stacks
        .create("gs-conf-node-", real::autoscaling_template(), json!({}))
        .await
        .stack_id();
    let up = SignalTarget {
        stack: top.clone(),
        group: "asg".into(),
        policy: "scale_up".into(),
    };
    let m0 = settle(heat, &up, 1).await;

    // scale_up (pre-signed alarm_url): checked, sent, confirmed started.
    let direct =
        HeatSignaller::new(&section(&r, &top, None).await, "n-direct.example.com").unwrap();
    let out = direct
        .signal(HeatAction::ScaleUp, "conformance")
        .await
        .unwrap();
    assert_eq!(out.status, 200);
    assert!(
        out.detail.contains("Heat started scaling"),
        "{}",
        out.detail
    );
    let m1 = settle(heat, &up, 2).await;
    assert_eq!(added(&m0, &m1).len(), 1);

    via_node(&r, &top, &up, &direct, &m1).await;
}

/// A node agent whose member is `m1[1]`, driven by heat-via-node over
/// RabbitMQ, between the node's direct `signal` and `scale_down`.
async fn via_node(
    r: &Real,
    top: &StackId,
    up: &SignalTarget,
    direct: &HeatSignaller,
    m1: &[(String, String)],
) {
    let heat = &r.heat;
    let node = gearshift_tests::unique("n-conf-") + ".example.com";
    let (handler, running, _dir) = start_node(r, top, &node, &m1[1].1).await;
    let create = CreateRequest {
        op: "op-hvn-1".into(),
        group: group(),
        shape: NodeShape::default(),
        attempt: 1,
        epoch: 0,
    };
    let out = handler.create_node(&create).await.unwrap();
    assert!(
        out.detail.contains("Heat started scaling"),
        "{}",
        out.detail
    );
    let m2 = settle(heat, up, 3).await;
    assert_eq!(added(m1, &m2).len(), 1);

    // signal (signal_url with a token, Aodh-shaped body): one more, readable event.
    let out = direct
        .signal(HeatAction::Signal, "conformance signal")
        .await
        .unwrap();
    assert!(
        out.detail.contains("Heat started scaling"),
        "{}",
        out.detail
    );
    let m3 = settle(heat, up, 4).await;
    assert_eq!(added(&m2, &m3).len(), 1);
    let ev = heat.signal_events(top, "scale_up", 1).await.unwrap();
    let reason = ev[0].resource_status_reason.clone().unwrap_or_default();
    assert!(
        reason.contains("n-direct.example.com: conformance signal"),
        "{reason}"
    );

    // At max_size (4): refused before sending, as Heat would ignore it.
    let e = direct
        .signal(HeatAction::ScaleUp, "one too many")
        .await
        .unwrap_err();
    assert!(e.message.contains("max_size 4") && e.retryable, "{e:?}");

    // scale_down by hand (`gearshift-node heat-signal`): Heat removes the oldest.
    heat_signal_binary(r, top, "scale_down").await;
    let m4 = settle(heat, up, 3).await;
    assert_eq!(removed(&m3, &m4), [m3[0].0.clone()]);

    // heat-via-node removal: the node marks its own member and has Heat drop exactly it.
    assert!(
        m4.iter().any(|(_, p)| *p == m1[1].1),
        "the node's member is still there"
    );
    let req = RemoveRequest {
        op: "op-hvn-2".into(),
        group: group(),
        node: node.clone(),
        cloud_id: None,
        attempt: 1,
        epoch: 0,
    };
    let out = handler.remove_node(&req).await.unwrap();
    assert!(out.detail.contains("Heat is removing it"), "{}", out.detail);
    let m5 = settle(heat, up, 2).await;
    let victim: Vec<String> = m4
        .iter()
        .filter(|(_, p)| *p == m1[1].1)
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(removed(&m4, &m5), victim, "exactly the node's own member");
    running.stop().await;
    assert_eq!(members(heat, top, "asg").await, m5);
}

/// A real node agent (sim gear runtime) with a Heat signaller for the
/// member holding `server_id`, and the heat-via-node handler that asks it.
async fn start_node(
    r: &Real,
    top: &StackId,
    node: &str,
    server_id: &str,
) -> (HeatViaNodeHandler, Running, tempfile::TempDir) {
    let url = gearshift_tests::amqp_url();
    let keys = Keys::new();
    let node_key = KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (_w, rt, _) = sim_world(node, 0);
    let mut cfg = agent_config(node, &node_key, &keys, &state_dir(dir.path(), node));
    let heat = section(r, top, Some(server_id)).await;
    cfg.signaller = Some(Arc::new(HeatSignaller::new(&heat, node).unwrap()));
    // The node's command queue exists before the first command is sent.
    Controller::connect(&url, keys.clone())
        .await
        .prepare(node)
        .await;
    let running = Running::start(cfg, connect(&url, node).await, rt);
    let mut keyring = Keyring::new();
    keyring.add(node_key.public(), Role::Node, "nodes");
    let ctx = HandlerContext {
        bus: Some(connect(&url, "conf-broker").await),
        signer: Some(Arc::new(keys.broker.clone())),
        keyring: Some(Arc::new(keyring)),
        agent: "broker".into(),
        bus_url: url.clone(),
        fleet: Arc::new(OneNode(node.to_string())),
    };
    let mut c: HeatViaNodeConfig = toml::from_str("").unwrap();
    c.node_timeout = Duration::from_secs(90);
    c.command_ttl = Duration::from_secs(120);
    (HeatViaNodeHandler::new(c, &ctx).unwrap(), running, dir)
}

/// `gearshift-node heat-signal <action>` with the application credential.
async fn heat_signal_binary(r: &Real, top: &StackId, action: &str) {
    let dir = temp_dir();
    let heat = section(r, top, None).await;
    let config = write_file(
        dir.path(),
        "node.toml",
        &format!(
            "[node]\nname = \"n-cli.example.com\"\n[heat]\nscale_down_url = \"{}\"\ncredentials = \"auth_env\"\nauth_env = \"{}\"\n",
            heat.scale_down_url.unwrap(),
            r.appcred_env().display()
        ),
    );
    let bin = node_binary();
    let action = action.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args([
                "heat-signal",
                &action,
                "--reason",
                "conformance by hand",
                "--config",
            ])
            .arg(&config)
            .env_remove("OS_AUTH_URL")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Heat started scaling"), "{stdout}");
}
