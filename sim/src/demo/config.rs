//! The demo's configurations: `broker.toml` and `node.toml` embedded in the
//! binary, loaded through the agents' own configuration structures, loaders
//! (with `GEARSHIFT_BROKER_*` / `GEARSHIFT_NODE_*` environment overrides)
//! and checks, then completed with what only the demo knows.

use std::path::Path;
use std::time::Duration;

use gearshift_broker::config::BrokerConfig;
use gearshift_node::NodeConfig;
use gearshift_service::config::{ConfigError, Invalid, Validate};

/// The embedded broker agent configuration.
pub const BROKER_TOML: &str = include_str!("broker.toml");
/// The embedded node agent configuration.
pub const NODE_TOML: &str = include_str!("node.toml");

/// Nothing is scaled below this (the agents' own minimum for most intervals).
const FLOOR: Duration = Duration::from_millis(50);

/// `d` at `speed` (2.0 runs twice as fast), never below 50 ms.
pub fn scaled(d: Duration, speed: f64) -> Duration {
    d.div_f64(speed).max(FLOOR)
}

/// The broker agent's configuration, as the embedded file and the
/// environment give it (checked).
pub fn broker_base() -> Result<BrokerConfig, ConfigError> {
    gearshift_service::config::load_str(
        BROKER_TOML,
        Path::new("<demo broker.toml>"),
        gearshift_broker::config::ENV_PREFIX,
        std::env::vars(),
    )
}

/// The node agents' configuration template (checked).
pub fn node_base() -> Result<NodeConfig, ConfigError> {
    gearshift_service::config::load_str(
        NODE_TOML,
        Path::new("<demo node.toml>"),
        gearshift_node::config::ENV_PREFIX,
        std::env::vars(),
    )
}

/// What the demo fills in on the broker agent's configuration.
#[derive(Debug, Clone)]
pub struct BrokerSetup<'a> {
    /// Agent name.
    pub name: &'a str,
    /// State directory.
    pub state_dir: &'a Path,
    /// Bus URL.
    pub bus_url: &'a str,
    /// Suffix of the durable queue names and the admin key (unique per run).
    pub tag: &'a str,
    /// The group's floor: the fleet never shrinks below its initial size.
    pub min_nodes: u32,
    /// Time scale.
    pub speed: f64,
    /// Signing key file (for `gearshift-broker status --config`).
    pub signing_key: &'a Path,
}

/// Completes `c` for this run and checks it again.
pub fn complete_broker(mut c: BrokerConfig, s: &BrokerSetup<'_>) -> Result<BrokerConfig, Invalid> {
    c.agent.name = s.name.to_string();
    c.agent.state_dir = s.state_dir.to_path_buf();
    c.agent.events_queue = format!("gearshift.demo.{}.broker-events", s.tag);
    c.agent.cluster = gearshift_broker::config::AgentSection::cluster_of(s.tag);
    c.agent.admin_queue = format!("gearshift.demo.{}.broker-admin", s.tag);
    c.agent.admin_key = format!("admin.request.demo.{}", s.tag);
    c.agent.placement_service = false;
    c.bus.url = s.bus_url.to_string();
    c.keys.signing_key = s.signing_key.to_path_buf();
    c.group_defaults.min_nodes = s.min_nodes;
    c.group_defaults.max_nodes = c.group_defaults.max_nodes.max(s.min_nodes + 2);
    let sp = s.speed;
    let p = &mut c.policy;
    for d in [
        &mut p.interval,
        &mut p.react_delay,
        &mut p.startup_grace,
        &mut p.cooldown_after_scale_up,
        &mut p.cooldown_after_scale_down,
        &mut p.cooldown_after_failure,
        &mut p.scale_down_stabilization,
        &mut p.backoff_initial,
        &mut p.backoff_max,
    ] {
        *d = scaled(*d, sp);
    }
    // Deadlines only grow when the demo runs slower: a faster demo keeps them.
    if sp < 1.0 {
        for d in [
            &mut p.provision_timeout,
            &mut c.saga.command_timeout,
            &mut c.saga.evacuation_timeout,
            &mut c.saga.confirm_empty_timeout,
            &mut c.saga.remove_timeout,
        ] {
            *d = scaled(*d, sp);
        }
    }
    c.saga.presence_poll = scaled(c.saga.presence_poll, sp);
    c.validate()?;
    Ok(c)
}

/// Completes the node template for this run (names, keys and facts are
/// filled per node by [`crate::fleet::SimFleet`]) and checks it again.
pub fn complete_node(mut c: NodeConfig, bus_url: &str, speed: f64) -> Result<NodeConfig, Invalid> {
    c.bus.url = bus_url.to_string();
    // The node agent accepts reports every 100 ms at most.
    c.report.interval = scaled(c.report.interval, speed).max(Duration::from_millis(100));
    c.report.scan_interval = scaled(c.report.scan_interval, speed);
    c.runtime.sim.move_time = scaled(c.runtime.sim.move_time, speed);
    c.validate()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_files_pass_the_agents_checks() {
        let b = broker_base().unwrap();
        assert_eq!(b.group_defaults.handler, "cloud");
        assert!(!b.agent.placement_service);
        let dir = Path::new("/tmp/x");
        let c = complete_broker(
            b,
            &BrokerSetup {
                name: "demo-broker",
                state_dir: dir,
                bus_url: "memory://t",
                tag: "t",
                min_nodes: 3,
                speed: 2.0,
                signing_key: dir,
            },
        )
        .unwrap();
        assert_eq!(c.policy.interval, Duration::from_millis(250));
        assert_eq!(c.group_defaults.min_nodes, 3);
        let n = complete_node(node_base().unwrap(), "memory://t", 0.5).unwrap();
        assert_eq!(n.report.interval, Duration::from_millis(600));
        assert_eq!(n.runtime.kind, gearshift_node::config::RuntimeKind::Sim);
    }

    #[test]
    fn every_speed_gives_valid_configurations() {
        for speed in [0.25, 0.5, 1.0, 2.0, 3.3, 4.0] {
            let dir = Path::new("/tmp/x");
            complete_broker(
                broker_base().unwrap(),
                &BrokerSetup {
                    name: "b",
                    state_dir: dir,
                    bus_url: "memory://t",
                    tag: "t",
                    min_nodes: 12,
                    speed,
                    signing_key: dir,
                },
            )
            .unwrap_or_else(|e| panic!("speed {speed}: {e:?}"));
            complete_node(node_base().unwrap(), "memory://t", speed)
                .unwrap_or_else(|e| panic!("speed {speed}: {e:?}"));
        }
    }

    #[test]
    fn scaling_has_a_floor() {
        assert_eq!(
            scaled(Duration::from_millis(60), 4.0),
            Duration::from_millis(50)
        );
        assert_eq!(scaled(Duration::from_secs(2), 0.5), Duration::from_secs(4));
    }
}
