//! Per-profile (and per-district) values written the way OpenShift's admin
//! console wrote its advisor keys: `"default, profile: value, profile: value"`.
//!
//! - `"80"` is 80 for everybody;
//! - `"80, large: 85"` is 85 for the `large` profile (or a district whose
//!   UUID is `large`) and 80 for the others;
//! - `"none"` or `""` disables the rule; `"200, small: none"` disables it
//!   for `small` only.
//!
//! A bare TOML integer (`profile_threshold = 80`) is accepted too.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value per profile or district, with a default; `None` means the rule is off.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PerKey {
    /// The value for keys that have none of their own (`None`: off).
    pub default: Option<u32>,
    /// Values for named profiles or districts (`None`: off for that key).
    pub overrides: BTreeMap<String, Option<u32>>,
}

/// Why a per-profile string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PerKeyError {
    /// A number could not be read.
    #[error("{0:?} is not a whole number (or `none`)")]
    NotANumber(String),
    /// An entry has more than one `:`.
    #[error("entry {0:?} has more than one `:` (expected `profile: value`)")]
    TooManyColons(String),
    /// An entry has an empty profile name.
    #[error("entry {0:?} has no profile name before `:`")]
    EmptyName(String),
    /// Two defaults were given.
    #[error("two default values ({0} and {1}); write `default, profile: value`")]
    TwoDefaults(String, String),
    /// The same profile was named twice.
    #[error("profile {0:?} is given twice")]
    Duplicate(String),
}

impl PerKey {
    /// The same value for everybody.
    pub fn all(v: u32) -> Self {
        PerKey {
            default: Some(v),
            overrides: BTreeMap::new(),
        }
    }

    /// Off for everybody.
    pub fn off() -> Self {
        PerKey::default()
    }

    /// Parses the `"default, profile: value"` form.
    pub fn parse(s: &str) -> Result<PerKey, PerKeyError> {
        let mut out = PerKey::default();
        let mut default_seen: Option<String> = None;
        for entry in s.split(',') {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
            match parts.as_slice() {
                [value] => {
                    if let Some(prev) = &default_seen {
                        return Err(PerKeyError::TwoDefaults(prev.clone(), value.to_string()));
                    }
                    default_seen = Some(value.to_string());
                    out.default = parse_value(value)?;
                }
                [name, value] => {
                    if name.is_empty() {
                        return Err(PerKeyError::EmptyName(entry.to_string()));
                    }
                    let v = parse_value(value)?;
                    if out.overrides.insert(name.to_string(), v).is_some() {
                        return Err(PerKeyError::Duplicate(name.to_string()));
                    }
                }
                _ => return Err(PerKeyError::TooManyColons(entry.to_string())),
            }
        }
        Ok(out)
    }

    /// The value for a group: its district's own value, else its profile's,
    /// else the default. `None` when the rule is off for it.
    pub fn get(&self, district: &str, profile: &str) -> Option<u32> {
        if let Some(v) = self.overrides.get(district) {
            return *v;
        }
        if let Some(v) = self.overrides.get(profile) {
            return *v;
        }
        self.default
    }

    /// The value for a profile (ignoring district overrides).
    pub fn for_profile(&self, profile: &str) -> Option<u32> {
        match self.overrides.get(profile) {
            Some(v) => *v,
            None => self.default,
        }
    }

    /// Every value given, for range checks.
    pub fn values(&self) -> impl Iterator<Item = (&str, u32)> {
        self.default.map(|v| ("default", v)).into_iter().chain(
            self.overrides
                .iter()
                .filter_map(|(k, v)| v.map(|v| (k.as_str(), v))),
        )
    }
}

fn parse_value(s: &str) -> Result<Option<u32>, PerKeyError> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.parse::<u32>()
        .map(Some)
        .map_err(|_| PerKeyError::NotANumber(s.to_string()))
}

impl fmt::Display for PerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = |v: &Option<u32>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
        let mut parts = vec![];
        if self.default.is_some() || self.overrides.is_empty() {
            parts.push(v(&self.default));
        }
        for (k, val) in &self.overrides {
            parts.push(format!("{k}: {}", v(val)));
        }
        f.write_str(&parts.join(", "))
    }
}

impl Serialize for PerKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for PerKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Str(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a whole number or a string like \"80, large: 85\" (`none` disables)",
            )
        })? {
            Raw::Int(i) => u32::try_from(i)
                .map(PerKey::all)
                .map_err(|_| serde::de::Error::custom(format!("{i} is out of range"))),
            Raw::Str(s) => PerKey::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_admin_console_form() {
        let p = PerKey::parse("200, small: 100, large: none").unwrap();
        assert_eq!(p.for_profile("small"), Some(100));
        assert_eq!(p.for_profile("large"), None);
        assert_eq!(p.for_profile("medium"), Some(200));
        assert_eq!(p.get("d1", "medium"), Some(200));
        let only = PerKey::parse("small: 5").unwrap();
        assert_eq!(only.for_profile("medium"), None, "no default: off");
        assert_eq!(PerKey::parse("").unwrap(), PerKey::off());
        assert_eq!(PerKey::parse("none").unwrap(), PerKey::off());
        assert_eq!(PerKey::parse(" 80 ").unwrap(), PerKey::all(80));
    }

    #[test]
    fn district_overrides_win_over_profile() {
        let p = PerKey::parse("90, small: 85, d7: 95").unwrap();
        assert_eq!(p.get("d7", "small"), Some(95));
        assert_eq!(p.get("d1", "small"), Some(85));
        assert_eq!(p.get("d1", "large"), Some(90));
    }

    #[test]
    fn clear_errors() {
        assert_eq!(
            PerKey::parse("80, small: lots").unwrap_err(),
            PerKeyError::NotANumber("lots".into())
        );
        assert!(matches!(
            PerKey::parse("80, 90"),
            Err(PerKeyError::TwoDefaults(..))
        ));
        assert!(matches!(
            PerKey::parse("a: b: c"),
            Err(PerKeyError::TooManyColons(_))
        ));
        assert!(matches!(
            PerKey::parse(": 5"),
            Err(PerKeyError::EmptyName(_))
        ));
        assert!(matches!(
            PerKey::parse("small: 1, small: 2"),
            Err(PerKeyError::Duplicate(_))
        ));
        assert!(matches!(
            PerKey::parse("-5"),
            Err(PerKeyError::NotANumber(_))
        ));
    }

    #[test]
    fn display_round_trips() {
        for s in ["80", "200, large: none, small: 100", "none", "small: 5"] {
            let p = PerKey::parse(s).unwrap();
            assert_eq!(PerKey::parse(&p.to_string()).unwrap(), p, "{s}");
        }
    }
}
