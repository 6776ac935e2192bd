//! The workspace's executables for tests that run them as child processes.
//!
//! `scripts/test` builds every binary once (`cargo build --workspace --bins`)
//! before any test runs, so the `cargo build` here only asks cargo where the
//! executable is (a no-op build) when the suite runs as CI runs it, and builds
//! it when a single test is run on its own. It builds the same way, the whole
//! workspace: `-p <package>` would resolve the dependencies' features for that
//! package alone and rebuild them (lapin, rustls, ...) with another set.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// Path of the dev-profile executable `bin` of the workspace, built at most
/// once per test process with the cargo that runs the tests.
pub fn workspace_binary(bin: &str) -> PathBuf {
    static BINS: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut bins = BINS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(p) = bins.get(bin) {
        return p.clone();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = without_crate_env(&mut Command::new(cargo))
        .args(["build", "--workspace", "--bins", "--message-format=json"])
        .current_dir(crate::repo_root())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run cargo build for {bin}: {e}"));
    assert!(
        out.status.success(),
        "cargo build --workspace --bins failed (for {bin})"
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == bin)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no executable for {bin}"));
    bins.insert(bin.to_string(), path.clone());
    path
}

/// Removes from `cmd`'s environment what cargo set for the running test
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, `OUT_DIR`, ...), for a command that
/// runs cargo: build scripts such as ring's watch those variables
/// (`rerun-if-env-changed`), and a cargo started with the test's values would
/// rebuild them, and the next plain cargo run rebuild them back.
pub fn without_crate_env(cmd: &mut Command) -> &mut Command {
    const PREFIXES: &[&str] = &[
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    for (k, _) in std::env::vars_os() {
        let Some(name) = k.to_str() else { continue };
        if PREFIXES.iter().any(|p| name.starts_with(p)) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// The `gearshift-broker` executable.
pub fn broker_binary() -> PathBuf {
    workspace_binary("gearshift-broker")
}

/// The `gearshift-node` executable.
pub fn node_binary() -> PathBuf {
    workspace_binary("gearshift-node")
}

/// The `gearshift-sim` executable.
pub fn sim_binary() -> PathBuf {
    workspace_binary("gearshift-sim")
}

/// A copy of the shipped `conf/<agent>.toml` in `dir`, its `/etc/gearshift/`
/// paths moved to `dir`, with the key files it names written there
/// (`check-config` loads them, as `run` does): the node's `node.key` and the
/// broker's `broker.pub`, or the broker's `broker.key`.
pub fn shipped_config_with_keys(agent: &str, dir: &std::path::Path) -> PathBuf {
    let shipped = crate::repo_root().join(format!("conf/{agent}.toml"));
    let text = std::fs::read_to_string(&shipped).expect("read the shipped configuration");
    let moved = text.replace("/etc/gearshift/", &format!("{}/", dir.display()));
    for stem in ["node", "broker"] {
        gearshift_service::keys::write_keypair(dir, stem, true).expect("write a key pair");
    }
    let path = dir.join(format!("{agent}.toml"));
    std::fs::write(&path, moved).expect("write the configuration");
    path
}
