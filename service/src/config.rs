//! Configuration loading: TOML file, then environment overrides, then
//! validation, all before any network access.
//!
//! Environment overrides use the agent's prefix, `_` after it and `__`
//! between levels: `GEARSHIFT_BROKER_POLICY__PROFILE_THRESHOLD=85` sets
//! `policy.profile_threshold`.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use thiserror::Error;

mod documented;

pub use documented::Documented;

/// Why a configuration could not be loaded. Every variant names the file
/// and, where it can, the key.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file is not valid TOML.
    #[error("{path}: not valid TOML: {reason}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Parser's message, with line and column.
        reason: String,
    },
    /// A key has the wrong type, is unknown, or is missing.
    #[error("{path}: key `{key}`: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// Dotted key path, for example `policy.profile_threshold`.
        key: String,
        /// Why.
        reason: String,
    },
    /// Values are well-typed but not acceptable together or alone.
    #[error("{path}: key `{key}`: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key path.
        key: String,
        /// Why.
        reason: String,
    },
}

/// A value that is well-typed but refused: the one validation error of both
/// agents' configuration checks, the handlers' and `[push_stats]`'s. Its
/// `key` is the dotted path of the offending key (relative to the table
/// being checked; callers that embed a table prefix it with [`Invalid::under`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{key}: {reason}")]
pub struct Invalid {
    /// Dotted key path.
    pub key: String,
    /// Why the value is refused.
    pub reason: String,
}

impl Invalid {
    /// A problem with `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The same problem with its key below `prefix` (`handlers.nova` +
    /// `auth.cloud` gives `handlers.nova.auth.cloud`).
    pub fn under(self, prefix: &str) -> Self {
        Invalid {
            key: format!("{prefix}.{}", self.key),
            reason: self.reason,
        }
    }
}

/// Checks a deserialized config for values that are well-typed but wrong.
pub trait Validate {
    /// Returns the first problem found.
    fn validate(&self) -> Result<(), Invalid>;
}

/// Loads `path` (TOML) with overrides from environment variables starting
/// with `env_prefix` (for example `GEARSHIFT_BROKER`), and validates it.
pub fn load<T: DeserializeOwned + Validate>(
    path: &Path,
    env_prefix: &str,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    load_str(&text, path, env_prefix, std::env::vars())
}

/// Like [`load`], from a string and an explicit environment (for tests and
/// for built-in defaults).
pub fn load_str<T: DeserializeOwned + Validate>(
    text: &str,
    path: &Path,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let mut table = toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Syntax {
        path: path.to_path_buf(),
        reason: e.to_string().trim().replace('\n', " "),
    })?;
    let prefix = format!("{}_", env_prefix.to_ascii_uppercase());
    let mut overrides: Vec<(Vec<String>, String)> = env
        .into_iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(&prefix)?;
            let keys: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            Some((keys, v))
        })
        .collect();
    // Deterministic whatever the environment's order.
    overrides.sort();
    for (keys, raw) in &overrides {
        set_key(&mut table, keys, env_value(raw)).map_err(|reason| ConfigError::Key {
            path: path.to_path_buf(),
            key: keys.join("."),
            reason,
        })?;
    }
    // An override is typed by its text ("85" a number, "true" a boolean);
    // where the field wants text after all (a node named "1234"), it is
    // given again as text. Bounded: one retry per override at most.
    let value: T;
    let mut retried = 0;
    loop {
        match serde_path_to_error::deserialize::<_, T>(toml::Value::Table(table.clone())) {
            Ok(v) => {
                value = v;
                break;
            }
            Err(e) => {
                let key = e.path().to_string();
                let as_text = overrides
                    .iter()
                    .find(|(k, raw)| k.join(".") == key && env_value(raw).as_str().is_none());
                if let Some((keys, raw)) = as_text
                    && retried < overrides.len()
                {
                    retried += 1;
                    set_key(&mut table, keys, toml::Value::String(raw.clone())).map_err(
                        |reason| ConfigError::Key {
                            path: path.to_path_buf(),
                            key: key.clone(),
                            reason,
                        },
                    )?;
                    continue;
                }
                return Err(ConfigError::Key {
                    path: path.to_path_buf(),
                    key: if key == "." || key.is_empty() {
                        "(top level)".into()
                    } else {
                        key
                    },
                    reason: e.inner().to_string(),
                });
            }
        }
    }
    value.validate().map_err(|i| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: i.key,
        reason: i.reason,
    })?;
    Ok(value)
}

/// An environment value as TOML: a boolean, an integer or a float when its
/// text is one, else a string.
fn env_value(raw: &str) -> toml::Value {
    let t = raw.trim();
    if t.eq_ignore_ascii_case("true") {
        toml::Value::Boolean(true)
    } else if t.eq_ignore_ascii_case("false") {
        toml::Value::Boolean(false)
    } else if let Ok(i) = t.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(f) = t.parse::<f64>()
        && f.is_finite()
        && t.bytes().any(|b| b.is_ascii_digit())
    {
        toml::Value::Float(f)
    } else {
        toml::Value::String(raw.to_string())
    }
}

/// Sets `keys` (a dotted path) in `table`, making the tables on the way.
fn set_key(table: &mut toml::Table, keys: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = keys.split_last() else {
        return Err("empty key".into());
    };
    if keys.iter().any(String::is_empty) {
        return Err("empty key segment (two `__` in a row, or a trailing `__`)".into());
    }
    let mut t = table;
    for (i, k) in parents.iter().enumerate() {
        let entry = t
            .entry(k.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(inner) => inner,
            _ => {
                return Err(format!(
                    "`{}` is a value, not a table: cannot set a key below it",
                    keys[..=i].join(".")
                ));
            }
        };
    }
    t.insert(last.clone(), value);
    Ok(())
}

/// Serde helpers for durations written as `"10s"`, `"5m"`, `"1h 30m"`.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Deserializes a humantime duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "{s:?} is not a duration like \"10s\" or \"5m\": {e}"
            ))
        })
    }

    /// Serializes as a humantime duration.
    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*v).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::time::Duration;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Conf {
        name: String,
        #[serde(default)]
        policy: Policy,
    }

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Policy {
        threshold: u32,
        #[serde(with = "duration")]
        interval: Duration,
    }

    impl Validate for Conf {
        fn validate(&self) -> Result<(), Invalid> {
            if self.policy.threshold > 100 {
                return Err(Invalid::new("policy.threshold", "must be at most 100"));
            }
            Ok(())
        }
    }

    fn load_test(text: &str, env: &[(&str, &str)]) -> Result<Conf, ConfigError> {
        load_str(
            text,
            Path::new("test.toml"),
            "GEARSHIFT_TEST",
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn loads_and_overrides_from_env() {
        let c = load_test(
            "name = \"a\"\n[policy]\nthreshold = 80\ninterval = \"60s\"\n",
            &[("GEARSHIFT_TEST_POLICY__THRESHOLD", "90"), ("OTHER", "x")],
        )
        .unwrap();
        assert_eq!(c.name, "a");
        assert_eq!(c.policy.threshold, 90);
        assert_eq!(c.policy.interval, Duration::from_secs(60));
    }

    #[test]
    fn errors_name_the_key() {
        let e = load_test(
            "name = \"a\"\n[policy]\nthreshold = \"lots\"\ninterval = \"1s\"\n",
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("policy.threshold"), "{e}");
        let e = load_test("name = \"a\"\n[policy]\nthreshhold = 1\n", &[]).unwrap_err();
        assert!(e.to_string().contains("threshhold"), "{e}");
        let e = load_test("name = \"a\"\n[policy]\ninterval = \"soon\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("policy.interval"), "{e}");
        let e = load_test(
            "name = \"a\"\n[policy]\nthreshold = 101\ninterval = \"1s\"\n",
            &[],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("policy.threshold") && e.to_string().contains("at most 100"),
            "{e}"
        );
        let e = load_test("name = ", &[]).unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    }

    #[test]
    fn environment_values_take_the_fields_type() {
        // A number-looking value for a text field is text; a new table is made.
        let c = load_test(
            "name = \"a\"\n",
            &[
                ("GEARSHIFT_TEST_NAME", "1234"),
                ("GEARSHIFT_TEST_POLICY__INTERVAL", "5m"),
                ("GEARSHIFT_TEST_POLICY__THRESHOLD", "7"),
            ],
        )
        .unwrap();
        assert_eq!(c.name, "1234");
        assert_eq!(c.policy.interval, Duration::from_secs(300));
        assert_eq!(c.policy.threshold, 7);
        // A wrong value names the key it came in as.
        let e = load_test(
            "name = \"a\"\n",
            &[("GEARSHIFT_TEST_POLICY__THRESHOLD", "many")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("policy.threshold"), "{e}");
        // Below a plain value, or an empty segment: refused with the key.
        let e = load_test("name = \"a\"\n", &[("GEARSHIFT_TEST_NAME__FIRST", "x")]).unwrap_err();
        assert!(
            e.to_string().contains("name.first") && e.to_string().contains("not a table"),
            "{e}"
        );
        let e = load_test("name = \"a\"\n", &[("GEARSHIFT_TEST_POLICY____X", "1")]).unwrap_err();
        assert!(e.to_string().contains("empty key segment"), "{e}");
        // An unknown key from the environment is refused like one in the file.
        let e = load_test(
            "name = \"a\"\n",
            &[("GEARSHIFT_TEST_POLICY__TRESHOLD", "1")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("treshold"), "{e}");
    }
}
