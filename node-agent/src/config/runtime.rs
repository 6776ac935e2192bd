//! `[runtime]`: where gears live and how they move (`openshift`, `dir`,
//! `exec` or `sim`), with its checks.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::check;
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};

/// Which gear runtime the node uses.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// An OpenShift v2 node host.
    #[default]
    Openshift,
    /// Gears are directories of files; moves copy, verify, then delete.
    Dir,
    /// Operator commands print the gear list and move gears.
    Exec,
    /// In memory (simulation).
    Sim,
}

/// `[runtime]`: where gears live.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// `openshift`, `dir`, `exec` or `sim`.
    pub kind: RuntimeKind,
    /// Node facts for runtimes that do not read them from the host.
    pub facts: FactsSection,
    /// `openshift` runtime settings.
    pub openshift: OpenshiftSection,
    /// `dir` runtime settings.
    pub dir: DirSection,
    /// `exec` runtime settings.
    pub exec: ExecSection,
    /// `sim` runtime settings.
    pub sim: SimSection,
}

/// `[runtime.facts]`: facts for `dir`, `exec` and `sim`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FactsSection {
    /// Node profile (size class).
    pub profile: String,
    /// Most active gears the node may hold.
    pub max_active_gears: u32,
    /// District UUID; no district when absent.
    pub district_uuid: Option<String>,
    /// First UID of the district.
    pub district_first_uid: Option<u32>,
    /// Last UID of the district.
    pub district_max_uid: Option<u32>,
}

impl Default for FactsSection {
    fn default() -> Self {
        FactsSection {
            profile: "small".into(),
            max_active_gears: 100,
            district_uuid: None,
            district_first_uid: None,
            district_max_uid: None,
        }
    }
}

/// `[runtime.openshift]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OpenshiftSection {
    /// Root of the node's file system (`/` on a real node; a copy in tests).
    pub root: PathBuf,
    /// Gear base directory below `root` (`GEAR_BASE_DIR` in `node.conf`).
    pub gear_base_dir: PathBuf,
    /// `resource_limits.conf` below `root`.
    pub resource_limits: PathBuf,
    /// The district info file below `root`.
    pub district_info: PathBuf,
    /// Move command, one argument per element, with `{gear}` and `{target}`.
    pub move_command: Vec<String>,
    /// How long one move command may run.
    #[serde(with = "duration")]
    pub move_timeout: Duration,
    /// A gear holding this file (in its home directory) opted out of scale-down.
    pub do_not_disrupt_marker: String,
}

impl Default for OpenshiftSection {
    fn default() -> Self {
        OpenshiftSection {
            root: "/".into(),
            gear_base_dir: "var/lib/openshift".into(),
            resource_limits: "etc/openshift/resource_limits.conf".into(),
            district_info: "var/lib/openshift/.settings/district.info".into(),
            move_command: vec![
                "oo-admin-move".into(),
                "--gear_uuid".into(),
                "{gear}".into(),
                "-i".into(),
                "{target}".into(),
            ],
            move_timeout: Duration::from_secs(1800),
            do_not_disrupt_marker: ".gearshift-do-not-disrupt".into(),
        }
    }
}

/// `[runtime.dir]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DirSection {
    /// Directory holding this node's gears, one sub-directory each.
    pub root: PathBuf,
    /// A target node's gear directory; `{target}` is replaced by its name.
    pub target_root: String,
    /// Copy bandwidth limit in bytes per second; 0 means unlimited.
    pub max_bytes_per_sec: u64,
    /// A gear holding this file opted out of scale-down.
    pub do_not_disrupt_marker: String,
}

impl Default for DirSection {
    fn default() -> Self {
        DirSection {
            root: "/srv/gearshift/gears".into(),
            target_root: "/srv/gearshift/nodes/{target}/gears".into(),
            max_bytes_per_sec: 0,
            do_not_disrupt_marker: ".gearshift-do-not-disrupt".into(),
        }
    }
}

/// `[runtime.exec]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExecSection {
    /// Command that prints the gear list as JSON.
    pub list_command: Vec<String>,
    /// Move command with `{gear}` and `{target}`.
    pub move_command: Vec<String>,
    /// How long the list command may run.
    #[serde(with = "duration")]
    pub list_timeout: Duration,
    /// How long one move may run.
    #[serde(with = "duration")]
    pub move_timeout: Duration,
}

impl Default for ExecSection {
    fn default() -> Self {
        ExecSection {
            list_command: vec!["/usr/libexec/gearshift/list-gears".into()],
            move_command: vec![
                "/usr/libexec/gearshift/move-gear".into(),
                "{gear}".into(),
                "{target}".into(),
            ],
            list_timeout: Duration::from_secs(60),
            move_timeout: Duration::from_secs(1800),
        }
    }
}

/// `[runtime.sim]`: a stand-alone simulated node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// Gears the simulated node starts with.
    pub gears: u32,
    /// Of those, the share (percent) that are idle.
    pub idle_percent: u8,
    /// Simulated time per move.
    #[serde(with = "duration")]
    pub move_time: Duration,
    /// Simulated memory in MiB.
    pub mem_total_mb: u64,
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            gears: 0,
            idle_percent: 50,
            move_time: Duration::from_millis(50),
            mem_total_mb: 8192,
        }
    }
}

impl RuntimeSection {
    /// Checks the section; keys in errors start with `runtime.`.
    pub fn check(&self) -> Result<(), Invalid> {
        self.facts.check()?;
        match self.kind {
            RuntimeKind::Openshift => self.openshift.check(),
            RuntimeKind::Dir => self.dir.check(),
            RuntimeKind::Exec => self.exec.check(),
            RuntimeKind::Sim => self.sim.check(),
        }
    }
}

impl FactsSection {
    fn check(&self) -> Result<(), Invalid> {
        let f = self;
        if f.profile.is_empty() || f.profile.len() > gearshift_proto::msg::MAX_NAME {
            return Err(Invalid::new(
                "runtime.facts.profile",
                "must be 1..=255 bytes long",
            ));
        }
        if let Some(u) = &f.district_uuid
            && (u.is_empty() || !u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(Invalid::new(
                "runtime.facts.district_uuid",
                "must be letters, digits and '-'",
            ));
        }
        if let (Some(a), Some(b)) = (f.district_first_uid, f.district_max_uid)
            && b < a
        {
            return Err(Invalid::new(
                "runtime.facts.district_max_uid",
                "must not be below district_first_uid",
            ));
        }
        Ok(())
    }
}

impl OpenshiftSection {
    fn check(&self) -> Result<(), Invalid> {
        let o = self;
        check_template(
            "runtime.openshift.move_command",
            &o.move_command,
            &["{gear}", "{target}"],
        )?;
        check::within(
            "runtime.openshift.move_timeout",
            o.move_timeout,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        for (key, p) in [
            ("runtime.openshift.gear_base_dir", &o.gear_base_dir),
            ("runtime.openshift.resource_limits", &o.resource_limits),
            ("runtime.openshift.district_info", &o.district_info),
        ] {
            check::names_a_path(key, p, "path")?;
        }
        Ok(())
    }
}

impl DirSection {
    fn check(&self) -> Result<(), Invalid> {
        check::names_a_path("runtime.dir.root", &self.root, "directory")?;
        if !self.target_root.contains("{target}") {
            return Err(Invalid::new(
                "runtime.dir.target_root",
                "must contain {target}",
            ));
        }
        if self.do_not_disrupt_marker.contains('/') {
            return Err(Invalid::new(
                "runtime.dir.do_not_disrupt_marker",
                "must be a file name",
            ));
        }
        Ok(())
    }
}

impl ExecSection {
    fn check(&self) -> Result<(), Invalid> {
        let x = self;
        check_template("runtime.exec.list_command", &x.list_command, &[])?;
        check_template(
            "runtime.exec.move_command",
            &x.move_command,
            &["{gear}", "{target}"],
        )?;
        check::within(
            "runtime.exec.list_timeout",
            x.list_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        check::within(
            "runtime.exec.move_timeout",
            x.move_timeout,
            Duration::from_millis(100),
            Duration::from_secs(86_400),
        )
    }
}

impl SimSection {
    fn check(&self) -> Result<(), Invalid> {
        if self.idle_percent > 100 {
            return Err(Invalid::new(
                "runtime.sim.idle_percent",
                "must be at most 100",
            ));
        }
        if self.gears > 100_000 {
            return Err(Invalid::new("runtime.sim.gears", "must be at most 100000"));
        }
        Ok(())
    }
}

fn check_template(key: &str, argv: &[String], placeholders: &[&str]) -> Result<(), Invalid> {
    if argv.is_empty() || argv[0].trim().is_empty() {
        return Err(Invalid::new(key, "must name a program"));
    }
    for p in placeholders {
        if !argv.iter().any(|a| a.contains(p)) {
            return Err(Invalid::new(key, format!("must contain {p}")));
        }
    }
    Ok(())
}
