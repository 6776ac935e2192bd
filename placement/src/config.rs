//! `[placement]` in `conf/broker.toml`: which strategy decides and each
//! strategy's settings.
//!
//! Every field has a default, so an empty `[placement]` section (or none at
//! all) gives the `default` strategy with the seed's filters.
//!
//! ```toml
//! [placement]
//! strategy = "php-hosts"
//! php_hosts = ["node-1.example.com", "node-2.example.com"]
//! ```

use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::config::Invalid;
use serde::{Deserialize, Serialize};

/// The strategy that chooses one node among the filtered candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyName {
    /// Prefer districted and zoned nodes, drop nodes above the average load,
    /// then choose at random weighted by free capacity.
    #[default]
    Default,
    /// The node with the lowest `node_consumed_capacity` (the seed's "round robin").
    LeastConsumed,
    /// The node with the most free memory (`mem_free_mb`; the seed's `memoryfree`).
    MostFreeMemory,
    /// The first candidate (the seed's first example).
    First,
    /// PHP applications only on `php_hosts`; other applications placed by `default`.
    PhpHosts,
    /// The user `pinned_user` only on `slow_hosts`; other users placed by `default`.
    PinnedUser,
    /// Refuse gears with a cartridge of `blacklisted_vendor`; others placed by `default`.
    VendorBlacklist,
    /// The operator's Rhai script (`[placement.script]`).
    Script,
    /// The operator's external command (`[placement.command]`).
    Command,
}

impl StrategyName {
    /// Every strategy, in documentation order.
    pub const ALL: &'static [StrategyName] = &[
        StrategyName::Default,
        StrategyName::LeastConsumed,
        StrategyName::MostFreeMemory,
        StrategyName::First,
        StrategyName::PhpHosts,
        StrategyName::PinnedUser,
        StrategyName::VendorBlacklist,
        StrategyName::Script,
        StrategyName::Command,
    ];

    /// The name used in configuration, requests and replies.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyName::Default => "default",
            StrategyName::LeastConsumed => "least-consumed",
            StrategyName::MostFreeMemory => "most-free-memory",
            StrategyName::First => "first",
            StrategyName::PhpHosts => "php-hosts",
            StrategyName::PinnedUser => "pinned-user",
            StrategyName::VendorBlacklist => "vendor-blacklist",
            StrategyName::Script => "script",
            StrategyName::Command => "command",
        }
    }

    /// Parses a strategy name as written in configuration or a request.
    pub fn parse(s: &str) -> Option<StrategyName> {
        StrategyName::ALL.iter().copied().find(|n| n.as_str() == s)
    }
}

impl std::fmt::Display for StrategyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When nodes without a district are filtered out (filter 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DistrictMode {
    /// Undistricted nodes are removed when at least one candidate is districted
    /// (districts are in use in this fleet).
    #[default]
    Auto,
    /// Undistricted nodes are always removed.
    Required,
    /// Undistricted nodes are never removed for lacking a district.
    Off,
}

/// The placement settings (`[placement]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    /// Strategy used when a request names none. Default `"default"`.
    pub strategy: StrategyName,
    /// Whether a request may name another strategy in its `strategy` field.
    /// Default `true`. `script` and `command` must still be configured.
    pub allow_request_strategy: bool,
    /// Seed of the `default` strategy's weighted random choice; absent (the
    /// default) seeds from the operating system. Set it for reproducible tests.
    pub seed: Option<u64>,
    /// Nodes allowed for PHP applications (`php-hosts`). Default `[]`;
    /// required (non-empty) when `strategy = "php-hosts"`.
    pub php_hosts: Vec<String>,
    /// Web cartridges that make an application "PHP" (`php-hosts`).
    /// Default `["php-5.3", "php-5.4"]`, as in the seed.
    pub php_cartridges: Vec<String>,
    /// Login of the user pinned to `slow_hosts` (`pinned-user`). Default none;
    /// required when `strategy = "pinned-user"`.
    pub pinned_user: Option<String>,
    /// Nodes the pinned user's gears go to (`pinned-user`). Default `[]`;
    /// required (non-empty) when `strategy = "pinned-user"`.
    pub slow_hosts: Vec<String>,
    /// Cartridge vendor whose cartridges are refused (`vendor-blacklist`).
    /// Default none; required when `strategy = "vendor-blacklist"`.
    pub blacklisted_vendor: Option<String>,
    /// Filter 4: remove nodes without a region or a zone. Default `false`.
    pub zones_required: bool,
    /// Filter 5: for HA applications, remove nodes in zones that already hold
    /// one of the application's gears. Default `true`.
    pub ha_zone_spreading: bool,
    /// Filter 3: when nodes without a district are removed. Default `"auto"`.
    pub districts: DistrictMode,
    /// The `script` strategy's settings.
    pub script: ScriptConfig,
    /// The `command` strategy's settings.
    pub command: CommandConfig,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            strategy: StrategyName::Default,
            allow_request_strategy: true,
            seed: None,
            php_hosts: Vec::new(),
            php_cartridges: vec!["php-5.3".into(), "php-5.4".into()],
            pinned_user: None,
            slow_hosts: Vec::new(),
            blacklisted_vendor: None,
            zones_required: false,
            ha_zone_spreading: true,
            districts: DistrictMode::Auto,
            script: ScriptConfig::default(),
            command: CommandConfig::default(),
        }
    }
}

/// `[placement.script]`: an operator's Rhai script.
///
/// The script defines `fn place(input)`; `input` is a map with the filtered
/// `nodes`, `app`, `current_gears`, `components`, `user`, `request_time`,
/// `profile`, `region`, `moving` and the operator's `settings`. It returns
/// the name of one of `input.nodes`, `()` to place normally (the `default`
/// strategy), or `throw "reason"` to refuse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScriptConfig {
    /// File holding the script. Default none; exactly one of `path` and
    /// `inline` is required when `strategy = "script"`.
    pub path: Option<PathBuf>,
    /// The script itself, inline. Default none.
    pub inline: Option<String>,
    /// Free settings handed to the script as `input.settings` (the seed's
    /// `conf.get("CONFKEY1", ...)`). Default empty.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Most operations one decision may run. Default `1000000`.
    pub max_operations: u64,
    /// Deepest function call nesting. Default `32`.
    pub max_call_depth: usize,
    /// Longest string the script may build, in bytes. Default `65536`.
    pub max_string_size: usize,
    /// Largest array the script may build. Default `100000`.
    pub max_array_size: usize,
    /// Largest map the script may build. Default `10000`.
    pub max_map_size: usize,
    /// Wall-clock limit of one decision. Default `"1s"`.
    #[serde(with = "gearshift_service::config::duration")]
    pub timeout: Duration,
}

impl Default for ScriptConfig {
    fn default() -> Self {
        ScriptConfig {
            path: None,
            inline: None,
            settings: serde_json::Map::new(),
            max_operations: 1_000_000,
            max_call_depth: 32,
            max_string_size: 64 * 1024,
            max_array_size: 100_000,
            max_map_size: 10_000,
            timeout: Duration::from_secs(1),
        }
    }
}

/// `[placement.command]`: an operator's external command.
///
/// The command reads the same input as a script, as one JSON object on
/// standard input, and prints its choice on standard output: a bare node
/// name, a JSON string, `{"node": "name"}`, `{"node": null}` (place
/// normally) or `{"refused": "reason"}`. A non-zero exit is a refusal whose
/// reason quotes standard error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CommandConfig {
    /// The program (absolute path, or a name looked up in `PATH`). Default
    /// none; required when `strategy = "command"`.
    pub program: Option<PathBuf>,
    /// Arguments. Default `[]`.
    pub args: Vec<String>,
    /// Free settings handed to the command as `settings` in its input. Default empty.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// How long one decision may take before the command is killed. Default `"5s"`.
    #[serde(with = "gearshift_service::config::duration")]
    pub timeout: Duration,
    /// Most bytes read from standard output. Default `65536`.
    pub max_output_bytes: usize,
}

impl Default for CommandConfig {
    fn default() -> Self {
        CommandConfig {
            program: None,
            args: Vec::new(),
            settings: serde_json::Map::new(),
            timeout: Duration::from_secs(5),
            max_output_bytes: 64 * 1024,
        }
    }
}

/// Longest wall-clock limit accepted for a script or a command.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

fn bad(key: &str, reason: impl Into<String>) -> Invalid {
    Invalid::new(format!("placement.{key}"), reason)
}

fn check_names(key: &str, names: &[String]) -> Result<(), Invalid> {
    for (i, n) in names.iter().enumerate() {
        if n.trim().is_empty() {
            return Err(bad(&format!("{key}[{i}]"), "is empty"));
        }
    }
    Ok(())
}

impl PlacementConfig {
    /// Checks values that are well-typed but unusable; returns the first bad
    /// key (as `placement.<key>`) and why. Only the script is read (and
    /// compiled) when `strategy = "script"`; nothing else touches the system.
    pub fn validate(&self) -> Result<(), Invalid> {
        check_names("php_hosts", &self.php_hosts)?;
        check_names("php_cartridges", &self.php_cartridges)?;
        check_names("slow_hosts", &self.slow_hosts)?;
        if let Some(u) = &self.pinned_user
            && u.trim().is_empty()
        {
            return Err(bad("pinned_user", "is empty"));
        }
        if let Some(v) = &self.blacklisted_vendor
            && v.trim().is_empty()
        {
            return Err(bad("blacklisted_vendor", "is empty"));
        }
        let s = &self.script;
        if s.max_operations == 0 {
            return Err(bad("script.max_operations", "must be at least 1"));
        }
        if s.max_call_depth == 0 {
            return Err(bad("script.max_call_depth", "must be at least 1"));
        }
        if s.max_string_size == 0 {
            return Err(bad("script.max_string_size", "must be at least 1"));
        }
        if s.max_array_size == 0 {
            return Err(bad("script.max_array_size", "must be at least 1"));
        }
        if s.max_map_size == 0 {
            return Err(bad("script.max_map_size", "must be at least 1"));
        }
        if s.timeout.is_zero() || s.timeout > MAX_TIMEOUT {
            return Err(bad("script.timeout", "must be between 1ms and 10m"));
        }
        if s.path.is_some() && s.inline.is_some() {
            return Err(bad(
                "script.inline",
                "give either script.path or script.inline, not both",
            ));
        }
        let c = &self.command;
        if c.timeout.is_zero() || c.timeout > MAX_TIMEOUT {
            return Err(bad("command.timeout", "must be between 1ms and 10m"));
        }
        if c.max_output_bytes == 0 || c.max_output_bytes > 16 * 1024 * 1024 {
            return Err(bad(
                "command.max_output_bytes",
                "must be between 1 and 16777216",
            ));
        }
        if let Some(p) = &c.program
            && p.as_os_str().is_empty()
        {
            return Err(bad("command.program", "is empty"));
        }
        match self.strategy {
            StrategyName::PhpHosts if self.php_hosts.is_empty() => Err(bad(
                "php_hosts",
                "strategy \"php-hosts\" needs at least one host in php_hosts",
            )),
            StrategyName::PhpHosts if self.php_cartridges.is_empty() => Err(bad(
                "php_cartridges",
                "strategy \"php-hosts\" needs at least one cartridge in php_cartridges",
            )),
            StrategyName::PinnedUser if self.pinned_user.is_none() => Err(bad(
                "pinned_user",
                "strategy \"pinned-user\" needs pinned_user",
            )),
            StrategyName::PinnedUser if self.slow_hosts.is_empty() => Err(bad(
                "slow_hosts",
                "strategy \"pinned-user\" needs at least one host in slow_hosts",
            )),
            StrategyName::VendorBlacklist if self.blacklisted_vendor.is_none() => Err(bad(
                "blacklisted_vendor",
                "strategy \"vendor-blacklist\" needs blacklisted_vendor",
            )),
            StrategyName::Script if s.path.is_none() && s.inline.is_none() => Err(bad(
                "script.path",
                "strategy \"script\" needs script.path or script.inline",
            )),
            StrategyName::Command if c.program.is_none() => Err(bad(
                "command.program",
                "strategy \"command\" needs command.program",
            )),
            _ => Ok(()),
        }?;
        if s.path.is_some() || s.inline.is_some() {
            crate::script::ScriptStrategy::new(s)
                .map_err(|e| bad(e.config_key(), e.to_string()))?;
        }
        Ok(())
    }
}

impl gearshift_service::config::Validate for PlacementConfig {
    fn validate(&self) -> Result<(), Invalid> {
        PlacementConfig::validate(self)
    }
}
