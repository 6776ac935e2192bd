//! The configuration sections both agents share: `[bus]`, `[keys]`, `[log]`
//! and `[metrics]`, with their defaults and their checks, declared once.
//!
//! `[log]` and `[metrics]` are the same for both agents. `[bus]` and
//! `[keys]` have shared keys plus a few of one agent's own (the node's
//! `prefetch`, the broker's key directories): the agent names those in a
//! [`Part`], and [`BusSection`] / [`KeysSection`] read them from the same
//! TOML table, so that a file keeps one `[bus]` table, unknown keys are
//! still refused and errors still name `bus.<key>`. The agent's part is
//! reached through the section (`cfg.bus.prefetch`) by `Deref`.

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::config::Invalid;
use crate::logging::LogFormat;

mod bus;
mod keys;

pub use bus::{BusPart, BusSection};
pub use keys::{KeysPart, KeysSection};

/// The keys one agent adds to a shared section.
pub trait Part: Default {
    /// The keys this part reads (listed in the "unknown field" message).
    const KEYS: &'static [&'static str];

    /// Reads `key`'s value from `map` (with `map.next_value()`) when it is
    /// one of this part's keys; returns false, reading nothing, otherwise.
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error>;

    /// Checks this part's values; `section` (`bus`, `keys`) prefixes the
    /// keys it names.
    fn check(&self, section: &str) -> Result<(), Invalid> {
        let _ = section;
        Ok(())
    }
}

/// A duration written as `"10s"`, for [`Part::read`]:
/// `self.x = map.next_value::<Human>()?.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Human(pub Duration);

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::config::duration::deserialize(d).map(Human)
    }
}

/// A section read key by key: its shared keys, then its [`Part`]'s.
trait Fields: Default {
    /// The agent's part.
    type Own: Part;

    /// The shared keys.
    const SHARED: &'static [&'static str];

    /// Reads `key` when it is one of the shared keys.
    fn read_shared<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error>;

    /// The agent's part.
    fn own_mut(&mut self) -> &mut Self::Own;
}

struct SectionVisitor<T>(PhantomData<T>);

impl<'de, T: Fields> Visitor<'de> for SectionVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut value = T::default();
        while let Some(key) = map.next_key::<String>()? {
            if !value.read_shared(&key, &mut map)? && !value.own_mut().read(&key, &mut map)? {
                let expected: Vec<String> = T::SHARED
                    .iter()
                    .chain(<T::Own as Part>::KEYS)
                    .map(|k| format!("`{k}`"))
                    .collect();
                return Err(A::Error::custom(format!(
                    "unknown field `{key}`, expected one of {}",
                    expected.join(", ")
                )));
            }
        }
        Ok(value)
    }
}

/// What a shared section with an agent's part implements the same way:
/// `Deserialize` (shared keys, then the part's, unknown ones refused) and
/// `Deref` to the part.
macro_rules! section_with_part {
    ($section:ident, $part:ident) => {
        impl<'de, X: $part> serde::Deserialize<'de> for $section<X> {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_map(super::SectionVisitor(std::marker::PhantomData))
            }
        }

        impl<X> std::ops::Deref for $section<X> {
            type Target = X;

            fn deref(&self) -> &X {
                &self.own
            }
        }

        impl<X> std::ops::DerefMut for $section<X> {
            fn deref_mut(&mut self) -> &mut X {
                &mut self.own
            }
        }
    };
}
use section_with_part;

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `human` or `json`. Default `human`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `gearshift_node=debug,info`;
    /// `RUST_LOG` overrides it. Default `info`.
    pub level: String,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

impl LogSection {
    /// Checks the filter.
    pub fn check(&self) -> Result<(), Invalid> {
        crate::logging::check_level(&self.level).map_err(|e| Invalid::new("log.level", e))
    }

    /// Installs the global subscriber, with `format` (the command line's
    /// `--log-format`) before the file's.
    pub fn init(&self, format: Option<LogFormat>) {
        crate::logging::init(format.unwrap_or(self.format), &self.level);
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Address of the `/metrics` listener (the broker agent also serves its
    /// dashboard there). Default none: no listener.
    pub listen: Option<SocketAddr>,
}

#[cfg(test)]
mod tests;
