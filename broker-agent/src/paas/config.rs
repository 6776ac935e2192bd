//! `[paas]`: how the broker agent tells OpenShift about district changes
//! and moves gears, and the bounds of each command.

use std::collections::BTreeMap;
use std::time::Duration;

use gearshift_service::check::{count_within, within};
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};

use super::Operation;
use super::names::Placeholder;
use super::template::Template;

/// Which PaaS the agent drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PaasKind {
    /// Nothing runs; every operation answers done (a fleet without
    /// OpenShift's districts: the simulator, the `dir`/`exec`/`sim` runtimes).
    #[default]
    #[serde(rename = "none")]
    None,
    /// OpenShift v2's own tools on the PaaS broker host.
    #[serde(rename = "openshift")]
    OpenShift,
}

/// `[paas]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaasConfig {
    /// `none` or `openshift`. Default `none`.
    pub kind: PaasKind,
    /// Bound on one district command. Default `2m`.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Bound on one gear move (stop, copy, start, DNS). Default `10m`.
    #[serde(with = "duration")]
    pub move_timeout: Duration,
    /// After a timeout, between SIGTERM and SIGKILL to the command's process
    /// group. Default `10s`.
    #[serde(with = "duration")]
    pub kill_grace: Duration,
    /// Gear moves running at once on this host, over every drain: each
    /// `oo-admin-move` loads the broker's Rails environment. Default `4`.
    pub max_parallel_moves: u32,
    /// Bytes kept of each command's standard output and of its standard
    /// error (the first and the last half). Default `65536`.
    pub max_output_bytes: usize,
    /// `PATH` of the commands. Default none: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Variables added to the commands' environment (sudo drops them
    /// unless its rule keeps them). Default none.
    pub env: BTreeMap<String, String>,
    /// Stops placement on a node. Placeholders `{district}`, `{host}`.
    /// Default `oo-admin-ctl-district -c deactivate-node -u {district} -i {host}`.
    pub deactivate: Template,
    /// Returns a node to placement. Placeholders `{district}`, `{host}`.
    /// Default `oo-admin-ctl-district -c activate-node -u {district} -i {host}`.
    pub activate: Template,
    /// Adds an empty, undistricted node to a district. Placeholders
    /// `{district}`, `{host}`, `{profile}`. Default
    /// `oo-admin-ctl-district -c add-node -u {district} -i {host}`.
    pub add_node: Template,
    /// Removes an inactive, empty node from its district. Placeholders
    /// `{district}`, `{host}`. Default
    /// `oo-admin-ctl-district -c remove-node -u {district} -i {host}`.
    pub remove_node: Template,
    /// Moves one gear, keeping its UID. Placeholders `{gear}`, `{target}`.
    /// Default `oo-admin-move --gear_uuid {gear} -i {target}`.
    pub move_gear: Template,
}

fn builtin(line: &str) -> Template {
    // Constant text, covered by `defaults_are_valid`.
    Template::from_line(line).unwrap_or_else(|e| panic!("built-in template {line:?}: {e}"))
}

impl Default for PaasConfig {
    fn default() -> Self {
        let ctl = |c: &str| {
            builtin(&format!(
                "oo-admin-ctl-district -c {c} -u {{district}} -i {{host}}"
            ))
        };
        PaasConfig {
            kind: PaasKind::None,
            timeout: Duration::from_secs(120),
            move_timeout: Duration::from_secs(600),
            kill_grace: Duration::from_secs(10),
            max_parallel_moves: 4,
            max_output_bytes: 64 * 1024,
            path: None,
            env: BTreeMap::new(),
            deactivate: ctl("deactivate-node"),
            activate: ctl("activate-node"),
            add_node: ctl("add-node"),
            remove_node: ctl("remove-node"),
            move_gear: builtin("oo-admin-move --gear_uuid {gear} -i {target}"),
        }
    }
}

impl PaasConfig {
    /// The template of `op`.
    pub fn template(&self, op: Operation) -> &Template {
        match op {
            Operation::Deactivate => &self.deactivate,
            Operation::Activate => &self.activate,
            Operation::AddNode => &self.add_node,
            Operation::RemoveNode => &self.remove_node,
            Operation::MoveGear => &self.move_gear,
        }
    }

    /// The bound on one run of `op`.
    pub fn timeout_of(&self, op: Operation) -> Duration {
        if op == Operation::MoveGear {
            self.move_timeout
        } else {
            self.timeout
        }
    }

    /// Checks the section; keys in errors start with `paas.`.
    pub fn check(&self) -> Result<(), Invalid> {
        let min = Duration::from_millis(50);
        let day = Duration::from_secs(86_400);
        within("paas.timeout", self.timeout, min, day)?;
        within("paas.move_timeout", self.move_timeout, min, day)?;
        within(
            "paas.kill_grace",
            self.kill_grace,
            Duration::ZERO,
            Duration::from_secs(300),
        )?;
        count_within("paas.max_parallel_moves", self.max_parallel_moves, 1, 256)?;
        count_within(
            "paas.max_output_bytes",
            self.max_output_bytes,
            1024,
            16 << 20,
        )?;
        if let Some(path) = &self.path {
            check_path(path)?;
        }
        for (k, v) in &self.env {
            let key = format!("paas.env.{k}");
            if k.is_empty() || k.contains(['=', '\0']) || k == "PATH" {
                return Err(Invalid::new(
                    key,
                    "a variable name must be non-empty, without '=' or NUL, and not PATH (use paas.path)",
                ));
            }
            if v.contains('\0') {
                return Err(Invalid::new(key, "must not contain NUL"));
            }
        }
        for op in Operation::ALL {
            let (allowed, required) = op.placeholders();
            self.template(op)
                .check(&format!("paas.{}", op.key()), allowed, required)?;
        }
        Ok(())
    }
}

/// A `PATH` of absolute directories: an empty or relative entry would
/// look tools up in the agent's working directory.
fn check_path(path: &str) -> Result<(), Invalid> {
    if path.is_empty() || path.chars().any(char::is_control) {
        return Err(Invalid::new(
            "paas.path",
            "must be non-empty, without control characters",
        ));
    }
    if let Some(d) = path.split(':').find(|d| !d.starts_with('/')) {
        return Err(Invalid::new(
            "paas.path",
            format!("{d:?} is not an absolute directory"),
        ));
    }
    Ok(())
}

impl Operation {
    /// Placeholders the operation's template may use, and those it must.
    pub fn placeholders(self) -> (&'static [Placeholder], &'static [Placeholder]) {
        use Placeholder::*;
        match self {
            Operation::Deactivate | Operation::Activate | Operation::RemoveNode => {
                (&[District, Host], &[Host])
            }
            Operation::AddNode => (&[District, Host, Profile], &[District, Host]),
            Operation::MoveGear => (&[Gear, Target], &[Gear, Target]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<PaasConfig, String> {
        #[derive(Deserialize)]
        struct File {
            paas: PaasConfig,
        }
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        f.paas.check().map_err(|e| e.to_string())?;
        Ok(f.paas)
    }

    #[test]
    fn defaults_are_valid_and_run_the_real_tools() {
        let d = PaasConfig::default();
        d.check().unwrap();
        assert_eq!(d.kind, PaasKind::None);
        assert_eq!(d.deactivate.program(), "oo-admin-ctl-district");
        assert_eq!(
            d.move_gear.to_string(),
            "oo-admin-move --gear_uuid {gear} -i {target}"
        );
        assert_eq!(
            d.add_node.to_string(),
            "oo-admin-ctl-district -c add-node -u {district} -i {host}"
        );
    }

    #[test]
    fn templates_are_parsed_at_load() {
        let c = load(
            "[paas]\nkind = \"openshift\"\ndeactivate = \"sudo -n /usr/sbin/oo-admin-ctl-district -c deactivate-node -u {district} -i {host}\"\nmove_gear = [\"oo-admin-move\", \"--gear_uuid\", \"{gear}\", \"-i\", \"{target}\", \"--json\"]\n",
        )
        .unwrap();
        assert_eq!(c.kind, PaasKind::OpenShift);
        assert_eq!(c.deactivate.program(), "sudo");
        assert_eq!(c.move_gear.program(), "oo-admin-move");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, want) in [
            (
                "deactivate = \"tool -i {hots}\"",
                "unknown placeholder {hots}",
            ),
            (
                "deactivate = \"tool -i {gear}\"",
                "paas.deactivate: {gear} has no value",
            ),
            (
                "remove_node = \"tool -u {district}\"",
                "paas.remove_node: must use {host}",
            ),
            (
                "add_node = \"tool -i {host}\"",
                "paas.add_node: must use {district}",
            ),
            (
                "move_gear = \"tool {gear}\"",
                "paas.move_gear: must use {target}",
            ),
            ("timeout = \"1ms\"", "paas.timeout"),
            ("max_parallel_moves = 0", "paas.max_parallel_moves"),
            (
                "path = \"bin:/usr/bin\"",
                "paas.path: \"bin\" is not an absolute",
            ),
            (
                "path = \"/bin::/usr/bin\"",
                "paas.path: \"\" is not an absolute",
            ),
            ("env = { PATH = \"/x\" }", "paas.env.PATH"),
            ("kind = \"kubernetes\"", "unknown variant"),
        ] {
            let e = load(&format!("[paas]\n{text}\n")).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
