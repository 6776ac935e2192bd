//! The engine: filters, then the chosen strategy, for one request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{
    ApplicationProperties, ComponentProperties, FilteredNode, GearProperties, MoveConstraints,
    NodeProperties, PlacementReply, PlacementRequest, UserProperties, Validate,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::command::CommandStrategy;
use crate::config::{PlacementConfig, StrategyName};
use crate::error::PlacementError;
use crate::filter;
use crate::script::{ScriptStrategy, Verdict};
use crate::strategy::{self, Choice};

/// The inputs of one decision, borrowed from a [`PlacementRequest`] or built
/// by the evacuation planner.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Candidate nodes before the filters (`server_infos`).
    pub nodes: &'a [NodeProperties],
    /// The application (`app_props`).
    pub app: &'a ApplicationProperties,
    /// The application's existing gears (`current_gears`).
    pub current_gears: &'a [GearProperties],
    /// Components of the new gear (`comp_list`).
    pub components: &'a [ComponentProperties],
    /// The user (`user_props`).
    pub user: &'a UserProperties,
    /// When the request was made (`request_time`).
    pub request_time: DateTime<Utc>,
    /// Required profile.
    pub profile: Option<&'a str>,
    /// Required region.
    pub region: Option<&'a str>,
    /// Move constraints, when a gear moves.
    pub moving: Option<&'a MoveConstraints>,
}

impl<'a> Inputs<'a> {
    /// Borrows the inputs of a request.
    pub fn from_request(r: &'a PlacementRequest) -> Self {
        Inputs {
            nodes: &r.nodes,
            app: &r.app,
            current_gears: &r.current_gears,
            components: &r.components,
            user: &r.user,
            request_time: r.request_time,
            profile: r.profile.as_deref(),
            region: r.region.as_deref(),
            moving: r.moving.as_ref(),
        }
    }
}

/// The outcome of one decision, before it becomes a [`PlacementReply`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision<'a> {
    /// Index in `Inputs::nodes` of the chosen node, or the refusal.
    pub chosen: Result<usize, String>,
    /// The strategy that decided.
    pub strategy: StrategyName,
    /// Candidates left after the filters.
    pub candidates: usize,
    /// What the filters removed.
    pub filtered: filter::Removed<'a>,
}

struct Inner {
    cfg: PlacementConfig,
    script: Option<ScriptStrategy>,
    command: Option<CommandStrategy>,
    rng: Mutex<StdRng>,
}

/// Chooses where gears go. Cheap to clone (shared); safe to use from many
/// threads. `place` may block for up to the script's or command's timeout:
/// call it from `spawn_blocking` in async code when those strategies are on.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("strategy", &self.inner.cfg.strategy)
            .field("script", &self.inner.script.is_some())
            .field("command", &self.inner.command.is_some())
            .finish()
    }
}

impl Engine {
    /// Validates `cfg`, compiles the script when one is configured, and
    /// seeds the random choice (from `cfg.seed`, or the operating system).
    pub fn new(cfg: &PlacementConfig) -> Result<Engine, PlacementError> {
        cfg.validate()?;
        let script = if cfg.script.path.is_some() || cfg.script.inline.is_some() {
            Some(ScriptStrategy::new(&cfg.script)?)
        } else {
            None
        };
        let rng = match cfg.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Ok(Engine {
            inner: Arc::new(Inner {
                cfg: cfg.clone(),
                script,
                command: CommandStrategy::new(&cfg.command),
                rng: Mutex::new(rng),
            }),
        })
    }

    /// The configuration the engine was built from.
    pub fn config(&self) -> &PlacementConfig {
        &self.inner.cfg
    }

    /// Places one gear: exactly one of the request's nodes, or a refusal
    /// with its reason. `filtered` tells which filter removed which node.
    pub fn place(&self, req: &PlacementRequest) -> PlacementReply {
        let requested = req.strategy.as_deref();
        let name = requested
            .unwrap_or(self.inner.cfg.strategy.as_str())
            .to_string();
        if let Err(reason) = req.validate() {
            return refusal(&name, format!("invalid request: {reason}"));
        }
        let strategy = match self.resolve(requested) {
            Ok(s) => s,
            Err(reason) => return refusal(&name, reason),
        };
        let inp = Inputs::from_request(req);
        let d = self.decide(&inp, strategy);
        let reply = PlacementReply {
            node: d.chosen.as_ref().ok().map(|&i| req.nodes[i].name.clone()),
            refused: d.chosen.as_ref().err().cloned(),
            strategy: d.strategy.as_str().to_string(),
            candidates: u32::try_from(d.candidates).unwrap_or(u32::MAX),
            filtered: d
                .filtered
                .iter()
                .map(|(n, f)| FilteredNode {
                    node: n.name.clone(),
                    filter: (*f).to_string(),
                })
                .collect(),
        };
        tracing::debug!(
            app = %req.app.name,
            strategy = %reply.strategy,
            candidates = reply.candidates,
            node = ?reply.node,
            refused = ?reply.refused,
            "placement decided"
        );
        reply
    }

    /// The strategy a request may use: the configured one, or the one it
    /// names when `allow_request_strategy` lets it and it is configured.
    pub(crate) fn resolve(&self, requested: Option<&str>) -> Result<StrategyName, String> {
        let cfg = &self.inner.cfg;
        let Some(r) = requested else {
            return Ok(cfg.strategy);
        };
        let s = StrategyName::parse(r).ok_or_else(|| {
            let known: Vec<&str> = StrategyName::ALL.iter().map(|s| s.as_str()).collect();
            format!(
                "unknown strategy {:?} (known: {})",
                crate::script::truncate(r, 64),
                known.join(", ")
            )
        })?;
        if s == cfg.strategy {
            return Ok(s);
        }
        if !cfg.allow_request_strategy {
            return Err(format!(
                "the request asks for strategy {s:?} but placement.allow_request_strategy is false"
            ));
        }
        let missing = match s {
            StrategyName::Script if self.inner.script.is_none() => {
                Some("script.path or script.inline")
            }
            StrategyName::Command if self.inner.command.is_none() => Some("command.program"),
            StrategyName::PhpHosts if cfg.php_hosts.is_empty() => Some("php_hosts"),
            StrategyName::PinnedUser if cfg.pinned_user.is_none() || cfg.slow_hosts.is_empty() => {
                Some("pinned_user and slow_hosts")
            }
            StrategyName::VendorBlacklist if cfg.blacklisted_vendor.is_none() => {
                Some("blacklisted_vendor")
            }
            _ => None,
        };
        match missing {
            Some(keys) => Err(format!(
                "strategy \"{s}\" is not configured (placement.{keys})"
            )),
            None => Ok(s),
        }
    }

    /// Filters, then asks `strategy`.
    pub(crate) fn decide<'a>(&self, inp: &Inputs<'a>, strategy: StrategyName) -> Decision<'a> {
        let mut filtered = Vec::new();
        let cands = filter::apply(inp, &self.inner.cfg, &mut filtered);
        let n = cands.len();
        if cands.is_empty() {
            let reason = if inp.nodes.is_empty() {
                "no candidate nodes in the request".to_string()
            } else {
                format!(
                    "no node left after the filters ({})",
                    summarize(&filtered, inp.nodes.len())
                )
            };
            return Decision {
                chosen: Err(reason),
                strategy,
                candidates: 0,
                filtered,
            };
        }
        let choice = self.choose(inp, &cands, strategy);
        let chosen = match choice {
            Choice::Node(i) => {
                // Map back from the candidate to its index in `inp.nodes`.
                Ok(inp
                    .nodes
                    .iter()
                    .position(|n| std::ptr::eq(n, cands[i]))
                    .unwrap_or(0))
            }
            Choice::Refuse(r) => Err(r),
        };
        Decision {
            chosen,
            strategy,
            candidates: n,
            filtered,
        }
    }

    /// Runs `f` with the engine's random source, held only for that call
    /// (never while a script or command runs).
    fn with_rng<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        let mut rng = match self.inner.rng.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut rng)
    }

    fn choose(&self, inp: &Inputs<'_>, cands: &[&NodeProperties], s: StrategyName) -> Choice {
        let cfg = &self.inner.cfg;
        match s {
            StrategyName::Default => {
                Choice::Node(self.with_rng(|rng| strategy::default_choice(cands, rng)))
            }
            StrategyName::LeastConsumed => Choice::Node(strategy::least_consumed(cands)),
            StrategyName::MostFreeMemory => Choice::Node(strategy::most_free_memory(cands)),
            StrategyName::First => Choice::Node(strategy::first(cands)),
            StrategyName::PhpHosts => {
                self.with_rng(|rng| strategy::php_hosts(cfg, inp, cands, rng))
            }
            StrategyName::PinnedUser => {
                self.with_rng(|rng| strategy::pinned_user(cfg, inp, cands, rng))
            }
            StrategyName::VendorBlacklist => {
                self.with_rng(|rng| strategy::vendor_blacklist(cfg, inp, cands, rng))
            }
            StrategyName::Script | StrategyName::Command => {
                let verdict = match (s, &self.inner.script, &self.inner.command) {
                    (StrategyName::Script, Some(script), _) => script
                        .decide(&input_json(inp, cands, &cfg.script.settings))
                        .map_err(|e| e.to_string()),
                    (StrategyName::Command, _, Some(cmd)) => cmd
                        .decide(&input_json(inp, cands, &cfg.command.settings))
                        .map_err(|e| e.to_string()),
                    _ => Err(format!("strategy \"{s}\" is not configured")),
                };
                match verdict {
                    Ok(Verdict::Node(name)) => match cands.iter().position(|n| n.name == name) {
                        Some(i) => Choice::Node(i),
                        None => Choice::Refuse(format!(
                            "the {s} chose {:?}, which is not one of the {} candidates left after the filters",
                            crate::script::truncate(&name, 255),
                            cands.len()
                        )),
                    },
                    Ok(Verdict::Delegate) => {
                        Choice::Node(self.with_rng(|rng| strategy::default_choice(cands, rng)))
                    }
                    Ok(Verdict::Refuse(r)) => Choice::Refuse(r),
                    Err(e) => Choice::Refuse(e),
                }
            }
        }
    }

    /// Shared access for the evacuation planner.
    pub(crate) fn cfg(&self) -> &PlacementConfig {
        &self.inner.cfg
    }
}

fn refusal(strategy: &str, reason: String) -> PlacementReply {
    PlacementReply {
        node: None,
        refused: Some(reason),
        strategy: crate::script::truncate(strategy, 64),
        candidates: 0,
        filtered: vec![],
    }
}

/// "3 full, 1 inactive" out of how many.
pub(crate) fn summarize(filtered: &filter::Removed<'_>, total: usize) -> String {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, f) in filtered {
        *by.entry(f).or_default() += 1;
    }
    let parts: Vec<String> = by.iter().map(|(f, n)| format!("{n} {f}")).collect();
    format!("{total} nodes: {}", parts.join(", "))
}

/// The input a script or a command sees: the request with only the
/// candidates left after the filters, and the operator's settings.
pub fn input_json(
    inp: &Inputs<'_>,
    cands: &[&NodeProperties],
    settings: &serde_json::Map<String, Value>,
) -> Value {
    json!({
        "nodes": cands,
        "app": inp.app,
        "current_gears": inp.current_gears,
        "components": inp.components,
        "user": inp.user,
        "request_time": gearshift_proto::envelope::format_ts(inp.request_time),
        "profile": inp.profile,
        "region": inp.region,
        "moving": inp.moving,
        "settings": settings,
    })
}
