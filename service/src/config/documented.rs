//! The shipped configuration files document every default: a check that
//! keeps them in step with the compiled defaults.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Validate, load_str};

/// How a shipped configuration file (`conf/broker.toml`) documents the
/// compiled defaults; [`Documented::check`] compares the two.
#[derive(Debug, Clone, Copy, Default)]
pub struct Documented<'a> {
    /// Dotted paths of keys the file sets to an example value rather than
    /// the default (a path names a key, or every key below a table).
    pub examples: &'a [&'a str],
    /// Only keys below this table are compared (`push_stats` for a file of
    /// one section); none: every key.
    pub under: Option<&'a str>,
    /// Keys or tables whose defaults the file need not show (documented in
    /// another file, or by a commented-out example).
    pub not_shown: &'a [&'a str],
}

fn within(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
}

impl Documented<'_> {
    /// Compares the file's text with the compiled `defaults` and returns
    /// every problem found:
    /// - a key of the file whose value is not the compiled default, unless
    ///   it is an example;
    /// - a key with a compiled default that the file does not show;
    /// - an example that the file does not set.
    ///
    /// Values are compared after a round trip through the typed
    /// configuration, so `"60s"` and `"1m"` are the same default.
    pub fn check<T>(&self, file: &str, defaults: &T) -> Vec<String>
    where
        T: Serialize + DeserializeOwned + Validate,
    {
        let raw: toml::Table = match toml::from_str(file) {
            Ok(t) => t,
            Err(e) => return vec![format!("not valid TOML: {e}")],
        };
        let loaded: T = match load_str(file, Path::new("<shipped>"), "", Vec::new()) {
            Ok(c) => c,
            Err(e) => return vec![e.to_string()],
        };
        let (Ok(got), Ok(want)) = (
            toml::Value::try_from(&loaded),
            toml::Value::try_from(defaults),
        ) else {
            return vec!["the configuration does not serialize to TOML".into()];
        };
        let in_scope = |p: &String| self.under.is_none_or(|u| within(p, u));
        let file_keys: BTreeMap<_, _> = leaves(&raw.into())
            .into_iter()
            .filter(|(p, _)| in_scope(p))
            .collect();
        let (got, want) = (leaves(&got), leaves(&want));
        let is_example = |p: &str| self.examples.iter().any(|e| within(p, e));
        let mut problems = Vec::new();
        for path in file_keys.keys().filter(|p| !is_example(p)) {
            match (got.get(path), want.get(path)) {
                (Some(g), Some(w)) if g == w => {}
                (g, w) => problems.push(format!(
                    "{path}: the file says {}, the compiled default is {}",
                    show(g),
                    show(w)
                )),
            }
        }
        let shown =
            |p: &str| file_keys.contains_key(p) || self.not_shown.iter().any(|n| within(p, n));
        for path in want.keys().filter(|p| in_scope(p) && !shown(p)) {
            problems.push(format!(
                "{path}: has a compiled default ({}) that the file does not show",
                show(want.get(path))
            ));
        }
        for e in self.examples {
            if !file_keys.keys().any(|p| within(p, e)) {
                problems.push(format!("{e}: listed as an example but not in the file"));
            }
        }
        problems
    }
}

fn show(v: Option<&toml::Value>) -> String {
    v.map_or_else(|| "absent".to_string(), toml::Value::to_string)
}

/// Every leaf of `v` by dotted path: values and arrays (an array is one
/// leaf); an empty table is a leaf too (`handlers = {}`), so that it is
/// documented like any other default.
fn leaves(v: &toml::Value) -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
        match v {
            toml::Value::Table(t) if !t.is_empty() || prefix.is_empty() => {
                for (k, v) in t {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&p, v, out);
                }
            }
            // An empty table of named entries (`[handlers]`) is left out:
            // it has no default to show.
            toml::Value::Table(_) => {}
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;
    use crate::config::{Invalid, duration};

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Conf {
        #[serde(with = "duration")]
        every: Duration,
        name: Option<String>,
        list: Vec<u32>,
    }

    impl Default for Conf {
        fn default() -> Self {
            Conf {
                every: Duration::from_secs(60),
                name: None,
                list: vec![1],
            }
        }
    }

    impl Validate for Conf {
        fn validate(&self) -> Result<(), Invalid> {
            Ok(())
        }
    }

    #[test]
    fn drift_and_gaps_are_named() {
        let d = Conf::default();
        let check = |text: &str, examples: &[&str]| {
            Documented {
                examples,
                ..Documented::default()
            }
            .check(text, &d)
        };
        assert!(check("every = \"1m\"\nlist = [1]\n", &[]).is_empty());
        let p = check("every = \"2m\"\nlist = [1]\n", &[]);
        assert!(p.len() == 1 && p[0].starts_with("every:"), "{p:?}");
        let p = check("every = \"1m\"\n", &[]);
        assert!(p.len() == 1 && p[0].contains("list") && p[0].contains("does not show"));
        let ok = "every = \"1m\"\nlist = [1]\nname = \"x\"\n";
        assert!(check(ok, &["name"]).is_empty());
        assert_eq!(check(ok, &[]).len(), 1);
        let p = check("every = \"1m\"\nlist = [1]\n", &["name"]);
        assert!(p.len() == 1 && p[0].contains("example"), "{p:?}");
        let partial = Documented {
            under: Some("every"),
            not_shown: &["list"],
            ..Documented::default()
        };
        assert!(partial.check("every = \"1m\"\n", &d).is_empty());
        assert_eq!(partial.check("every = \"3m\"\n", &d).len(), 1);
    }
}
