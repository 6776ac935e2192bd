//! The `openshift` PaaS adapter against the OpenShift broker-host
//! stand-ins (`tests/standins/openshift/bin`: `oo-admin-ctl-district`,
//! `oo-admin-move` and `oo-standin`, which keep origin-server's rules,
//! messages and exit codes on a JSON state file named by
//! `GEARSHIFT_OO_STATE`), and against tiny scripts for what the stand-ins
//! do not do (hang, run in parallel, be missing).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gearshift_broker::paas::{
    Cause, OpenShiftAdapter, Outcome, PaasAdapter, PaasConfig, PaasError, PaasKind, Template, build,
};
use serde_json::Value;

const BIN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/standins/openshift/bin"
);

/// A stand-in broker host: a state file and node roots in a temporary directory.
struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let s = Scene {
            dir: tempfile::tempdir().unwrap(),
        };
        s.standin(&["init"]);
        s
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// The stand-ins first, then the absolute directories of our own PATH
    /// (for `python3`).
    fn path(&self) -> String {
        let own = std::env::var("PATH").unwrap_or_default();
        let mut dirs = vec![BIN.to_string()];
        dirs.extend(
            own.split(':')
                .filter(|d| d.starts_with('/'))
                .map(String::from),
        );
        dirs.join(":")
    }

    /// Runs a stand-in directly (to set the scene); returns its stdout.
    fn run(&self, tool: &str, args: &[&str]) -> String {
        let out = Command::new(Path::new(BIN).join(tool))
            .args(args)
            .env("GEARSHIFT_OO_STATE", self.state())
            .env("PATH", self.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn standin(&self, args: &[&str]) -> String {
        self.run("oo-standin", args)
    }

    /// Registers a node root (undistricted, no gears).
    fn node(&self, host: &str, profile: &str) {
        let root = self.dir.path().join("nodes").join(host);
        let root = root.to_str().unwrap();
        self.standin(&["node-add", host, root, "--profile", profile]);
    }

    /// Creates district `name` of `profile` holding `hosts`; returns its UUID.
    fn district(&self, name: &str, profile: &str, hosts: &[&str]) -> String {
        self.run(
            "oo-admin-ctl-district",
            &["-c", "create", "-n", name, "-p", profile],
        );
        if !hosts.is_empty() {
            let list = hosts.join(",");
            self.run(
                "oo-admin-ctl-district",
                &["-c", "add-node", "-n", name, "-i", &list],
            );
        }
        self.districts()
            .into_iter()
            .find(|d| d["name"] == name)
            .unwrap()["uuid"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Creates a gear on `host`; returns its UID.
    fn gear(&self, host: &str, uuid: &str) -> u64 {
        self.standin(&["gear-add", host, uuid])
            .trim()
            .parse()
            .unwrap()
    }

    fn dump(&self) -> Value {
        serde_json::from_str(&self.standin(&["dump"])).unwrap()
    }

    fn districts(&self) -> Vec<Value> {
        let d = self.dump()["districts"].as_object().unwrap().clone();
        d.into_values().collect()
    }

    /// The server record of `host` in any district.
    fn server(&self, host: &str) -> Option<Value> {
        self.districts().into_iter().find_map(|d| {
            d["servers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == host)
                .cloned()
        })
    }

    fn district_info(&self, host: &str) -> String {
        let p = self
            .dir
            .path()
            .join("nodes")
            .join(host)
            .join("var/lib/openshift/.settings/district.info");
        std::fs::read_to_string(p).unwrap_or_default()
    }

    /// `[paas]` for the stand-ins, with the default templates.
    fn config(&self) -> PaasConfig {
        let mut c = PaasConfig {
            kind: PaasKind::OpenShift,
            path: Some(self.path()),
            ..PaasConfig::default()
        };
        c.env.insert(
            "GEARSHIFT_OO_STATE".into(),
            self.state().display().to_string(),
        );
        c.check().unwrap();
        c
    }

    fn adapter(&self) -> OpenShiftAdapter {
        OpenShiftAdapter::new(&self.config())
    }

    /// Writes an executable script into the scene's directory.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }
}

fn cause(o: &Outcome) -> Cause {
    match o {
        Outcome::Refused { cause, .. } => *cause,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn already(o: &Outcome) -> bool {
    matches!(o, Outcome::AlreadyInState { .. })
}

#[tokio::test]
async fn deactivate_repeat_and_activate() {
    let s = Scene::new();
    s.node("n1.example.com", "small");
    let d1 = s.district("d1", "small", &["n1.example.com"]);
    let a = s.adapter();

    assert_eq!(
        a.deactivate(&d1, "n1.example.com").await.unwrap(),
        Outcome::Done
    );
    assert_eq!(s.server("n1.example.com").unwrap()["active"], false);
    // MCollective's set_district writes the node's file (openshift.rb:1061-1075).
    assert!(s.district_info("n1.example.com").contains("active='false'"));
    let again = a.deactivate(&d1, "n1.example.com").await.unwrap();
    assert!(already(&again), "{again:?}");
    assert!(again.is_success() && !again.is_retryable());

    assert_eq!(
        a.activate(&d1, "n1.example.com").await.unwrap(),
        Outcome::Done
    );
    assert_eq!(s.server("n1.example.com").unwrap()["active"], true);
    assert!(s.district_info("n1.example.com").contains("active='true'"));
    assert!(already(&a.activate(&d1, "n1.example.com").await.unwrap()));

    // The tool ran exactly as the default template says, without a shell.
    let calls = s.dump()["calls"].as_array().unwrap().clone();
    let last = calls.last().unwrap();
    assert_eq!(last["tool"], "oo-admin-ctl-district");
    assert_eq!(
        last["argv"],
        serde_json::json!(["-c", "activate-node", "-u", d1, "-i", "n1.example.com"])
    );
    // A node of no district (district.rb:186-188).
    s.node("n2.example.com", "small");
    let o = a.deactivate(&d1, "n2.example.com").await.unwrap();
    assert_eq!(cause(&o), Cause::NotInDistrict);
}

#[tokio::test]
async fn remove_node_needs_the_node_inactive_and_empty() {
    let s = Scene::new();
    s.node("n1.example.com", "small");
    let d1 = s.district("d1", "small", &["n1.example.com"]);
    s.gear("n1.example.com", "0f8a5e0ad9b54ab2a0be1b1c02a3b9f8");
    let a = s.adapter();

    let o = a.remove_node(&d1, "n1.example.com").await.unwrap();
    assert_eq!(cause(&o), Cause::NodeActive, "{o}");
    assert!(!o.is_retryable());
    assert_eq!(
        a.deactivate(&d1, "n1.example.com").await.unwrap(),
        Outcome::Done
    );
    let o = a.remove_node(&d1, "n1.example.com").await.unwrap();
    assert_eq!(cause(&o), Cause::NodeHasGears, "{o}");
    assert!(s.server("n1.example.com").is_some());

    s.standin(&["gear-remove", "0f8a5e0ad9b54ab2a0be1b1c02a3b9f8"]);
    assert_eq!(
        a.remove_node(&d1, "n1.example.com").await.unwrap(),
        Outcome::Done
    );
    assert!(s.server("n1.example.com").is_none());
    assert!(s.district_info("n1.example.com").contains("uuid='NONE'"));
    // Removed already: the goal holds.
    assert!(already(
        &a.remove_node(&d1, "n1.example.com").await.unwrap()
    ));
}

#[tokio::test]
async fn add_node_refusals_then_done() {
    let s = Scene::new();
    for (h, p) in [
        ("n1", "small"),
        ("busy", "small"),
        ("big", "medium"),
        ("new", "small"),
        ("gone", "small"),
    ] {
        s.node(&format!("{h}.example.com"), p);
    }
    let d1 = s.district("d1", "small", &["n1.example.com"]);
    let d2 = s.district("d2", "small", &[]);
    s.gear("busy.example.com", "a1b2c3d4e5f60718293a4b5c6d7e8f90");
    s.standin(&["node-set", "gone.example.com", "--unreachable"]);
    let a = s.adapter();
    let add = |host: &'static str, d: String| {
        let a = &a;
        async move { a.add_node(&d, host, "small").await.unwrap() }
    };

    // district.rb:128, :129-130, :124-126 (another district), tool:229-233.
    assert_eq!(
        cause(&add("busy.example.com", d1.clone()).await),
        Cause::NodeHasGears
    );
    let o = add("big.example.com", d1.clone()).await;
    assert_eq!(cause(&o), Cause::ProfileMismatch);
    assert!(
        o.to_string()
            .contains("is of node profile 'medium' and needs to be 'small'"),
        "{o}"
    );
    assert_eq!(
        cause(&add("n1.example.com", d2.clone()).await),
        Cause::InAnotherDistrict
    );
    let o = add("gone.example.com", d1.clone()).await;
    assert_eq!(cause(&o), Cause::NodeUnreachable);
    assert!(o.is_retryable());
    // tool:147 (as a UUID the tools accept).
    let o = add("new.example.com", "5fd7b2c1a9e04d1f8b3e6a2c".into()).await;
    assert_eq!(cause(&o), Cause::UnknownDistrict);

    assert_eq!(add("new.example.com", d1.clone()).await, Outcome::Done);
    assert_eq!(s.server("new.example.com").unwrap()["active"], true);
    assert!(
        s.district_info("new.example.com")
            .contains(&format!("uuid='{d1}'"))
    );
    // Added already (the district's document lists it): the goal holds.
    let again = add("new.example.com", d1.clone()).await;
    assert!(already(&again), "{again:?}");
}

#[tokio::test]
async fn moves_keep_the_uid_and_refuse_what_the_tool_refuses() {
    let s = Scene::new();
    for h in ["n1", "n2", "loose", "down"] {
        s.node(&format!("{h}.example.com"), "small");
    }
    let d1 = s.district(
        "d1",
        "small",
        &["n1.example.com", "n2.example.com", "down.example.com"],
    );
    let gear = "0f8a5e0ad9b54ab2a0be1b1c02a3b9f8";
    let uid = s.gear("n1.example.com", gear);
    s.standin(&["node-set", "down.example.com", "--unreachable"]);
    let a = s.adapter();

    assert_eq!(
        a.move_gear(gear, "n2.example.com").await.unwrap(),
        Outcome::Done
    );
    let st = s.dump();
    assert_eq!(st["gears"][gear]["server"], "n2.example.com");
    assert_eq!(st["gears"][gear]["uid"], uid);
    let rec = st["moves"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (rec["ok"].clone(), rec["same_district"].clone()),
        (true.into(), true.into())
    );
    assert_eq!(rec["target_district"], d1.as_str());
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(s.dir.path()).unwrap().uid() == 0 {
        // The stand-in owns gear directories by their UID only as root.
        assert_eq!(rec["uid_after"], uid, "{rec}");
    }
    assert!(
        s.dir
            .path()
            .join("nodes/n2.example.com/var/lib/openshift")
            .join(gear)
            .is_dir()
    );
    assert_eq!(
        rec["argv"],
        serde_json::json!(["--gear_uuid", gear, "-i", "n2.example.com"])
    );

    // proxy :2364-2366: the gear is on the target already.
    assert!(already(&a.move_gear(gear, "n2.example.com").await.unwrap()));
    // proxy :2064-2066, :3734; tool:101-110.
    let o = a.move_gear(gear, "loose.example.com").await.unwrap();
    assert_eq!(cause(&o), Cause::TargetNotDistricted);
    assert_eq!(
        cause(&a.move_gear(gear, "down.example.com").await.unwrap()),
        Cause::NodeUnreachable
    );
    let o = a
        .move_gear("ffffffffffffffffffffffffffffffff", "n1.example.com")
        .await
        .unwrap();
    assert_eq!(cause(&o), Cause::GearNotFound);
    assert_eq!(s.dump()["gears"][gear]["server"], "n2.example.com");
}

#[tokio::test]
async fn values_are_checked_before_anything_runs() {
    let s = Scene::new();
    let a = s.adapter();
    for (district, host) in [
        ("d1", "-c"),
        ("d1", "a,b"),
        ("--uuid", "n1"),
        ("d1", "n1 n2"),
        ("d1", ""),
    ] {
        let e = a.deactivate(district, host).await.unwrap_err();
        assert!(matches!(e, PaasError::BadValue { .. }), "{e}");
        assert!(!e.is_retryable());
    }
    let e = a.move_gear("g1,g2", "n1").await.unwrap_err();
    assert!(e.to_string().contains("{gear}"), "{e}");
    assert_eq!(s.dump()["calls"], serde_json::json!([]));
}

#[tokio::test]
async fn a_missing_tool_is_a_clear_error() {
    let s = Scene::new();
    let empty = s.dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let mut c = s.config();
    c.path = Some(empty.display().to_string());
    let e = OpenShiftAdapter::new(&c)
        .deactivate("d1", "n1")
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("cannot run oo-admin-ctl-district: not found in PATH")
            && text.contains(&empty.display().to_string()),
        "{text}"
    );
    assert!(!e.is_retryable());
    c.move_gear =
        Template::from_line("/nonexistent/oo-admin-move --gear_uuid {gear} -i {target}").unwrap();
    let e = OpenShiftAdapter::new(&c)
        .move_gear("g1", "n1")
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent/oo-admin-move: no such file"),
        "{e}"
    );
}

/// Whether process `pid` has ended (gone, or a zombie waiting for init).
fn ended(pid: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
        if stat.is_empty() || state == Some('Z') {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_hanging_tool_is_stopped_at_the_timeout_with_its_children() {
    let s = Scene::new();
    let pids = s.dir.path().join("pids");
    // One tool that dies on SIGTERM, one that ignores it (SIGKILL after kill_grace).
    let polite = s.script(
        "polite",
        &format!(
            "sleep 30 & echo $! >> {0}; echo started; wait",
            pids.display()
        ),
    );
    let stubborn = s.script(
        "stubborn",
        &format!(
            "trap '' TERM; sleep 30 & echo $! >> {0}; wait",
            pids.display()
        ),
    );
    // The stubborn one outlives SIGTERM: it ends at timeout + kill_grace.
    let ms = Duration::from_millis;
    for (script, at_least) in [(polite, ms(300)), (stubborn, ms(600))] {
        let mut c = s.config();
        c.timeout = ms(300);
        c.kill_grace = ms(300);
        c.deactivate = Template::from_args(&[script.to_str().unwrap(), "{host}"]).unwrap();
        let start = Instant::now();
        let o = OpenShiftAdapter::new(&c)
            .deactivate("d1", "n1")
            .await
            .unwrap();
        assert_eq!(o, Outcome::TimedOut);
        assert!(o.is_retryable());
        let took = start.elapsed();
        assert!(
            took >= at_least && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
    let pids = std::fs::read_to_string(&pids).unwrap();
    assert_eq!(pids.lines().count(), 2, "{pids}");
    for pid in pids.lines() {
        assert!(ended(pid), "sleep {pid} outlived its tool's timeout");
    }
}

#[tokio::test]
async fn moves_run_at_most_max_parallel_moves_at_once() {
    let s = Scene::new();
    let log = s.dir.path().join("log");
    let body = format!(
        "echo \"start $1 $(date +%s%N)\" >> {0}; sleep 0.2; echo \"end $1 $(date +%s%N)\" >> {0}",
        log.display()
    );
    let mover = s.script("mover", &body);
    let mut c = s.config();
    c.max_parallel_moves = 1;
    c.move_gear = Template::from_args(&[mover.to_str().unwrap(), "{gear}", "{target}"]).unwrap();
    let a = std::sync::Arc::new(OpenShiftAdapter::new(&c));
    let gears = ["g1", "g2", "g3"];
    let runs = gears.map(|g| {
        let a = a.clone();
        tokio::spawn(async move { a.move_gear(g, "n2").await.unwrap() })
    });
    for r in runs {
        assert_eq!(r.await.unwrap(), Outcome::Done);
    }
    // One move at a time: every start follows the previous end.
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        events,
        ["start", "end", "start", "end", "start", "end"],
        "{text}"
    );
}

#[tokio::test]
async fn none_runs_nothing() {
    let s = Scene::new();
    let a = build(&PaasConfig::default());
    assert_eq!(a.kind(), PaasKind::None);
    assert_eq!(a.deactivate("d1", "n1").await.unwrap(), Outcome::Done);
    assert_eq!(a.activate("d1", "n1").await.unwrap(), Outcome::Done);
    assert_eq!(
        a.add_node("d1", "n1", "small").await.unwrap(),
        Outcome::Done
    );
    assert_eq!(a.remove_node("d1", "n1").await.unwrap(), Outcome::Done);
    assert_eq!(a.move_gear("g1", "n2").await.unwrap(), Outcome::Done);
    assert_eq!(s.dump()["calls"], serde_json::json!([]));
    assert_eq!(build(&s.config()).kind(), PaasKind::OpenShift);
}

#[tokio::test]
async fn long_output_keeps_both_ends() {
    let runner = gearshift_broker::paas::Runner {
        path: None,
        env: vec![],
        max_output: 1024,
        kill_grace: Duration::from_secs(1),
    };
    let argv = [
        "/bin/sh",
        "-c",
        "echo first; head -c 200000 /dev/zero | tr '\\0' x; echo; echo last; echo oops >&2; exit 3",
    ]
    .map(String::from);
    let ran = runner.run(&argv, Duration::from_secs(20)).await.unwrap();
    assert!(!ran.timed_out);
    assert_eq!(ran.exit.code, Some(3));
    let out = &ran.exit.stdout;
    assert!(out.starts_with("first\nxxx"), "{out}");
    assert!(out.ends_with("xxx\nlast\n"), "{out}");
    assert!(
        out.contains("bytes not kept ...]") && out.len() < 1100,
        "{}",
        out.len()
    );
    assert_eq!(ran.exit.stderr, "oops\n");
}
