//! The benchmark's real node: a `gearshift-node` process (the `dir`
//! runtime, 100 gears) with the environment of its packaged systemd unit,
//! whose memory is measured idle and while the broker agent evacuates it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gearshift_proto::KeyPair;
use gearshift_proto::msg::AdminRequest;

use crate::fleet::Keys;
use crate::fleet::keys::write_private;
use crate::harness::broker::BrokerProc;
use crate::harness::process::Proc;

/// Where and what the real node is.
pub(super) struct RealNode<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its own key (trusted by the broker agent through `nodes.d/`).
    pub key: &'a KeyPair,
    /// Its district.
    pub district: &'a str,
    /// Its profile.
    pub profile: &'a str,
}

/// Starts the real node under `dir/real-node` on `url`.
pub(super) fn start_real_node(
    bin: &Path,
    dir: &Path,
    url: &str,
    node: &RealNode<'_>,
    keys: &Keys,
) -> anyhow::Result<Proc> {
    let RealNode {
        name,
        key,
        district,
        profile,
    } = *node;
    use gearshift_node::config::{NodeConfig, RuntimeKind};
    let base = dir.join("real-node");
    let gears = base.join("gears");
    std::fs::create_dir_all(&gears)?;
    for k in 0..100 {
        let g = gears.join(format!("real{k:04}"));
        std::fs::create_dir_all(&g)?;
        std::fs::write(g.join("data"), format!("gear {k}\n").repeat(64))?;
    }
    write_private(&base.join("node.key"), &key.to_pem())?;
    let mut c = NodeConfig::default();
    c.node.name = Some(name.to_string());
    c.bus.url = url.to_string();
    c.keys.signing_key = base.join("node.key");
    c.keys.broker_keys = vec![keys.path("broker.pub")];
    c.state.dir = base.join("state");
    c.report.interval = Duration::from_secs(10);
    c.runtime.kind = RuntimeKind::Dir;
    c.runtime.facts.profile = profile.to_string();
    c.runtime.facts.max_active_gears = 100;
    c.runtime.facts.district_uuid = Some(district.to_string());
    c.runtime.facts.district_first_uid = Some(1000);
    c.runtime.facts.district_max_uid = Some(1000 + 50_000 - 1);
    c.runtime.dir.root = gears;
    c.runtime.dir.target_root = format!("{}/targets/{{target}}/gears", base.display());
    c.log.level = "warn".into();
    let text = toml::to_string(&c).context("node configuration")?;
    let path = base.join("node.toml");
    std::fs::write(&path, text)?;
    let mut p = Proc::new(
        "gearshift-node",
        bin,
        &["run", "--config", &path.to_string_lossy()],
        &base.join("node.log"),
    );
    // The environment the packaged systemd unit gives the agent.
    for (k, v) in unit_environment(NODE_UNIT) {
        p = p.env(&k, &v);
    }
    p.start()?;
    Ok(p)
}

/// The node agent's systemd unit, as packaged.
const NODE_UNIT: &str = include_str!("../../../packaging/systemd/gearshift-node.service");

/// The `Environment=` assignments of a systemd unit, in order: `KEY=value`
/// words separated by spaces, a word in double quotes may hold spaces.
fn unit_environment(unit: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for line in unit.lines() {
        let Some(rest) = line.trim().strip_prefix("Environment=") else {
            continue;
        };
        let mut words = vec![String::new()];
        let mut quoted = false;
        for c in rest.chars() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => words.push(String::new()),
                c => words.last_mut().into_iter().for_each(|w| w.push(c)),
            }
        }
        out.extend(words.iter().filter_map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        }));
    }
    out
}

/// Asks the broker agent to evacuate the real node and samples its memory
/// every 20 ms until its gear directory is empty. (peak MiB, gears moved)
pub(super) async fn evacuate_real_node(
    np: &mut Proc,
    broker: &BrokerProc,
    node: &str,
    dir: &Path,
) -> anyhow::Result<(f64, usize)> {
    let gears = dir.join("real-node/gears");
    let count = || {
        std::fs::read_dir(&gears)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    };
    let before = count();
    let r = broker
        .admin(
            AdminRequest::Evacuate {
                node: node.to_string(),
            },
            Duration::from_secs(10),
        )
        .await
        .context("evacuate request")?;
    if !r.ok {
        bail!("the broker agent refused to evacuate {node}: {}", r.message);
    }
    let mut peak = np.rss_mb().unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while count() > 0 {
        if Instant::now() >= deadline {
            bail!(
                "{node} still holds {} gears after 120 s:\n{}",
                count(),
                np.log_tail(30)
            );
        }
        if let Some(m) = np.rss_mb() {
            peak = peak.max(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A little longer: the final events and report.
    for _ in 0..25 {
        if let Some(m) = np.rss_mb() {
            peak = peak.max(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((peak, before))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_node_runs_with_its_units_environment() {
        let unit =
            "[Service]\nEnvironment=A=1 \"B=x y\"\nEnvironmentFile=-/etc/x\n  Environment=C=3\n";
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            super::unit_environment(unit),
            pairs(&[("A", "1"), ("B", "x y"), ("C", "3")])
        );
        assert!(
            super::unit_environment(super::NODE_UNIT)
                .iter()
                .any(|(k, v)| k == "MALLOC_ARENA_MAX" && v == "1"),
            "the packaged unit sets MALLOC_ARENA_MAX"
        );
    }
}
