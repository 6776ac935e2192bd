//! What a reload may change: the keys whose values differ between the
//! running configuration and the new file, and among them those that only
//! take effect at start (so that a reload naming them is refused, naming
//! them, instead of half-applied).

use serde::Serialize;
use serde_json::Value;

/// The dotted paths (`bus.url`, `keys.trust`) of the keys whose values differ
/// between `old` and `new`. Tables are compared key by key; arrays and
/// scalars as a whole.
pub fn changed_keys<C: Serialize>(old: &C, new: &C) -> Vec<String> {
    let (Ok(a), Ok(b)) = (serde_json::to_value(old), serde_json::to_value(new)) else {
        return vec!["<configuration does not serialize>".into()];
    };
    let mut out = Vec::new();
    diff("", &a, &b, &mut out);
    out
}

/// The changed keys that no entry of `live` covers: `live` holds the keys
/// and tables (`policy`, `keys.trust`) the agent applies while running;
/// every other change needs a restart.
pub fn needs_restart<C: Serialize>(old: &C, new: &C, live: &[&str]) -> Vec<String> {
    changed_keys(old, new)
        .into_iter()
        .filter(|k| !live.iter().any(|l| covers(l, k)))
        .collect()
}

/// The refusal's text: `these keys only apply at start (restart the agent): a, b`.
pub fn restart_message(keys: &[String]) -> String {
    format!(
        "these keys only apply at start (restart the agent to change them): {}",
        keys.join(", ")
    )
}

fn covers(live: &str, key: &str) -> bool {
    key == live
        || key
            .strip_prefix(live)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff(
                    &p,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_each_changed_leaf_by_its_dotted_path() {
        let a = json!({"bus": {"url": "amqp://a", "prefetch": 10}, "policy": {"interval": "60s"}});
        let b = json!({"bus": {"url": "amqp://b", "prefetch": 10}, "policy": {"interval": "30s"}});
        assert_eq!(changed_keys(&a, &b), vec!["bus.url", "policy.interval"]);
        assert!(changed_keys(&a, &a).is_empty());
    }

    #[test]
    fn keys_present_on_one_side_only_count_as_changed() {
        let a = json!({"handlers": {"log": {}}});
        let b = json!({"handlers": {"log": {}, "cloud": {"type": "exec"}}});
        assert_eq!(changed_keys(&a, &b), vec!["handlers.cloud"]);
    }

    #[test]
    fn live_prefixes_cover_whole_tables_but_not_siblings_sharing_a_prefix() {
        let a = json!({"keys": {"signing_key": "a", "trust": []}, "metrics": {"listen": null}, "policyx": 1});
        let b = json!({"keys": {"signing_key": "b", "trust": ["x"]}, "metrics": {"listen": "127.0.0.1:1"}, "policyx": 2});
        let live = ["keys.trust", "metrics.listen", "policy"];
        assert_eq!(
            needs_restart(&a, &b, &live),
            vec!["keys.signing_key", "policyx"]
        );
        assert!(restart_message(&["bus.url".into()]).ends_with("bus.url"));
    }
}
