//! The scale-down saga on OpenShift (issue 15, item 2), end to end over
//! AMQP and STOMP: the broker agent with `[paas] kind = "openshift"` runs the
//! stand-in `oo-admin-ctl-district` and `oo-admin-move`
//! (`tests/standins/openshift/`); three node agents with the `openshift`
//! runtime read node roots laid out as `/var/lib/openshift`. While the
//! victim drains, the placement stand-in places new gears as the PaaS
//! broker would: none lands on it. The district records are checked after
//! each step: deactivated, gears moved with their UID to the district's
//! active nodes, removed from the district, then removed from the cloud.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use gearshift_broker::Agent;
use gearshift_broker::paas::PaasKind;
use gearshift_handlers::{
    CreateOutcome, CreateRequest, Handler, HandlerError, RemoveOutcome, RemoveRequest,
};
use gearshift_node::config::OpenshiftSection;
use gearshift_node::runtime::openshift::OpenshiftRuntime;
use gearshift_proto::msg::DecisionKind;
use gearshift_tests::broker_harness::{DecisionWatch, TestBed, eventually, fast_config};
use gearshift_tests::node_harness::Running;
use gearshift_tests::{amqp_url, stomp_url};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn standins() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("standins/openshift/bin")
}

/// The stand-in broker host: its state file, and its tools as an operator runs them.
struct Host {
    state: PathBuf,
}

impl Host {
    fn run(&self, tool: &str, args: &[&str]) -> String {
        let out = Command::new(standins().join(tool))
            .args(args)
            .env("GEARSHIFT_OO_STATE", &self.state)
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e} (python3 is needed)"));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{tool} {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    fn dump(&self) -> Value {
        serde_json::from_str(&self.run("oo-standin", &["dump"])).expect("state JSON")
    }

    /// `host`'s record in the district, if it is in it.
    fn server(&self, district: &str, host: &str) -> Option<Value> {
        let st = self.dump();
        st["districts"][district]["servers"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == host)
            .cloned()
    }
}

/// The cloud: removing a node stops its agent. It notes whether the node
/// had left its district when it was asked (remove-node comes first).
struct Cloud {
    host: Host,
    district: String,
    nodes: Mutex<BTreeMap<String, Running>>,
    removed: Mutex<Vec<(String, bool)>>,
}

#[async_trait]
impl Handler for Cloud {
    fn kind(&self) -> &'static str {
        "test-cloud"
    }

    async fn create_node(&self, _: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        Err(HandlerError::Permanent("this test never scales up".into()))
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let in_district = self.host.server(&self.district, &req.node).is_some();
        self.removed
            .lock()
            .unwrap()
            .push((req.node.clone(), in_district));
        let running = self.nodes.lock().unwrap().remove(&req.node);
        if let Some(r) = running {
            r.stop().await;
        }
        Ok(RemoveOutcome {
            detail: "stopped".into(),
            gone: true,
        })
    }
}

fn start_node(bed: &TestBed, name: &str, root: &Path) -> Running {
    let mut c = gearshift_node::AgentConfig::new(
        name,
        bed.keys.node.clone(),
        bed.keys.broker_only(),
        bed.path(&format!("nodes/{name}")),
    );
    c.report.interval = Duration::from_millis(500);
    c.report.scan_interval = Duration::from_millis(100);
    c.report.min_gap = Duration::from_millis(20);
    c.shutdown_grace = Duration::from_secs(2);
    c.fsync = false;
    c.write_status_file = false;
    let rt = OpenshiftRuntime::new(&OpenshiftSection {
        root: root.to_path_buf(),
        ..Default::default()
    });
    Running::start(c, bed.nodes_bus.clone(), Arc::new(rt))
}

async fn scale_down_drives_openshift(url: String) {
    let bed = TestBed::new("os", |_| url).await;
    let host = Host {
        state: bed.path("oo-state.json"),
    };
    host.run("oo-standin", &["init"]);
    let names: Vec<String> = ["a", "b", "v"]
        .iter()
        .map(|s| format!("{}-{s}", bed.tag))
        .collect();
    for n in &names {
        let root = bed.path(&format!("roots/{n}"));
        host.run(
            "oo-standin",
            &["node-add", n, root.to_str().unwrap(), "--profile", "small"],
        );
    }
    let created = host.run(
        "oo-admin-ctl-district",
        &["-c", "create", "-n", "dist", "-p", "small"],
    );
    let district = created
        .lines()
        .find_map(|l| l.strip_prefix("Successfully created district: "))
        .expect("the district's UUID")
        .trim()
        .to_string();
    host.run(
        "oo-admin-ctl-district",
        &["-c", "add-node", "-n", "dist", "-i", &names.join(",")],
    );
    // a and b hold three gears each, the victim v two (one application, two gears).
    let mut gears = BTreeMap::new();
    for (node, count) in [(&names[0], 3), (&names[1], 3), (&names[2], 2)] {
        for i in 0..count {
            let gear = format!(
                "{}{i:02}{}",
                &bed.tag[..bed.tag.len().min(8)],
                &node[node.len() - 1..]
            );
            let gear = format!(
                "{:0<24}",
                gear.replace(|c: char| !c.is_ascii_alphanumeric(), "")
            );
            let uid = host.run(
                "oo-standin",
                &["gear-add", node, &gear, "--app", &format!("app{node}")],
            );
            gears.insert(gear, (node.clone(), uid.trim().parse::<u64>().unwrap()));
        }
    }
    let victim = names[2].clone();
    let victim_gears: Vec<String> = gears
        .iter()
        .filter(|(_, (n, _))| *n == victim)
        .map(|(g, _)| g.clone())
        .collect();

    let cloud = Arc::new(Cloud {
        host: Host {
            state: host.state.clone(),
        },
        district: district.clone(),
        nodes: Mutex::new(BTreeMap::new()),
        removed: Mutex::new(vec![]),
    });
    for n in &names {
        let running = start_node(&bed, n, &bed.path(&format!("roots/{n}")));
        cloud.nodes.lock().unwrap().insert(n.clone(), running);
    }
    let mut cfg = fast_config(&bed.url, &bed.path("broker"), "cloud", &bed.tag);
    cfg.group_defaults.min_nodes = 2;
    cfg.saga.paas_retry = Duration::from_millis(500);
    cfg.paas.kind = PaasKind::OpenShift;
    cfg.paas.path = Some(format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        standins().display()
    ));
    cfg.paas.env.insert(
        "GEARSHIFT_OO_STATE".into(),
        host.state.display().to_string(),
    );
    // Each move takes three seconds: the drain lasts while new gears are placed.
    cfg.paas
        .env
        .insert("GEARSHIFT_OO_MOVE_DELAY".into(), "3".into());
    let watch_bus = bed.connect("watch").await;
    let mut watch = DecisionWatch::new(&watch_bus, &bed.keys.broker).await;
    let broker_bus = bed.connect("broker").await;
    let agent = Agent::builder(cfg, broker_bus)
        .signer(bed.keys.broker.clone())
        .keyring(bed.keys.broker_keyring().expect("broker keyring"))
        .handler("cloud", cloud.clone())
        .build()
        .expect("broker agent");
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move { agent.run(t).await.expect("broker agent run") });

    // The policy drains the least busy node.
    let down = watch
        .until("scale_down decision", |d| {
            d.decision == DecisionKind::ScaleDown
        })
        .await;
    assert_eq!(down.node.as_deref(), Some(victim.as_str()), "{down:?}");
    // Step 1: deactivated in its district (the node's district.info too).
    eventually("victim deactivated in its district", || {
        host.server(&district, &victim)
            .is_some_and(|s| s["active"] == false)
    })
    .await;
    let info = std::fs::read_to_string(bed.path(&format!(
        "roots/{victim}/var/lib/openshift/.settings/district.info"
    )))
    .unwrap();
    assert!(info.contains("active='false'"), "{info}");
    // New gears while it drains: the PaaS broker's placement skips it.
    for i in 0..4 {
        let placed = host.run("oo-standin", &["place", "--app", &format!("new{i}")]);
        assert_ne!(
            placed.trim(),
            victim,
            "a new gear landed on the draining node"
        );
    }
    // Steps 2 to 4: moved, removed from the district, removed from the cloud.
    let removed = watch
        .until("removed decision", |d| d.decision == DecisionKind::Removed)
        .await;
    assert_eq!(removed.node.as_deref(), Some(victim.as_str()));
    let st = host.dump();
    for g in &victim_gears {
        let rec = &st["gears"][g];
        let server = rec["server"].as_str().unwrap();
        assert!(server == names[0] || server == names[1], "{g} on {server}");
        assert_eq!(rec["uid"].as_u64(), Some(gears[g].1), "{g} kept its UID");
        let dir = bed.path(&format!("roots/{server}/var/lib/openshift/{g}"));
        assert!(dir.is_dir(), "{} holds the gear's directory", dir.display());
    }
    let moves = st["moves"].as_array().unwrap();
    assert_eq!(
        moves.len(),
        victim_gears.len(),
        "one oo-admin-move per gear: {moves:?}"
    );
    for m in moves {
        assert_eq!(
            (&m["target_active"], &m["same_district"], &m["uid_kept"]),
            (&Value::Bool(true), &Value::Bool(true), &Value::Bool(true)),
            "{m}"
        );
    }
    assert!(host.server(&district, &victim).is_none(), "remove-node ran");
    assert_eq!(
        *cloud.removed.lock().unwrap(),
        vec![(victim.clone(), false)],
        "the cloud removal came after remove-node"
    );
    let placements = st["placements"].as_array().unwrap();
    assert!(placements.iter().all(|p| p["node"] != victim.as_str()));
    // The tools' order: deactivate-node, the moves, remove-node.
    let calls: Vec<String> = st["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let argv: Vec<&str> = c["argv"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            format!("{} {}", c["tool"].as_str().unwrap_or(""), argv.join(" "))
        })
        .filter(|c| c.contains(&victim) || c.contains("oo-admin-move"))
        .collect();
    let pos = |what: &str| {
        calls
            .iter()
            .position(|c| c.contains(what))
            .unwrap_or(usize::MAX)
    };
    let last_move = calls
        .iter()
        .rposition(|c| c.contains("oo-admin-move"))
        .unwrap();
    assert!(pos("deactivate-node") < pos("oo-admin-move"), "{calls:#?}");
    assert!(
        last_move < pos("remove-node") && pos("remove-node") != usize::MAX,
        "{calls:#?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.contains("activate-node") && !c.contains("deactivate")),
        "{calls:#?}"
    );

    token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let rest: Vec<Running> = std::mem::take(&mut *cloud.nodes.lock().unwrap())
        .into_values()
        .collect();
    for r in rest {
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openshift_scale_down_amqp() {
    scale_down_drives_openshift(amqp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openshift_scale_down_stomp() {
    scale_down_drives_openshift(stomp_url()).await;
}
