//! The values substituted into command templates, checked before any
//! command runs.
//!
//! The tools take them as plain arguments, but each tool reads more into
//! some characters: `oo-admin-ctl-district` splits `-i` on `,`, `;`, `:`
//! and white space (`broker-util/oo-admin-ctl-district:108`), `oo-admin-move`
//! splits `--gear_uuid` on `,` (`broker-util/oo-admin-move:94`), GetoptLong
//! takes a leading `-` as an option, and the output parser finds a node by
//! `'<host>'`. So every value is limited to the characters a host name, a
//! district name (`District::DISTRICT_NAME_REGEX`, `\A[\w\.\-]+\z`,
//! `controller/app/models/district.rb:24`) or a hex UUID uses.

use std::fmt;

use super::error::PaasError;

/// Which value a placeholder stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Placeholder {
    /// `{district}`: the district's UUID (what nodes report as
    /// `district_uuid`) or its name.
    District,
    /// `{host}`: the node's server identity (its host name).
    Host,
    /// `{profile}`: the node profile (gear size) of a node being added.
    Profile,
    /// `{gear}`: the UUID of the gear to move.
    Gear,
    /// `{target}`: the server identity a gear moves to.
    Target,
}

impl Placeholder {
    /// Every placeholder, in the order of the documentation.
    pub const ALL: [Placeholder; 5] = [
        Placeholder::District,
        Placeholder::Host,
        Placeholder::Profile,
        Placeholder::Gear,
        Placeholder::Target,
    ];

    /// The name written between braces.
    pub fn name(self) -> &'static str {
        match self {
            Placeholder::District => "district",
            Placeholder::Host => "host",
            Placeholder::Profile => "profile",
            Placeholder::Gear => "gear",
            Placeholder::Target => "target",
        }
    }

    /// The placeholder named `name`, if any.
    pub fn from_name(name: &str) -> Option<Placeholder> {
        Placeholder::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Longest value accepted, in bytes: host names are at most 255 bytes
    /// (as every name on the bus, `gearshift_proto::msg::MAX_NAME`); gear
    /// UUIDs are 32 hex digits (24 for a MongoDB id), kept well below that.
    fn max_len(self) -> usize {
        match self {
            Placeholder::Gear => 128,
            _ => gearshift_proto::msg::MAX_NAME,
        }
    }
}

impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}", self.name())
    }
}

/// Checks `value` for placeholder `p`: 1 to `max_len` bytes of ASCII
/// letters, digits, `.`, `_` and `-`, not starting with `-` (an option to
/// the tool) or `.`.
pub fn check(p: Placeholder, value: &str) -> Result<(), PaasError> {
    let bad = |reason: String| PaasError::BadValue {
        placeholder: p,
        value: value.chars().take(80).collect(),
        reason,
    };
    if value.is_empty() {
        return Err(bad("is empty".into()));
    }
    if value.len() > p.max_len() {
        return Err(bad(format!(
            "is {} bytes long (limit {})",
            value.len(),
            p.max_len()
        )));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(bad(format!(
            "contains {c:?}: only ASCII letters, digits, '.', '_' and '-' are passed to the tools"
        )));
    }
    if value.starts_with(['-', '.']) {
        return Err(bad("must not start with '-' or '.'".into()));
    }
    Ok(())
}

/// The values of one operation, each checked when it is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Values {
    district: Option<String>,
    host: Option<String>,
    profile: Option<String>,
    gear: Option<String>,
    target: Option<String>,
}

impl Values {
    /// No values yet.
    pub fn new() -> Values {
        Values::default()
    }

    /// Sets the value of `p` after checking it.
    pub fn with(mut self, p: Placeholder, value: &str) -> Result<Values, PaasError> {
        check(p, value)?;
        *self.slot(p) = Some(value.to_string());
        Ok(self)
    }

    /// The value of `p`, if set.
    pub fn get(&self, p: Placeholder) -> Option<&str> {
        match p {
            Placeholder::District => self.district.as_deref(),
            Placeholder::Host => self.host.as_deref(),
            Placeholder::Profile => self.profile.as_deref(),
            Placeholder::Gear => self.gear.as_deref(),
            Placeholder::Target => self.target.as_deref(),
        }
    }

    fn slot(&mut self, p: Placeholder) -> &mut Option<String> {
        match p {
            Placeholder::District => &mut self.district,
            Placeholder::Host => &mut self.host,
            Placeholder::Profile => &mut self.profile,
            Placeholder::Gear => &mut self.gear,
            Placeholder::Target => &mut self.target,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_uuids_and_district_names_pass() {
        for (p, v) in [
            (Placeholder::Host, "node-1.example.com"),
            (Placeholder::Host, "ip-10-0-0-1_internal"),
            (Placeholder::District, "5fd7b2c1a9e04d1f8b3e6a2c9d0f1e2a"),
            (Placeholder::District, "52a1b2c3d4e5f60718293a4b"),
            (Placeholder::District, "small_district.1"),
            (Placeholder::Gear, "0f8a5e0ad9b54ab2a0be1b1c02a3b9f8"),
            (Placeholder::Profile, "small"),
        ] {
            assert!(check(p, v).is_ok(), "{p} {v}");
        }
    }

    #[test]
    fn what_a_tool_would_read_as_more_is_refused() {
        let refused = [
            (Placeholder::Host, "", "empty"),
            (Placeholder::Host, "-c", "start with"),
            (Placeholder::Host, ".hidden", "start with"),
            (Placeholder::Host, "a,b", "','"),
            (Placeholder::Host, "a;b", "';'"),
            (Placeholder::Host, "a:b", "':'"),
            (Placeholder::Host, "a b", "' '"),
            (Placeholder::Host, "a\nb", "'\\n'"),
            (Placeholder::Host, "a'b", "'\\''"),
            (Placeholder::Host, "/node-.*/", "'/'"),
            (Placeholder::Host, "nodé", "'é'"),
            (Placeholder::Gear, "g1,g2", "','"),
            (Placeholder::District, "--uuid", "start with"),
            (Placeholder::District, "d\u{7f}", "'\\u{7f}'"),
        ];
        for (p, v, why) in refused {
            let e = check(p, v).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.contains(&p.to_string()),
                "{p} {v:?}: {e}"
            );
        }
        assert!(check(Placeholder::Host, &"a".repeat(255)).is_ok());
        assert!(check(Placeholder::Host, &"a".repeat(256)).is_err());
        assert!(check(Placeholder::Gear, &"a".repeat(129)).is_err());
    }

    #[test]
    fn values_are_checked_when_set() {
        let v = Values::new()
            .with(Placeholder::Host, "n1")
            .unwrap()
            .with(Placeholder::District, "d1")
            .unwrap();
        assert_eq!(v.get(Placeholder::Host), Some("n1"));
        assert_eq!(v.get(Placeholder::Gear), None);
        assert!(v.with(Placeholder::Gear, "-x").is_err());
    }
}
