//! The OpenShift broker-host stand-ins (`tests/standins/openshift/bin`:
//! `oo-admin-ctl-district`, `oo-admin-move`, `oo-standin`) as a test sets
//! them up: a state file and node roots laid out as `/var/lib/openshift`
//! under one directory, and the `[paas]` section that points the broker
//! agent's adapter at them.

use std::path::{Path, PathBuf};
use std::process::Command;

use gearshift_broker::paas::{PaasConfig, PaasKind};
use serde_json::Value;

/// The stand-ins' directory.
pub fn bin_dir() -> PathBuf {
    crate::repo_root().join("tests/standins/openshift/bin")
}

/// One stand-in broker host.
#[derive(Debug, Clone)]
pub struct OoStandin {
    dir: PathBuf,
}

impl OoStandin {
    /// A fresh broker host (`oo-standin init`) keeping its files under `dir`.
    pub fn new(dir: &Path) -> OoStandin {
        std::fs::create_dir_all(dir).expect("stand-in directory");
        let s = OoStandin {
            dir: dir.to_path_buf(),
        };
        s.standin(&["init"]);
        s
    }

    /// The state file (`GEARSHIFT_OO_STATE`).
    pub fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// The stand-ins first, then the absolute directories of our own PATH.
    pub fn path(&self) -> String {
        let own = std::env::var("PATH").unwrap_or_default();
        let mut dirs = vec![bin_dir().display().to_string()];
        dirs.extend(
            own.split(':')
                .filter(|d| d.starts_with('/'))
                .map(String::from),
        );
        dirs.join(":")
    }

    /// Runs a stand-in tool; panics with its output when it fails.
    pub fn run(&self, tool: &str, args: &[&str]) -> String {
        let out = Command::new(bin_dir().join(tool))
            .args(args)
            .env("GEARSHIFT_OO_STATE", self.state())
            .env("PATH", self.path())
            .output()
            .expect("stand-in runs (python3 on PATH)");
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    /// `oo-standin ARGS`.
    pub fn standin(&self, args: &[&str]) -> String {
        self.run("oo-standin", args)
    }

    /// Registers node `host` (undistricted, no gears) with its root.
    pub fn node(&self, host: &str, profile: &str) {
        let root = self.root(host);
        let root = root.to_str().expect("utf-8 path");
        self.standin(&["node-add", host, root, "--profile", profile]);
    }

    /// Node `host`'s root (its `/`).
    pub fn root(&self, host: &str) -> PathBuf {
        self.dir.join("nodes").join(host)
    }

    /// Creates district `name` of `profile` holding `hosts`; its UUID.
    pub fn district(&self, name: &str, profile: &str, hosts: &[&str]) -> String {
        let ctl = "oo-admin-ctl-district";
        self.run(ctl, &["-c", "create", "-n", name, "-p", profile]);
        if !hosts.is_empty() {
            self.run(ctl, &["-c", "add-node", "-n", name, "-i", &hosts.join(",")]);
        }
        self.districts()
            .into_iter()
            .find(|d| d["name"] == name)
            .and_then(|d| d["uuid"].as_str().map(str::to_string))
            .expect("district created")
    }

    /// Every district record of the state file.
    pub fn districts(&self) -> Vec<Value> {
        let dump: Value = serde_json::from_str(&self.standin(&["dump"])).expect("dump is JSON");
        dump["districts"]
            .as_object()
            .map(|d| d.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The district UUID and server record of `host`, when it is in one.
    pub fn server(&self, host: &str) -> Option<(String, Value)> {
        self.districts().into_iter().find_map(|d| {
            let s = d["servers"]
                .as_array()?
                .iter()
                .find(|s| s["name"] == host)?
                .clone();
            Some((d["uuid"].as_str()?.to_string(), s))
        })
    }

    /// `host`'s `.settings/district.info` as the stand-in (MCollective's
    /// `set_district`) wrote it: (uuid, active), when written.
    pub fn district_info(&self, host: &str) -> Option<(String, bool)> {
        let p = self
            .root(host)
            .join("var/lib/openshift/.settings/district.info");
        let text = std::fs::read_to_string(p).ok()?;
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(|v| v.trim_matches('\'').to_string())
        };
        Some((value("uuid")?, value("active")? == "true"))
    }

    /// `[paas]` running the stand-ins with the default templates.
    pub fn paas_config(&self) -> PaasConfig {
        let mut c = PaasConfig {
            kind: PaasKind::OpenShift,
            path: Some(self.path()),
            ..PaasConfig::default()
        };
        c.env.insert(
            "GEARSHIFT_OO_STATE".into(),
            self.state().display().to_string(),
        );
        c.check().expect("[paas] for the stand-ins");
        c
    }
}
