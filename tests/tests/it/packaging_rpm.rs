//! The RPMs of both agents, as `scripts/package` builds them: their file
//! lists, flags and scriptlets, an installation into a temporary root (with
//! the scriptlets run by a real shell copied into it), the installed
//! binary's `check-config` on the installed configuration (with the unit's
//! environment), the unit's settings against the configuration's defaults,
//! the sysusers entry, `systemd-analyze verify` on the units, and an erase
//! that keeps a modified configuration as `.rpmsave`.
//!
//! Builds with `--profile dev` so that CI does not build release twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use gearshift_tests::repo_root;

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e} (scripts/test-deps installs rpm)"))
}

fn ok(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Both RPMs, built once per test process: agent name -> path.
fn rpms() -> &'static BTreeMap<String, PathBuf> {
    static RPMS: OnceLock<BTreeMap<String, PathBuf>> = OnceLock::new();
    RPMS.get_or_init(|| {
        let root = repo_root();
        let mut cmd = Command::new(root.join("scripts/package"));
        // scripts/package runs cargo: without this test's crate variables.
        gearshift_tests::bins::without_crate_env(&mut cmd)
            .args(["--profile", "dev"])
            .current_dir(&root)
            .stderr(Stdio::inherit());
        let out = ok(&mut cmd);
        let mut m = BTreeMap::new();
        for line in out.lines().filter(|l| l.ends_with(".rpm")) {
            let p = root.join(line.trim());
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let agent = if name.starts_with("gearshift-broker-") {
                "broker"
            } else if name.starts_with("gearshift-node-") {
                "node"
            } else {
                panic!("unexpected package {name}")
            };
            assert!(p.is_file(), "{} does not exist", p.display());
            m.insert(agent.to_string(), p);
        }
        assert_eq!(m.len(), 2, "scripts/package printed {out:?}");
        m
    })
}

fn rpm_q(rpm: &Path, args: &[&str]) -> String {
    ok(Command::new("rpm").arg("-qp").args(args).arg(rpm))
}

/// `path flags` per file.
fn file_flags(rpm: &Path) -> BTreeMap<String, String> {
    rpm_q(rpm, &["--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]"])
        .lines()
        .map(|l| {
            let (p, f) = l.split_once(' ').unwrap_or((l, ""));
            (p.to_string(), f.trim().to_string())
        })
        .collect()
}

fn expected_files(agent: &str) -> Vec<String> {
    let mut v = vec![
        format!("/etc/gearshift/{agent}.toml"),
        format!("/usr/bin/gearshift-{agent}"),
        format!("/usr/lib/systemd/system/gearshift-{agent}.service"),
        format!("/usr/share/doc/gearshift-{agent}/README.md"),
        format!("/usr/share/doc/gearshift-{agent}/protocol.md"),
    ];
    if agent == "broker" {
        v.push("/usr/lib/sysusers.d/gearshift.conf".into());
    }
    v.sort();
    v
}

#[test]
fn packaging_rpm_contents_flags_and_scriptlets() {
    for (agent, rpm) in rpms() {
        let list: Vec<String> = rpm_q(rpm, &["-l"]).lines().map(str::to_string).collect();
        let mut sorted = list.clone();
        sorted.sort();
        assert_eq!(sorted, expected_files(agent), "files of {}", rpm.display());

        let flags = file_flags(rpm);
        let conf = format!("/etc/gearshift/{agent}.toml");
        assert_eq!(
            flags[&conf], "cn",
            "{conf} must be %config(noreplace): {flags:?}"
        );
        for (p, f) in &flags {
            if p.starts_with("/usr/share/doc/") {
                assert_eq!(f, "d", "{p} is documentation");
            } else if p != &conf {
                assert_eq!(f, "", "{p} has flags {f:?}");
            }
        }
        let modes = rpm_q(
            rpm,
            &[
                "--qf",
                "[%{FILENAMES} %{FILEMODES:perms} %{FILEUSERNAME}\n]",
            ],
        );
        assert!(
            modes.contains(&format!("/usr/bin/gearshift-{agent} -rwxr-xr-x root")),
            "{modes}"
        );

        let unit = format!("gearshift-{agent}.service");
        let scripts = rpm_q(rpm, &["--scripts"]);
        assert!(
            !scripts.contains("@UNIT@"),
            "unsubstituted template:\n{scripts}"
        );
        for (section, needle) in [
            (
                "postinstall scriptlet",
                "systemctl daemon-reload".to_string(),
            ),
            ("postinstall scriptlet", format!("preset {unit}")),
            ("preuninstall scriptlet", format!("disable --now {unit}")),
            ("postuninstall scriptlet", format!("try-restart {unit}")),
        ] {
            assert!(
                scripts.contains(section),
                "no {section} in {}:\n{scripts}",
                rpm.display()
            );
            assert!(scripts.contains(&needle), "{needle:?} missing:\n{scripts}");
        }
        if agent == "broker" {
            assert!(scripts.contains("systemd-sysusers"), "{scripts}");
        }

        let requires = rpm_q(rpm, &["-R"]);
        assert!(
            requires.lines().any(|l| l.trim() == "systemd"),
            "{requires}"
        );
        let info = rpm_q(rpm, &["-i"]);
        assert!(
            info.contains(&format!("Name        : gearshift-{agent}")),
            "{info}"
        );
        assert!(info.contains("License     : Apache-2.0"), "{info}");
    }
}

/// A temporary root with a shell (and the libraries it needs) so that the
/// scriptlets really run, and `/dev/null` for their redirections.
fn chroot_with_shell() -> tempfile::TempDir {
    let root = tempfile::Builder::new()
        .prefix("gearshift-rpmroot-")
        .tempdir()
        .unwrap();
    let r = root.path();
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let ldd = ok(Command::new("ldd").arg(&sh));
    let mut files = vec![sh.clone()];
    for tok in ldd.split_whitespace() {
        if tok.starts_with('/') {
            files.push(PathBuf::from(tok));
        }
    }
    for f in &files {
        let dest = r.join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(f, &dest).unwrap();
    }
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::copy(&sh, r.join("bin/sh")).unwrap();
    std::fs::create_dir_all(r.join("dev")).unwrap();
    std::fs::write(r.join("dev/null"), b"").unwrap();
    std::fs::create_dir_all(r.join("tmp")).unwrap();
    ok(Command::new("rpm").arg("--root").arg(r).arg("--initdb"));
    root
}

/// `key=value` lines of a unit's `[Service]` section (repeated keys joined).
fn unit_settings(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_string();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            m.entry(format!("{section}.{k}"))
                .or_default()
                .push(v.to_string());
        }
    }
    m
}

fn one<'a>(s: &'a BTreeMap<String, Vec<String>>, key: &str) -> &'a str {
    let v = s.get(key).unwrap_or_else(|| panic!("{key} missing"));
    assert_eq!(v.len(), 1, "{key} set {} times", v.len());
    &v[0]
}

#[test]
fn packaging_rpm_installs_into_a_root_and_its_units_hold_together() {
    let root = chroot_with_shell();
    let r = root.path();
    for (agent, rpm) in rpms() {
        install(r, agent, rpm);
        // The shipped configuration, as is.
        let installed_conf = r.join(format!("etc/gearshift/{agent}.toml"));
        assert_eq!(
            std::fs::read_to_string(&installed_conf).unwrap(),
            std::fs::read_to_string(repo_root().join(format!("conf/{agent}.toml"))).unwrap()
        );
        let unit_text = std::fs::read_to_string(
            r.join(format!("usr/lib/systemd/system/gearshift-{agent}.service")),
        )
        .unwrap();
        let u = unit_settings(&unit_text);
        check_unit(agent, &u);
        check_config_under_unit(r, agent, &installed_conf, &u);
        if agent == "broker" {
            check_broker_user(r, &u);
        } else {
            assert_eq!(one(&u, "Service.User"), "root", "moving gears needs root");
        }
        verify_unit(agent, &unit_text, r);
    }

    // Erasing keeps an operator's edited configuration as .rpmsave.
    let conf = r.join("etc/gearshift/broker.toml");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str("\n# edited by the operator\n");
    std::fs::write(&conf, &text).unwrap();
    let out =
        run(Command::new("rpm")
            .arg("--root")
            .arg(r)
            .args(["-e", "--nodeps", "gearshift-broker"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rpm -e: {err}");
    assert!(!err.contains("scriptlet failed"), "{err}");
    assert!(!r.join("usr/bin/gearshift-broker").exists());
    let saved = r.join("etc/gearshift/broker.toml.rpmsave");
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), text);
}

/// `rpm -i` of the agent's package into `r`: installed, every expected file.
fn install(r: &Path, agent: &str, rpm: &Path) {
    let out = run(Command::new("rpm")
        .arg("--root")
        .arg(r)
        .args(["-i", "--nodeps"])
        .arg(rpm));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rpm -i {}: {err}", rpm.display());
    assert!(!err.contains("scriptlet failed"), "{err}");
    let q = ok(Command::new("rpm")
        .arg("--root")
        .arg(r)
        .args(["-q", &format!("gearshift-{agent}")]));
    assert!(q.starts_with(&format!("gearshift-{agent}-")), "{q}");
    for f in expected_files(agent) {
        assert!(r.join(&f[1..]).is_file(), "{f} not installed");
    }
}

/// The unit: notify type with a watchdog, restarts, the installed binary
/// and configuration, reload by SIGHUP.
fn check_unit(agent: &str, u: &BTreeMap<String, Vec<String>>) {
    assert_eq!(one(u, "Service.Type"), "notify");
    assert_eq!(one(u, "Service.NotifyAccess"), "main");
    assert_eq!(one(u, "Service.Restart"), "on-failure");
    let wd = one(u, "Service.WatchdogSec");
    let secs: u64 = wd
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("WatchdogSec={wd}: expected seconds like 30s"));
    assert!(secs >= 10, "WatchdogSec={wd} is too tight for a busy host");
    assert_eq!(one(u, "Install.WantedBy"), "multi-user.target");
    let exec = one(u, "Service.ExecStart");
    assert_eq!(
        exec,
        format!("/usr/bin/gearshift-{agent} run --config /etc/gearshift/{agent}.toml")
    );
    assert!(one(u, "Service.ExecReload").contains("-HUP $MAINPID"));
}

/// The installed binary accepts the installed file, under the unit's
/// environment; the state directory systemd creates is the one the
/// configuration uses.
fn check_config_under_unit(r: &Path, agent: &str, conf: &Path, u: &BTreeMap<String, Vec<String>>) {
    // The keys first, as the README's steps write them (`check-config` loads
    // them as `run` does), in the root's /etc/gearshift that the file then names.
    let etc = r.join("etc/gearshift");
    let bin = r.join(format!("usr/bin/gearshift-{agent}"));
    let stems: &[&str] = if agent == "node" {
        &["node", "broker"]
    } else {
        &["broker"]
    };
    for stem in stems {
        ok(Command::new(&bin)
            .args(["keygen", "--force", "--name", stem])
            .arg("--dir")
            .arg(&etc));
    }
    let text = std::fs::read_to_string(conf)
        .unwrap()
        .replace("/etc/gearshift/", &format!("{}/", etc.display()));
    let conf = &r.join(format!("{agent}-keys-in-root.toml"));
    std::fs::write(conf, text).unwrap();
    let mut check = Command::new(&bin);
    check.arg("check-config").arg(conf);
    check.env_remove("GEARSHIFT_BROKER_CONFIG");
    for e in u.get("Service.Environment").into_iter().flatten() {
        for pair in e.split_whitespace() {
            let (k, v) = pair.split_once('=').expect("Environment=K=V");
            check.env(k, v);
        }
    }
    let out = ok(&mut check);
    assert!(out.trim_end().ends_with(": ok"), "{out}");
    let state = format!("/var/lib/{}", one(u, "Service.StateDirectory"));
    let configured = match agent {
        "broker" => {
            gearshift_broker::config::load(conf)
                .unwrap()
                .agent
                .state_dir
        }
        _ => {
            gearshift_service::config::load::<gearshift_node::NodeConfig>(
                conf,
                gearshift_node::config::ENV_PREFIX,
            )
            .unwrap()
            .state
            .dir
        }
    };
    assert_eq!(
        PathBuf::from(&state),
        configured,
        "StateDirectory vs configuration"
    );
}

/// The broker runs as a dedicated user, declared by the sysusers entry.
fn check_broker_user(r: &Path, u: &BTreeMap<String, Vec<String>>) {
    assert_eq!(one(u, "Service.User"), "gearshift");
    assert_eq!(one(u, "Service.ProtectSystem"), "strict");
    let sysusers = std::fs::read_to_string(r.join("usr/lib/sysusers.d/gearshift.conf")).unwrap();
    assert!(
        sysusers.lines().any(|l| l.starts_with("u gearshift ")),
        "{sysusers}"
    );
    if !have("systemd-sysusers") {
        eprintln!("systemd-sysusers not available: the sysusers entry is not applied");
        return;
    }
    ok(Command::new("systemd-sysusers")
        .arg(format!("--root={}", r.display()))
        .arg(r.join("usr/lib/sysusers.d/gearshift.conf")));
    let passwd = std::fs::read_to_string(r.join("etc/passwd")).unwrap();
    let entry = passwd
        .lines()
        .find(|l| l.starts_with("gearshift:"))
        .unwrap_or_else(|| panic!("no gearshift user created: {passwd}"));
    assert!(entry.ends_with(":/usr/sbin/nologin"), "{entry}");
}

/// `systemd-analyze verify` on a copy of the unit whose ExecStart names the
/// installed binary (the unit's own path is not on this host); warnings
/// count as failures. A broken copy must be caught, so that the check can fail.
fn verify_unit(agent: &str, unit_text: &str, root: &Path) {
    if !have("systemd-analyze") {
        eprintln!("systemd-analyze not available: the units are not verified");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = root.join(format!("usr/bin/gearshift-{agent}"));
    let name = format!("gearshift-{agent}.service");
    let good = unit_text.replace(
        &format!("/usr/bin/gearshift-{agent}"),
        bin.to_str().unwrap(),
    );
    let verify = |text: &str| {
        let p = dir.path().join(&name);
        std::fs::write(&p, text).unwrap();
        let out = run(Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&p));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let ours: Vec<String> = err
            .lines()
            .filter(|l| l.contains(&name) || l.contains(dir.path().to_str().unwrap()))
            .map(str::to_string)
            .collect();
        (out.status.success(), ours)
    };
    let (success, warnings) = verify(&good);
    assert!(
        success && warnings.is_empty(),
        "systemd-analyze verify {name}: {warnings:#?}"
    );
    let broken = good.replace("Type=notify", "Type=notifyy");
    let (_, warnings) = verify(&broken);
    assert!(
        warnings.iter().any(|w| w.contains("notifyy")),
        "the verification must catch a broken unit: {warnings:?}"
    );
}
