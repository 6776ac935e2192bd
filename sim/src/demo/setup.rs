//! Everything the demo starts before its script runs: the run's plan
//! (names, keys, configurations checked by the agents' own code), the bus
//! connections, the fleet and its simulated cloud, the broker agent and the
//! placement service.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gearshift_broker::Observed;
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::status::Status;
use gearshift_bus::{BusUrl, Durability, QueueSpec, SharedBus};
use gearshift_node::NodeConfig;
use gearshift_node::runtime::sim::SimWorld;
use gearshift_proto::Keyring;
use gearshift_proto::msg::{GearState, NodeProperties, Role};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::display::Display;
use super::ledger::Ledger;
use super::workload::Placement;
use super::{DemoArgs, DemoError, config};
use crate::fleet::{FleetError, Keys, NodeSpec, SimCloud, SimFleet};
use crate::harness::bus;

/// District of the simulated fleet.
pub(super) const DISTRICT: &str = "east";
/// Profile of the simulated fleet.
pub(super) const PROFILE: &str = "small";

/// What one run is: its names, bus, keys and configurations.
pub(super) struct Plan {
    pub(super) tag: String,
    pub(super) url: String,
    pub(super) parsed: BusUrl,
    /// `memory`, `amqp` or `stomp`.
    pub(super) transport: &'static str,
    /// On a shared broker: names carry the run's tag, queues are deleted.
    pub(super) shared_broker: bool,
    /// Node names: plain on the in-process bus, tagged on a shared broker.
    suffix: String,
    pub(super) seed: u64,
    /// Node state, broker state and (unless `--keys`) the keys.
    pub(super) tmp: tempfile::TempDir,
    pub(super) keys: Keys,
    pub(super) bcfg: BrokerConfig,
    pub(super) ncfg: NodeConfig,
}

impl Plan {
    /// The run's names, its directory and keys, and the embedded
    /// configurations completed for this run.
    pub(super) fn new(args: &DemoArgs) -> Result<Plan, DemoError> {
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let url = args
            .bus
            .clone()
            .unwrap_or_else(|| format!("memory://demo-{tag}"));
        let parsed = BusUrl::parse(&url).map_err(|e| DemoError::Config(format!("--bus: {e}")))?;
        let transport = match &parsed {
            BusUrl::Memory { .. } => "memory",
            BusUrl::Amqp { .. } => "amqp",
            BusUrl::Stomp { .. } => "stomp",
        };
        let shared_broker = transport != "memory";
        let suffix = if shared_broker {
            format!("-{tag}")
        } else {
            String::new()
        };
        let tmp = tempfile::Builder::new()
            .prefix("gearshift-demo-")
            .tempdir()
            .map_err(|e| DemoError::Io(format!("cannot create a temporary directory: {e}")))?;
        let keys = match &args.keys {
            Some(d) => Keys::open_or_generate(d),
            None => Keys::generate(&tmp.path().join("keys")),
        }
        .map_err(FleetError::from)?;
        let bcfg = broker_config(args, &tmp, &keys, &url, &tag, &suffix)?;
        let ncfg = config::node_base().map_err(|e| DemoError::Config(e.to_string()))?;
        let ncfg = config::complete_node(ncfg, &url, args.speed).map_err(|i| {
            DemoError::Config(format!("<demo node.toml>: key `{}`: {}", i.key, i.reason))
        })?;
        Ok(Plan {
            tag,
            url,
            parsed,
            transport,
            shared_broker,
            suffix,
            seed: args.seed.unwrap_or_else(rand::random),
            tmp,
            keys,
            bcfg,
            ncfg,
        })
    }

    /// The name of the `i`-th node.
    pub(super) fn node(&self, i: u32) -> String {
        (self.naming())(i)
    }

    /// The cloud's names of new nodes (the same scheme).
    pub(super) fn naming(&self) -> impl Fn(u32) -> String + Send + Sync + 'static {
        let suffix = self.suffix.clone();
        move |i| format!("node-{i}{suffix}")
    }

    /// Gears a node may run.
    pub(super) fn max_active(&self) -> u32 {
        self.ncfg.runtime.facts.max_active_gears
    }

    /// What the demo is about to do, and how to watch it.
    pub(super) fn announce(&self, args: &DemoArgs, display: &Display) {
        let (n, max_active, transport) = (args.nodes, self.max_active(), self.transport);
        display.text(format!(
            "gearshift demo: 1 broker agent, {n} node agents ({PROFILE}, {max_active} active gears each, district {DISTRICT}), a simulated cloud, on the {transport} bus {}",
            self.parsed
        ));
        let p = &self.bcfg.policy;
        display.text(format!(
            "  scale up at {} % of a profile's capacity (PROFILE_THRESHOLD), compact a district below {} % (COMPACT_THRESHOLD) after {} stable; seed {}\n",
            p.profile_threshold.default.unwrap_or(80),
            p.compact_threshold.default.unwrap_or(50),
            humantime::format_duration(p.scale_down_stabilization),
            self.seed
        ));
        if let (Some(d), true) = (&args.keys, self.shared_broker) {
            display.text(format!(
                "  watch it from another terminal: gearshift-broker watch --bus <the same URL> --key {}\n",
                d.join("operator.key").display()
            ));
        }
    }
}

/// The embedded `broker.toml` completed for this run.
fn broker_config(
    args: &DemoArgs,
    tmp: &tempfile::TempDir,
    keys: &Keys,
    url: &str,
    tag: &str,
    suffix: &str,
) -> Result<BrokerConfig, DemoError> {
    let bcfg = config::broker_base().map_err(|e| DemoError::Config(e.to_string()))?;
    config::complete_broker(
        bcfg,
        &config::BrokerSetup {
            name: &format!("demo-broker{suffix}"),
            state_dir: &tmp.path().join("broker"),
            bus_url: url,
            tag,
            min_nodes: args.nodes,
            speed: args.speed,
            signing_key: &keys.path("broker.key"),
        },
    )
    .map_err(|i| DemoError::Config(format!("<demo broker.toml>: key `{}`: {}", i.key, i.reason)))
    .and_then(|c| record_trace(c, args))
}

/// With `--record-trace FILE`: the agent records its reports there, and the
/// configuration goes beside it (`FILE.broker.toml`) for a replay.
fn record_trace(mut c: BrokerConfig, args: &DemoArgs) -> Result<BrokerConfig, DemoError> {
    let Some(path) = &args.record_trace else {
        return Ok(c);
    };
    c.trace.record = true;
    c.trace.path = Some(path.clone());
    let mut file = path.clone().into_os_string();
    file.push(".broker.toml");
    let text = c.to_toml().map_err(DemoError::Config)?;
    std::fs::write(&file, text).map_err(|e| {
        DemoError::Config(format!("{}: {e}", std::path::Path::new(&file).display()))
    })?;
    Ok(c)
}

/// One connection each for the broker agent, the node agents and the
/// workload.
pub(super) struct Buses {
    pub(super) broker: SharedBus,
    pub(super) nodes: SharedBus,
    pub(super) client: SharedBus,
}

impl Buses {
    pub(super) async fn connect(plan: &Plan) -> Result<Buses, DemoError> {
        let c = |who: &str| {
            let name = format!("gearshift-demo {who} {}", plan.tag);
            let url = plan.url.clone();
            async move {
                bus::connect(&url, &name)
                    .await
                    .map_err(|e| DemoError::Connect {
                        url: e.url,
                        reason: e.reason,
                    })
            }
        };
        Ok(Buses {
            broker: c("broker").await?,
            nodes: c("nodes").await?,
            client: c("workload").await?,
        })
    }

    pub(super) async fn close(&self) {
        for b in [&self.broker, &self.nodes, &self.client] {
            b.close().await;
        }
    }
}

/// The initial fleet: `n` nodes at 60 % of their active gears and a few
/// idle ones, recorded in the ledger, their agents started.
pub(super) fn start_fleet(
    plan: &Plan,
    n: u32,
    nodes_bus: SharedBus,
    world: &Arc<SimWorld>,
    ledger: &mut Ledger,
) -> Result<(Arc<SimFleet>, Vec<String>), DemoError> {
    let fleet = SimFleet::new(
        world.clone(),
        nodes_bus,
        plan.ncfg.clone(),
        plan.keys.clone(),
        &plan.tmp.path().join("nodes"),
    );
    let max_active = plan.max_active();
    let initial_active = (max_active as usize * 3).div_ceil(5);
    let initial_idle = (max_active as usize / 5).max(1);
    let mut all_nodes = vec![];
    for i in 1..=n {
        let spec = NodeSpec::new(&plan.node(i), DISTRICT, PROFILE, max_active);
        fleet.add_to_world(&spec)?;
        for _ in 0..initial_active {
            ledger.create(world, &spec.name, GearState::Started);
        }
        for _ in 0..initial_idle {
            ledger.create(world, &spec.name, GearState::Idle);
        }
        fleet.start_node(&spec)?;
        all_nodes.push(spec.name);
    }
    Ok((fleet, all_nodes))
}

/// The broker agent's task and what the demo watches of it.
pub(super) struct Broker {
    pub(super) status: watch::Receiver<Arc<Status>>,
    pub(super) observe: broadcast::Receiver<Observed>,
    pub(super) token: CancellationToken,
    pub(super) task: tokio::task::JoinHandle<Result<(), gearshift_broker::AgentError>>,
}

/// Builds and starts the broker agent with `cloud` as its handler, and its
/// dashboard and metrics on `http` when asked.
pub(super) async fn start_broker(
    plan: &Plan,
    broker_bus: SharedBus,
    cloud: Arc<SimCloud>,
    http: Option<SocketAddr>,
    token: &CancellationToken,
    display: &Display,
) -> Result<Broker, DemoError> {
    let bcfg = &plan.bcfg;
    let metrics = gearshift_broker::metrics::Metrics::new();
    let agent = gearshift_broker::Agent::builder(bcfg.clone(), broker_bus)
        .signer(plan.keys.broker.clone())
        .keyring(plan.keys.broker_keyring().map_err(FleetError::from)?)
        .handler("cloud", cloud)
        .metrics(metrics.clone())
        .build()
        .map_err(|e| DemoError::Broker(e.to_string()))?;
    let status = agent.status();
    let observe = agent.observe();
    if let Some(addr) = http {
        let dash = gearshift_broker::dashboard::Dashboard::spawn(
            &agent,
            bcfg.agent.name.clone(),
            token.clone(),
        );
        let router =
            gearshift_service::http::metrics_router(metrics.registry.clone()).merge(dash.router());
        let (local, _) = gearshift_service::http::serve(addr, router, token.clone())
            .await
            .map_err(|e| DemoError::Io(format!("--http {addr}: {e}")))?;
        display.text(format!(
            "  dashboard: http://{local}/   metrics: http://{local}/metrics\n"
        ));
    }
    let agent_token = token.child_token();
    let t = agent_token.clone();
    let task = tokio::spawn(async move { agent.run(t).await });
    Ok(Broker {
        status,
        observe,
        token: agent_token,
        task,
    })
}

/// Starts the placement service (the broker configuration's engine, signed
/// by the broker key, fed with the broker agent's view of the fleet) and
/// returns the workload's client of it.
pub(super) async fn start_placement(
    plan: &Plan,
    broker_bus: SharedBus,
    client_bus: SharedBus,
    status: watch::Receiver<Arc<Status>>,
    token: &CancellationToken,
) -> Result<Placement, DemoError> {
    let bcfg = &plan.bcfg;
    let key = format!("placement.request.demo.{}", plan.tag);
    let engine = gearshift_placement::Engine::new(&bcfg.placement)
        .map_err(|e| DemoError::Config(format!("placement: {e}")))?;
    let ready = Arc::new(tokio::sync::Notify::new());
    let opts = gearshift_placement::service::ServeOptions {
        queue: QueueSpec {
            name: format!("gearshift.demo.{}.placement", plan.tag),
            bindings: vec![key.clone()],
            durability: Durability::Transient,
            max_length: None,
            single_active_consumer: false,
        },
        fleet: Some(Arc::new(move || candidates(&status.borrow()))),
        ready: Some(ready.clone()),
        ..Default::default()
    };
    let signer = Arc::new(plan.keys.broker.clone());
    let ring = Arc::new(plan.keys.broker_keyring().map_err(FleetError::from)?);
    let (name, t) = (bcfg.agent.name.clone(), token.clone());
    tokio::spawn(async move {
        let serve = gearshift_placement::service::serve_with;
        if let Err(e) = serve(broker_bus, engine, signer, ring, name, t, opts).await {
            tracing::error!(error = %e, "the demo's placement service stopped");
        }
    });
    if tokio::time::timeout(Duration::from_secs(20), ready.notified())
        .await
        .is_err()
    {
        return Err(DemoError::Broker(
            "the placement service did not start within 20 s".into(),
        ));
    }
    let mut trusted = Keyring::new();
    trusted.add(plan.keys.broker.public(), Role::Broker, "demo broker");
    Ok(Placement {
        bus: client_bus,
        key,
        signer: plan.keys.operator.clone(),
        trusted,
        requests: 0,
        refused: 0,
        last_refusal: None,
    })
}

/// Candidate nodes for placement, from the broker agent's status (the
/// same figures the broker agent's own placement service uses).
fn candidates(s: &Status) -> Vec<NodeProperties> {
    let district_free: BTreeMap<(String, String), Option<u32>> = s
        .groups
        .iter()
        .map(|g| {
            (
                (g.district.clone(), g.profile.clone()),
                g.stats.district_free_uids,
            )
        })
        .collect();
    s.nodes
        .iter()
        .filter(|n| n.fresh)
        .map(|n| NodeProperties {
            name: n.node.clone(),
            node_consumed_capacity: if n.max_active_gears == 0 {
                100.0
            } else {
                100.0 * f64::from(n.gears_active) / f64::from(n.max_active_gears)
            },
            district_id: Some(n.district.clone()),
            district_available_capacity: district_free
                .get(&(n.district.clone(), n.profile.clone()))
                .copied()
                .flatten(),
            region_id: None,
            zone_id: None,
            profile: Some(n.profile.clone()),
            active: n.active,
            mem_free_mb: None,
            gears_active: Some(n.gears_active),
            max_active_gears: Some(n.max_active_gears),
        })
        .collect()
}
