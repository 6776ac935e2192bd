//! Configuration loading: TOML file, then environment overrides, then
//! validation, all before any network access.
//!
//! Environment overrides use the agent's prefix, `_` after it and `__`
//! between levels: `GEARSHIFT_BROKER_POLICY__PROFILE_THRESHOLD=85` sets
//! `policy.profile_threshold`.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use thiserror::Error;

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

/// A semantic problem found by [`Validate::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
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
    // Parse once with the toml crate for precise syntax errors.
    toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Syntax {
        path: path.to_path_buf(),
        reason: e.to_string().trim().replace('\n', " "),
    })?;
    let prefix = format!("{}_", env_prefix.to_ascii_uppercase());
    let env_map: config::Map<String, String> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect();
    let cfg = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .add_source(
            config::Environment::with_prefix(env_prefix)
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(env_map)),
        )
        .build()
        .map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let value: T = serde_path_to_error::deserialize(cfg).map_err(|e| {
        let key = e.path().to_string();
        ConfigError::Key {
            path: path.to_path_buf(),
            key: if key == "." {
                "(top level)".into()
            } else {
                key
            },
            reason: clean_reason(&e.inner().to_string()),
        }
    })?;
    value.validate().map_err(|i| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: i.key,
        reason: i.reason,
    })?;
    Ok(value)
}

fn clean_reason(s: &str) -> String {
    // config appends " for key `x`" itself in some errors; we already name the key.
    match s.find(" for key `") {
        Some(i) => s[..i].to_string(),
        None => s.to_string(),
    }
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
}
