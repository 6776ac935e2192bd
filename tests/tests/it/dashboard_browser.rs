//! The broker agent's dashboard in a real browser (Debian's headless
//! Chromium): a broker agent with in-process node agents (sim runtime) on
//! the memory bus, one group draining a node slowly (so an operation is in
//! flight with progress) and another group exhausted (its cloud answers with
//! quota errors). The page is loaded by Chromium, its DOM checked for what it
//! must show, and a screenshot taken and checked; `/metrics` on the same
//! listener is checked too.
//!
//! `GEARSHIFT_DASHBOARD_SCREENSHOT=docs/dashboard.png` keeps the screenshot
//! (this is how the README's picture is made).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gearshift_broker::config::{BrokerConfig, GroupConfig};
use gearshift_broker::dashboard::Dashboard;
use gearshift_broker::status::Status;
use gearshift_handlers::{
    CreateOutcome, CreateRequest, Handler, HandlerConfig, HandlerError, RemoveOutcome,
    RemoveRequest,
};
use gearshift_node::runtime::sim::SimWorld;
use gearshift_proto::msg::{GearInfo, GearState};
use gearshift_service::config::Validate;
use gearshift_sim::demo::config;
use gearshift_sim::fleet::{Keys, NodeSpec, SimCloud, SimFleet};
use gearshift_tests::{init_logging, repo_root, unique};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A cloud with no quota left.
struct NoQuota;

#[async_trait]
impl Handler for NoQuota {
    fn kind(&self) -> &'static str {
        "no-quota"
    }
    async fn create_node(&self, _: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        Err(HandlerError::Quota(
            "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances".into(),
        ))
    }
    async fn remove_node(&self, r: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        Err(HandlerError::Permanent(format!("{} is not ours", r.node)))
    }
}

fn add_gears(world: &SimWorld, node: &str, active: u32, idle: u32) {
    for i in 0..active + idle {
        world.add_gear(
            node,
            GearInfo {
                id: format!("{node}-g{i}"),
                app: Some(format!("app-{node}-{i}")),
                state: if i < active {
                    GearState::Started
                } else {
                    GearState::Idle
                },
                uid: None,
                bytes: None,
                do_not_disrupt: false,
            },
        );
    }
}

fn chromium() -> PathBuf {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(c).is_file() {
            return PathBuf::from(c);
        }
    }
    panic!("chromium is not installed: run scripts/test-deps (Debian package chromium)");
}

/// Runs headless Chromium on `url` with `extra` flags; returns stdout.
fn browse(url: &str, extra: &[String], profile: &Path) -> String {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--virtual-time-budget=4000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().expect("wait for chromium").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("chromium output");
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(
        bytes.starts_with(&[0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n']),
        "not a PNG"
    );
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

/// Total size of the PNG's compressed image data.
fn png_idat_bytes(bytes: &[u8]) -> usize {
    let mut i = 8;
    let mut total = 0;
    while i + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap()) as usize;
        if &bytes[i + 4..i + 8] == b"IDAT" {
            total += len;
        }
        i += 12 + len;
    }
    total
}

/// The fleet: east/small at 25 % (one node will be drained, slowly),
/// west/large full.
async fn start_fleet(url: &str, keys: &Keys, dir: &Path) -> Arc<SimFleet> {
    let ncfg = config::complete_node(config::node_base().unwrap(), url, 1.0).unwrap();
    let nodes_bus = gearshift_tests::connect(url, "nodes").await;
    let world = SimWorld::new();
    world.set_move_time(Duration::from_millis(2500));
    let fleet = SimFleet::new(
        world.clone(),
        nodes_bus,
        ncfg,
        keys.clone(),
        &dir.join("nodes"),
    );
    for (name, district, profile, max, active, idle) in [
        ("node-1", "east", "small", 20, 6, 2),
        ("node-2", "east", "small", 20, 5, 3),
        ("node-3", "east", "small", 20, 4, 8),
        ("west-1", "west", "large", 10, 10, 0),
    ] {
        let s = NodeSpec::new(name, district, profile, max);
        fleet.add_to_world(&s).unwrap();
        add_gears(&world, name, active, idle);
        fleet.start_node(&s).unwrap();
    }
    fleet
}

/// The demo's broker configuration, a second group whose cloud has no
/// quota, one move at a time.
fn broker_config(url: &str, tag: &str, keys: &Keys, dir: &Path) -> BrokerConfig {
    let mut cfg = config::complete_broker(
        config::broker_base().unwrap(),
        &config::BrokerSetup {
            name: "dashboard-broker",
            state_dir: &dir.join("broker"),
            bus_url: url,
            tag,
            min_nodes: 1,
            speed: 1.0,
            signing_key: &keys.path("broker.key"),
        },
    )
    .unwrap();
    cfg.handlers.insert("quota".into(), HandlerConfig::Log {});
    cfg.groups.push(GroupConfig {
        district: "west".into(),
        profile: "large".into(),
        handler: Some("quota".into()),
        min_nodes: None,
        max_nodes: None,
        victim_strategy: None,
        shape: None,
    });
    cfg.policy.exhausted_after_quota_failures = 1;
    cfg.saga.evacuation_parallelism = 1;
    cfg.saga.evacuation_timeout = Duration::from_secs(120);
    cfg.validate().expect("valid configuration");
    cfg
}

/// Waits until a drain is under way (some gears moved, some left) and west
/// is exhausted; returns the drained node.
async fn drain_under_way(status: &mut watch::Receiver<Arc<Status>>) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = status.borrow_and_update().clone();
        let drain = s.in_flight().find(|o| {
            o.kind == "scale_down"
                && o.progress
                    .is_some_and(|p| p.moved >= 1 && p.moved + 2 < p.total)
        });
        let exhausted = s
            .groups
            .iter()
            .any(|g| g.district == "west" && g.exhausted.is_some());
        if let (Some(d), true) = (drain, exhausted) {
            return d.node.clone().unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no drain in progress with an exhausted group within 60 s: {}",
            s.render()
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), status.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_in_headless_chromium() {
    init_logging();
    let tag = unique("dash");
    let url = format!("memory://{tag}");
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::generate(&dir.path().join("keys")).unwrap();
    let token = CancellationToken::new();
    let fleet = start_fleet(&url, &keys, dir.path()).await;
    let cfg = broker_config(&url, &tag, &keys, dir.path());
    let cloud = SimCloud::new(
        fleet.clone(),
        |i| format!("node-{i}"),
        4,
        20,
        Duration::from_millis(500),
        token.clone(),
    );
    let broker_bus = gearshift_tests::connect(&url, "broker").await;
    let metrics = gearshift_broker::metrics::Metrics::new();
    let agent = gearshift_broker::Agent::builder(cfg, broker_bus)
        .signer(keys.broker.clone())
        .keyring(keys.broker_keyring().unwrap())
        .handler("cloud", cloud)
        .handler("quota", Arc::new(NoQuota))
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let mut status = agent.status();
    let dashboard = Dashboard::spawn(&agent, "dashboard-broker", token.clone());
    let router =
        gearshift_service::http::metrics_router(metrics.registry.clone()).merge(dashboard.router());
    let (addr, _) =
        gearshift_service::http::serve("127.0.0.1:0".parse().unwrap(), router, token.clone())
            .await
            .unwrap();
    let agent_task = tokio::spawn(agent.run(token.child_token()));
    let victim = drain_under_way(&mut status).await;
    // least_busy minimises the moves: node-2 holds 8 gears (5 active),
    // node-3 12 (4 active), node-1 8 (6 active).
    assert_eq!(victim, "node-2", "the node cheapest to empty is drained");

    let page = format!("http://{addr}/");
    let profile = tempfile::tempdir().unwrap();
    check_page(&page, profile.path()).await;
    check_screenshot(&page, profile.path()).await;
    check_metrics_and_api(&addr.to_string()).await;

    token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), agent_task).await;
    fleet.stop_all().await;
}

/// The page's DOM, in Chromium: groups, decisions, the drain's progress,
/// the exhausted group, explanations.
async fn check_page(page: &str, profile: &Path) {
    let p = profile.to_path_buf();
    let page2 = page.to_string();
    let dom = tokio::task::spawn_blocking(move || browse(&page2, &["--dump-dom".into()], &p))
        .await
        .unwrap();
    assert!(
        dom.contains("data-loaded=\"yes\""),
        "the script did not render:\n{dom}"
    );
    assert!(dom.contains("id=\"nodes-count\">4<"), "4 nodes:\n{dom}");
    assert!(dom.contains("dashboard-broker"), "{dom}");
    for g in ["east/small", "west/large"] {
        assert!(
            dom.contains(&format!("data-group=\"{g}\"")),
            "group {g}:\n{dom}"
        );
    }
    assert!(
        dom.contains("data-kind=\"scale_down\""),
        "the scale-down decision:\n{dom}"
    );
    assert!(
        dom.contains("data-kind=\"exhausted\""),
        "the exhaustion decision:\n{dom}"
    );
    assert!(
        dom.contains("COMPACT_THRESHOLD"),
        "the decision's reason:\n{dom}"
    );
    let ops = &dom[dom.find("id=\"ops\"").expect("operations table")..];
    let ops = &ops[..ops.find("</table>").unwrap()];
    assert!(ops.contains("node-2"), "{ops}");
    assert!(ops.contains("evacuating"), "{ops}");
    assert!(ops.contains("gears moved"), "progress of the drain: {ops}");
    let exhausted = &dom[dom.find("id=\"exhausted\"").expect("exhausted list")..];
    let exhausted = &exhausted[..exhausted.find("</ul>").unwrap()];
    assert!(exhausted.contains("west/large"), "{exhausted}");
    assert!(exhausted.contains("Quota exceeded"), "{exhausted}");
    assert!(dom.contains("class=\"expl\""), "explanations:\n{dom}");
}

/// A screenshot of the same page: its size, and not blank.
async fn check_screenshot(page: &str, profile: &Path) {
    let shot = profile.join("dashboard.png");
    let p = profile.join("profile2");
    let arg = format!("--screenshot={}", shot.display());
    let page = page.to_string();
    tokio::task::spawn_blocking(move || browse(&page, &[arg], &p))
        .await
        .unwrap();
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert_eq!(png_size(&png), (1280, 900));
    // A blank or error page compresses to a few kilobytes; this page has
    // tables, bars and text.
    assert!(
        png_idat_bytes(&png) > 40_000,
        "the screenshot looks empty ({} bytes of image data)",
        png_idat_bytes(&png)
    );
    if let Ok(keep) = std::env::var("GEARSHIFT_DASHBOARD_SCREENSHOT") {
        let dest = repo_root().join(keep);
        std::fs::copy(&shot, &dest).unwrap();
        eprintln!("screenshot saved to {}", dest.display());
    }
}

/// `/metrics` and `/api/dashboard` on the same listener.
async fn check_metrics_and_api(addr: &str) {
    gearshift_cloud::http::install_tls_provider();
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "gearshift_broker_reports_total",
        "gearshift_broker_decisions_total{kind=\"scale_down\"} 1",
        "gearshift_broker_evacuation_gears{node=\"node-2\",state=\"total\"} 8",
        "gearshift_broker_group_exhausted{district=\"west\",profile=\"large\"} 1",
        "gearshift_broker_sagas{kind=\"scale_down\",state=\"evacuating\"} 1",
        "gearshift_broker_decision_latency_seconds_bucket",
        "gearshift_broker_bus_connected 1",
        "gearshift_broker_bus_reconnects_total 0",
        "gearshift_broker_nodes 4",
    ] {
        assert!(
            text.contains(needle),
            "{needle} missing from /metrics:\n{text}"
        );
    }
    let api: serde_json::Value = reqwest::get(format!("http://{addr}/api/dashboard"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(api["status"]["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(api["exhausted"][0]["district"], "west");
}
