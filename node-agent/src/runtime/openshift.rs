//! The `openshift` runtime: an OpenShift v2 (Origin / Enterprise 2.x) node host.
//!
//! Everything is read below a configurable root (`/` on a real node), so the
//! same code runs against a copy of a node's files in tests. Where each fact
//! comes from, as the OpenShift Origin sources (`openshift/origin-server`) define it:
//!
//! - **Gears** are the directories `<GEAR_BASE_DIR>/<uuid>` (`GEAR_BASE_DIR` is
//!   `/var/lib/openshift` by default, from `/etc/openshift/node.conf`). Only a
//!   directory holding `app-root/runtime/.state` is a gear; others (such as
//!   `.httpd.d`, `.settings`) are not, and symbolic links are skipped. This is
//!   exactly how the node's facter facts count gears
//!   (`plugins/msg-node/mcollective/facts/openshift_facts.rb`).
//! - **Gear state** is the content of that `.state` file: `building`,
//!   `deploying`, `started`, `idle`, `new`, `stopped` or `unknown` (same file);
//!   a gear is *active* unless it is `idle` or `stopped`, so
//!   active = total - idle - stopped, the `gears_active_count` fact that
//!   `oo-stats` and the broker's placement use.
//! - **`node_profile` and `max_active_gears`** come from
//!   `/etc/openshift/resource_limits.conf`, a `key=value` file read with
//!   ParseConfig; `max_active_gears` falls back to the older `max_active_apps`
//!   and the profile to `small`, as in the facts file.
//! - **The district** comes from `<GEAR_BASE_DIR>/.settings/district.info`,
//!   written by the node's MCollective agent (`set_district_action` in
//!   `plugins/msg-node/mcollective/src/openshift.rb`) as
//!   `uuid='…'`, `active='true|false'`, `first_uid=N`, `max_uid=N`; a missing
//!   file or `uuid` means undistricted (the facts report `NONE`).
//! - **The application name** is `<gear>/.env/OPENSHIFT_APP_NAME` (plain
//!   value in newer releases, `export OPENSHIFT_APP_NAME='…'` in older ones),
//!   and the gear's **UID** is the owner of its directory (each gear is a
//!   Unix user whose home is the gear directory).
//! - **Moves** run an operator command, by default
//!   `oo-admin-move --gear_uuid {gear} -i {target}` (the broker-side tool that
//!   moves one gear within its district; on a node it is typically wrapped in
//!   `ssh broker …`). A move counts as done once the command exits 0 *and*
//!   the gear directory is gone from this node.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use gearshift_proto::msg::{DistrictInfo, GearInfo, GearState};

use super::command;
use super::{
    GearRuntime, Inventory, MoveCtx, MoveOutcome, NodeFacts, RuntimeError, check_gear_id,
    check_target,
};
use crate::config::OpenshiftSection;

/// Largest host configuration file read.
const MAX_CONF: u64 = 1024 * 1024;

/// An OpenShift v2 node host.
#[derive(Debug, Clone)]
pub struct OpenshiftRuntime {
    gear_base: PathBuf,
    resource_limits: PathBuf,
    district_info: PathBuf,
    move_command: Vec<String>,
    move_timeout: std::time::Duration,
    marker: String,
}

impl OpenshiftRuntime {
    /// A runtime reading the layout configured in `cfg`.
    pub fn new(cfg: &OpenshiftSection) -> Self {
        let under = |p: &Path| cfg.root.join(p.strip_prefix("/").unwrap_or(p));
        OpenshiftRuntime {
            gear_base: under(&cfg.gear_base_dir),
            resource_limits: under(&cfg.resource_limits),
            district_info: under(&cfg.district_info),
            move_command: cfg.move_command.clone(),
            move_timeout: cfg.move_timeout,
            marker: cfg.do_not_disrupt_marker.clone(),
        }
    }

    fn scan(&self) -> Result<Inventory, RuntimeError> {
        let facts = NodeFacts {
            profile: String::new(),
            max_active_gears: 0,
            district: None,
        };
        let facts = read_small(&self.resource_limits)?
            .map(|t| apply_resource_limits(facts.clone(), &parse_config(&t)))
            .unwrap_or_else(|| NodeFacts {
                profile: "small".into(),
                ..facts
            });
        let district = match read_small(&self.district_info)? {
            Some(t) => parse_district_info(&t),
            None => None,
        };
        let facts = NodeFacts { district, ..facts };
        let gears = list_gears(&self.gear_base, &self.marker)?;
        Ok(Inventory { facts, gears })
    }

    fn present(&self, gear: &str) -> bool {
        self.gear_base
            .join(gear)
            .join("app-root/runtime/.state")
            .exists()
    }
}

fn read_small(path: &Path) -> Result<Option<String>, RuntimeError> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_CONF => Err(RuntimeError::Parse {
            what: path.display().to_string(),
            reason: format!("larger than {MAX_CONF} bytes"),
        }),
        Ok(_) => std::fs::read_to_string(path)
            .map(Some)
            .map_err(|e| RuntimeError::Io {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RuntimeError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// Parses a ParseConfig-style `key = value` file: `#` starts a comment line,
/// values may be quoted with `'` or `"`, and an unquoted value ends at ` #`.
pub fn parse_config(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        let k = k.strip_prefix("export ").unwrap_or(k).trim();
        if k.is_empty() {
            continue;
        }
        out.insert(k.to_string(), unquote(v.trim()));
    }
    out
}

fn unquote(v: &str) -> String {
    for q in ['\'', '"'] {
        if let Some(rest) = v.strip_prefix(q)
            && let Some(end) = rest.find(q)
        {
            return rest[..end].to_string();
        }
    }
    match v.find(" #").or_else(|| v.find("\t#")) {
        Some(i) => v[..i].trim().to_string(),
        None => v.to_string(),
    }
}

fn apply_resource_limits(mut f: NodeFacts, kv: &HashMap<String, String>) -> NodeFacts {
    f.profile = kv
        .get("node_profile")
        .filter(|p| !p.is_empty())
        .cloned()
        .unwrap_or_else(|| "small".into());
    f.max_active_gears = kv
        .get("max_active_gears")
        .or_else(|| kv.get("max_active_apps"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    f
}

/// Parses `district.info`; `None` when undistricted.
pub fn parse_district_info(text: &str) -> Option<DistrictInfo> {
    let kv = parse_config(text);
    let uuid = kv
        .get("uuid")
        .filter(|u| !u.is_empty() && u.as_str() != "NONE")?;
    Some(DistrictInfo {
        uuid: uuid.clone(),
        active: kv.get("active").is_some_and(|a| a == "true"),
        first_uid: kv.get("first_uid").and_then(|v| v.parse().ok()),
        max_uid: kv.get("max_uid").and_then(|v| v.parse().ok()),
    })
}

/// Reads the application name from a gear's `.env/OPENSHIFT_APP_NAME`.
fn app_name(gear_dir: &Path) -> Option<String> {
    let t = std::fs::read_to_string(gear_dir.join(".env/OPENSHIFT_APP_NAME")).ok()?;
    let t = t.trim();
    let v = match t.split_once('=') {
        Some((_, v)) if t.starts_with("export ") => unquote(v.trim()),
        _ => t.to_string(),
    };
    (!v.is_empty() && v.len() <= 255).then_some(v)
}

fn list_gears(base: &Path, marker: &str) -> Result<Vec<GearInfo>, RuntimeError> {
    let rd = match std::fs::read_dir(base) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => {
            return Err(RuntimeError::Io {
                path: base.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let mut gears = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || check_gear_id(&name).is_err() {
            continue;
        }
        // symlink_metadata: a symbolic link is never a gear.
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let dir = entry.path();
        let Ok(state) = std::fs::read_to_string(dir.join("app-root/runtime/.state")) else {
            continue;
        };
        gears.push(GearInfo {
            id: name,
            app: app_name(&dir),
            state: GearState::parse_lenient(&state),
            uid: Some(meta.uid()),
            bytes: None,
            do_not_disrupt: !marker.is_empty() && dir.join(marker).exists(),
        });
    }
    gears.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(gears)
}

#[async_trait]
impl GearRuntime for OpenshiftRuntime {
    fn kind(&self) -> &'static str {
        "openshift"
    }

    async fn inventory(&self) -> Result<Inventory, RuntimeError> {
        let me = self.clone();
        super::blocking(&self.gear_base, move || me.scan()).await
    }

    async fn holds(&self, gear: &str) -> Result<bool, RuntimeError> {
        check_gear_id(gear)?;
        Ok(self.present(gear))
    }

    async fn move_gear(
        &self,
        gear: &str,
        target: &str,
        ctx: &MoveCtx,
    ) -> Result<MoveOutcome, RuntimeError> {
        check_gear_id(gear)?;
        check_target(target)?;
        if !self.present(gear) {
            return Ok(if ctx.resumed {
                MoveOutcome::AlreadyMoved
            } else {
                MoveOutcome::Missing
            });
        }
        let argv = command::substitute(&self.move_command, &[("gear", gear), ("target", target)]);
        command::run(&argv, self.move_timeout, Some(&ctx.cancel), 1024 * 1024).await?;
        if self.present(gear) {
            return Err(RuntimeError::Command {
                program: argv[0].clone(),
                status: "exit 0".into(),
                code: Some(0),
                stderr: format!("gear {gear} is still on this node after the move"),
            });
        }
        Ok(MoveOutcome::Moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Lays out a node as OpenShift Origin does.
    fn node(root: &Path) {
        let base = root.join("var/lib/openshift");
        fs::create_dir_all(base.join(".settings")).unwrap();
        fs::write(
            base.join(".settings/district.info"),
            "#Do not modify manually!\nuuid='0f8a5e0ad9b54ab2a0be1b1c02a3b9f8'\nactive='true'\nfirst_uid=1000\nmax_uid=6999",
        )
        .unwrap();
        fs::create_dir_all(root.join("etc/openshift")).unwrap();
        fs::write(
            root.join("etc/openshift/resource_limits.conf"),
            "#\n# Limit resources\n#\nnode_profile=medium\nquota_files=80000\nmax_gears=200 # metrics only\nmax_active_gears=50\n",
        )
        .unwrap();
        for (uuid, state, app) in [
            (
                "5480c40bac2c4a2cd2000001",
                "started\n",
                Some("export OPENSHIFT_APP_NAME='shop'"),
            ),
            ("5480c40bac2c4a2cd2000002", "idle", Some("blog")),
            ("5480c40bac2c4a2cd2000003", "stopped", None),
            ("5480c40bac2c4a2cd2000004", "building", None),
            ("5480c40bac2c4a2cd2000005", "garbled", None),
        ] {
            let g = base.join(uuid);
            fs::create_dir_all(g.join("app-root/runtime")).unwrap();
            fs::write(g.join("app-root/runtime/.state"), state).unwrap();
            if let Some(app) = app {
                fs::create_dir_all(g.join(".env")).unwrap();
                fs::write(g.join(".env/OPENSHIFT_APP_NAME"), app).unwrap();
            }
        }
        // Not gears: no state file, a hidden directory, a symlink.
        fs::create_dir_all(base.join("5480c40bac2c4a2cd2000099/app-root")).unwrap();
        fs::create_dir_all(base.join(".httpd.d")).unwrap();
        std::os::unix::fs::symlink(
            base.join("5480c40bac2c4a2cd2000001"),
            base.join("5480c40bac2c4a2cd2000098"),
        )
        .unwrap();
        fs::write(
            base.join("5480c40bac2c4a2cd2000002/.gearshift-do-not-disrupt"),
            "",
        )
        .unwrap();
    }

    fn runtime(root: &Path, mv: &[&str]) -> OpenshiftRuntime {
        OpenshiftRuntime::new(&OpenshiftSection {
            root: root.to_path_buf(),
            move_command: mv.iter().map(|s| s.to_string()).collect(),
            ..OpenshiftSection::default()
        })
    }

    #[test]
    fn parsers() {
        let kv = parse_config("a=1\n b = 'two' \n#c=3\nd=\"x # y\"\ne=v # comment\nexport F='f'\n");
        assert_eq!(kv["a"], "1");
        assert_eq!(kv["b"], "two");
        assert!(!kv.contains_key("c"));
        assert_eq!(kv["d"], "x # y");
        assert_eq!(kv["e"], "v");
        assert_eq!(kv["F"], "f");
        assert_eq!(parse_district_info("uuid='NONE'\nactive='false'\n"), None);
        let d = parse_district_info("uuid='abc'\nactive='false'\n").unwrap();
        assert!(!d.active);
        assert_eq!(d.first_uid, None);
        assert_eq!(d.capacity(), 6000);
        let facts = apply_resource_limits(
            NodeFacts {
                profile: String::new(),
                max_active_gears: 0,
                district: None,
            },
            &parse_config("max_active_apps=30\n"),
        );
        assert_eq!(
            (facts.profile.as_str(), facts.max_active_gears),
            ("small", 30)
        );
    }

    #[tokio::test]
    async fn reads_a_node_layout() {
        let d = tempfile::tempdir().unwrap();
        node(d.path());
        let inv = runtime(d.path(), &["true", "{gear}", "{target}"])
            .inventory()
            .await
            .unwrap();
        assert_eq!(inv.facts.profile, "medium");
        assert_eq!(inv.facts.max_active_gears, 50);
        let district = inv.facts.district.clone().unwrap();
        assert_eq!(district.uuid, "0f8a5e0ad9b54ab2a0be1b1c02a3b9f8");
        assert!(district.active);
        assert_eq!(
            (district.first_uid, district.max_uid),
            (Some(1000), Some(6999))
        );
        assert_eq!(district.capacity(), 6000);
        let ids: Vec<_> = inv.gears.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "5480c40bac2c4a2cd2000001",
                "5480c40bac2c4a2cd2000002",
                "5480c40bac2c4a2cd2000003",
                "5480c40bac2c4a2cd2000004",
                "5480c40bac2c4a2cd2000005"
            ]
        );
        let c = inv.counts();
        assert_eq!(
            (c.started, c.idle, c.stopped, c.deploying, c.unknown),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(c.active(), 3);
        assert_eq!(inv.gears[0].app.as_deref(), Some("shop"));
        assert_eq!(inv.gears[1].app.as_deref(), Some("blog"));
        assert_eq!(inv.pinned(), 1);
        assert!(inv.gears[1].do_not_disrupt);
        assert!(inv.gears[0].uid.is_some());
    }

    #[tokio::test]
    async fn missing_files_mean_defaults_and_no_district() {
        let d = tempfile::tempdir().unwrap();
        let inv = runtime(d.path(), &["true", "{gear}", "{target}"])
            .inventory()
            .await
            .unwrap();
        assert_eq!(inv.facts.profile, "small");
        assert_eq!(inv.facts.district, None);
        assert!(inv.gears.is_empty());
    }

    #[tokio::test]
    async fn move_runs_the_template_and_checks_the_gear_left() {
        let d = tempfile::tempdir().unwrap();
        node(d.path());
        let base = d.path().join("var/lib/openshift");
        let log = d.path().join("moves.log");
        // A fake oo-admin-move: logs its arguments and removes the gear directory.
        let script = format!(
            "echo \"$1 $2\" >> {log}; rm -rf {base}/$1",
            log = log.display(),
            base = base.display()
        );
        let rt = runtime(d.path(), &["sh", "-c", &script, "mv", "{gear}", "{target}"]);
        let ctx = MoveCtx::default();
        let g = "5480c40bac2c4a2cd2000001";
        assert_eq!(
            rt.move_gear(g, "node-2.example.com", &ctx).await.unwrap(),
            MoveOutcome::Moved
        );
        assert_eq!(
            fs::read_to_string(&log).unwrap(),
            format!("{g} node-2.example.com\n")
        );
        // Gone now: a resumed attempt knows it was moved, a fresh one calls it missing.
        let resumed = MoveCtx {
            resumed: true,
            ..MoveCtx::default()
        };
        assert_eq!(
            rt.move_gear(g, "node-2.example.com", &resumed)
                .await
                .unwrap(),
            MoveOutcome::AlreadyMoved
        );
        assert_eq!(
            rt.move_gear(g, "node-2.example.com", &ctx).await.unwrap(),
            MoveOutcome::Missing
        );
        // A command that "succeeds" without moving is an error.
        let liar = runtime(d.path(), &["true", "{gear}", "{target}"]);
        let e = liar
            .move_gear("5480c40bac2c4a2cd2000002", "n2", &ctx)
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert!(liar.move_gear("../etc", "n2", &ctx).await.is_err());
    }
}
