//! Crash safety of evacuation with the real `gearshift-node` binary: 50 gears
//! of random files (dir runtime) are evacuated while the agent is killed
//! with SIGKILL at random moments and restarted each time. In the end every
//! gear exists exactly once, at its target, with identical content; nothing
//! is left half-copied or half-deleted. Runs on AMQP and on STOMP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gearshift_node::runtime::dir::{Manifest, manifest};
use gearshift_proto::Envelope;
use gearshift_proto::msg::{CommandResult, Evacuate, GearOutcome, Message, Move};
use gearshift_tests::node_harness::{Controller, Keys, Verified, unique};
use gearshift_tests::node_process::{NodeProcess, write_file};
use gearshift_tests::{amqp_url, init_logging, stomp_url};
use rand::{Rng, RngCore, SeedableRng};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const GEARS: usize = 50;
const KILLS: u32 = 6;
const TARGETS: usize = 3;

fn gear_dir(base: &Path, node: &str) -> PathBuf {
    base.join("nodes").join(node).join("gears")
}

/// Creates `GEARS` gears of random files; returns each gear's manifest.
fn make_gears(root: &Path, rng: &mut impl RngCore) -> BTreeMap<String, Manifest> {
    let mut out = BTreeMap::new();
    for i in 0..GEARS {
        let id = format!("{:024x}", 0x5480_c40b_ac2c_4a2c_u128 * 1000 + i as u128);
        let g = root.join(&id);
        std::fs::create_dir_all(g.join("app-root/data")).unwrap();
        let files = rng.random_range(1..=5);
        for f in 0..files {
            let size = rng.random_range(0..200_000);
            let mut data = vec![0u8; size];
            rng.fill_bytes(&mut data);
            let sub = if f % 2 == 0 { "app-root/data" } else { "" };
            std::fs::write(g.join(sub).join(format!("file-{f}.bin")), data).unwrap();
        }
        std::fs::write(
            g.join(".state"),
            if i % 3 == 0 { "idle" } else { "started" },
        )
        .unwrap();
        out.insert(id.clone(), manifest(&g, &CancellationToken::new()).unwrap());
    }
    out
}

/// Every gear is complete somewhere: here, or (when gone from here) at its target.
fn assert_nothing_lost(
    base: &Path,
    node: &str,
    plan: &BTreeMap<String, String>,
    want: &BTreeMap<String, Manifest>,
) {
    for (gear, target) in plan {
        let src = gear_dir(base, node).join(gear);
        let dst = gear_dir(base, target).join(gear);
        let at_src = src.is_dir()
            && manifest(&src, &CancellationToken::new()).ok().as_ref() == Some(&want[gear]);
        let at_dst = dst.is_dir()
            && manifest(&dst, &CancellationToken::new()).ok().as_ref() == Some(&want[gear]);
        assert!(
            at_src || at_dst,
            "gear {gear} is complete neither at the source nor at {target}"
        );
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The node's `node.toml` in `base`: the `dir` runtime, fast reports and
/// retries, a slow copy (so that kills land mid-move), a 3 s grace.
fn write_node_config(base: &Path, node: &str, url: &str) -> PathBuf {
    write_file(
        base,
        "node.toml",
        &format!(
            r#"
[node]
name = "{node}"
[bus]
url = "{url}"
reconnect_min = "50ms"
reconnect_max = "500ms"
[keys]
signing_key = "{base}/node.key"
broker_keys = ["{base}/broker.pub"]
[state]
dir = "{base}/state"
[report]
interval = "1s"
scan_interval = "200ms"
min_gap = "50ms"
[runtime]
kind = "dir"
[runtime.dir]
root = "{base}/nodes/{node}/gears"
target_root = "{base}/nodes/{{target}}/gears"
max_bytes_per_sec = 700000
[evacuation]
parallelism = 4
backoff_min = "50ms"
backoff_max = "200ms"
[service]
shutdown_grace = "3s"
"#,
            base = base.display()
        ),
    )
}

/// What the test evacuates and where each gear goes.
struct Setup {
    node: String,
    targets: Vec<String>,
    want: BTreeMap<String, Manifest>,
    plan: BTreeMap<String, String>,
}

/// The node's gear directories (with random gears) and its targets'.
fn setup(base: &Path, rng: &mut impl RngCore) -> Setup {
    let node = unique("n-kill-");
    let targets: Vec<String> = (0..TARGETS).map(|i| format!("{node}-t{i}")).collect();
    for n in std::iter::once(&node).chain(&targets) {
        std::fs::create_dir_all(gear_dir(base, n)).unwrap();
    }
    let want = make_gears(&gear_dir(base, &node), rng);
    let plan: BTreeMap<String, String> = want
        .keys()
        .enumerate()
        .map(|(i, g)| (g.clone(), targets[i % TARGETS].clone()))
        .collect();
    Setup {
        node,
        targets,
        want,
        plan,
    }
}

async fn evacuation_survives_sigkill(url: &str) {
    init_logging();
    let seed: u64 = rand::rng().random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let keys = Keys::new();
    let ctl = Controller::connect(url, keys.clone()).await;
    let base = tempfile::tempdir().unwrap();
    let base = base.path();
    let su = setup(base, &mut rng);
    let node = &su.node;

    // Keys and configuration of the node.
    let (_, _, node_key) = gearshift_service::keys::write_keypair(base, "node", false).unwrap();
    write_file(base, "broker.pub", &keys.broker.public_pem());
    let config = write_node_config(base, node, url);
    let mut proc = NodeProcess::new(config.clone(), base.join("node.log"));
    ctl.prepare(node).await;
    let mut events = ctl.events(node, &node_key).await;

    proc.start();
    let moves: Vec<Move> = su
        .plan
        .iter()
        .map(|(g, t)| Move {
            gear: g.clone(),
            target: t.clone(),
        })
        .collect();
    let evacuate = Evacuate {
        moves,
        parallelism: None,
        deadline: None,
        watch: false,
        epoch: 0,
    };
    let cmd = ctl.send(node, evacuate, Some("kill-test")).await;
    let done = kill_until_done(&mut proc, &mut events, cmd, &mut rng, base, &su).await;
    let done = match done {
        Some(d) => d,
        None => wait_done(&proc, &mut events, cmd).await,
    };
    assert_eq!(done.corr.as_deref(), Some("kill-test"));
    check_result(&done, &su.plan);
    check_arrivals(base, &su);
    check_status(&config);
    assert_eq!(
        proc.terminate(Duration::from_secs(20)),
        Some(0),
        "clean exit on SIGTERM"
    );
    let log = std::fs::read_to_string(base.join("node.log")).unwrap();
    let resumed = log.matches("resuming an interrupted evacuation").count();
    println!("the evacuation was resumed {resumed} times");
    assert!(
        resumed >= 1,
        "at least one restart resumed the evacuation from its checkpoint"
    );
}

/// Kills the agent at random moments, restarting each time and checking
/// on the way that no gear is ever lost; once, a SIGTERM instead. Returns
/// the `event.done` if it came before the last kill.
async fn kill_until_done(
    proc: &mut NodeProcess,
    events: &mut Verified,
    cmd: Uuid,
    rng: &mut impl RngCore,
    base: &Path,
    su: &Setup,
) -> Option<Envelope> {
    let mut done = None;
    let mut kills = 0;
    let mut progress_seen = 0;
    while kills < KILLS {
        let wait = Duration::from_millis(rng.random_range(200..1000));
        let until = tokio::time::Instant::now() + wait;
        while let Ok(Ok(Some(d))) = tokio::time::timeout_at(until, events_next_raw(events)).await {
            match &d.msg {
                Message::Progress(p) if p.cmd == cmd => progress_seen += 1,
                Message::Done(x) if x.cmd == cmd => done = Some(d.clone()),
                _ => {}
            }
        }
        if done.is_some() {
            break;
        }
        if let Some(code) = proc.exited() {
            panic!("the agent exited by itself ({code:?})\n{}", proc.log_tail());
        }
        if kills == KILLS / 2 {
            // Once, a graceful stop instead: SIGTERM lets the moves in
            // flight finish (grace 3 s) and the agent exits 0.
            let t = Instant::now();
            assert_eq!(
                proc.terminate(Duration::from_secs(15)),
                Some(0),
                "SIGTERM mid-evacuation"
            );
            println!("SIGTERM mid-evacuation: exited in {:?}", t.elapsed());
        } else {
            proc.kill();
        }
        kills += 1;
        assert_nothing_lost(base, &su.node, &su.plan, &su.want);
        proc.start();
    }
    println!("killed {kills} times; {progress_seen} progress events seen before the last restart");
    assert!(
        kills >= 3,
        "the agent was killed at least 3 times before it finished (killed {kills} times)"
    );
    done
}

/// The `event.done` of the evacuation, within 180 s of the last restart.
async fn wait_done(proc: &NodeProcess, events: &mut Verified, cmd: Uuid) -> Envelope {
    let started = Instant::now();
    let d = tokio::time::timeout(
        Duration::from_secs(180),
        events.until(
            Duration::from_secs(180),
            "event.done of the evacuation",
            |e| matches!(&e.msg, Message::Done(x) if x.cmd == cmd),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("no event.done\n{}", proc.log_tail()));
    println!("finished {:?} after the last restart", started.elapsed());
    d
}

/// Every gear moved (or already moved) to its planned target.
fn check_result(done: &Envelope, plan: &BTreeMap<String, String>) {
    match &done.msg {
        Message::Done(d) => match &d.result {
            CommandResult::Evacuated {
                moved,
                failed,
                results,
                gears_left,
            } => {
                assert_eq!(
                    (*moved as usize, *failed, *gears_left),
                    (GEARS, 0, 0),
                    "{results:?}"
                );
                assert_eq!(results.len(), GEARS);
                for r in results {
                    assert!(
                        matches!(r.outcome, GearOutcome::Moved | GearOutcome::AlreadyMoved),
                        "{r:?}"
                    );
                    assert_eq!(r.target, plan[&r.gear]);
                }
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Every gear exactly once, at its target, identical; no leftovers.
fn check_arrivals(base: &Path, su: &Setup) {
    assert!(
        entries(&gear_dir(base, &su.node)).is_empty(),
        "source left with {:?}",
        entries(&gear_dir(base, &su.node))
    );
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for t in &su.targets {
        for name in entries(&gear_dir(base, t)) {
            assert!(!name.starts_with('.'), "leftover {name} at {t}");
            *seen.entry(name.clone()).or_default() += 1;
            assert_eq!(
                su.plan.get(&name),
                Some(t),
                "gear {name} at the wrong node {t}"
            );
            let m = manifest(&gear_dir(base, t).join(&name), &CancellationToken::new()).unwrap();
            assert_eq!(
                m, su.want[&name],
                "gear {name}: content differs after the move"
            );
        }
    }
    assert_eq!(seen.len(), GEARS, "every gear arrived");
    assert!(seen.values().all(|n| *n == 1), "each gear exactly once");
}

/// `gearshift-node status` reads the state directory while the agent runs.
fn check_status(config: &Path) {
    let out = std::process::Command::new(gearshift_tests::node_process::node_binary())
        .args(["status", "--json", "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["agent_running"], true);
    assert_eq!(st["operation"], serde_json::Value::Null);
    assert_eq!(st["last_operation"]["moved"], GEARS);
}

async fn events_next_raw(events: &mut Verified) -> Result<Option<Envelope>, ()> {
    Ok(Some(events.next(Duration::from_secs(3600)).await))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_evacuation_survives_sigkill() {
    evacuation_survives_sigkill(&amqp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stomp_evacuation_survives_sigkill() {
    evacuation_survives_sigkill(&stomp_url()).await;
}
