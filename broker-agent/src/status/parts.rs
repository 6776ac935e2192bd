//! The status document built group by group: each group's line and nodes
//! are kept with what they were built from, and a new document rebuilds
//! only the groups whose inputs changed since the last one.
//!
//! A group's part depends on its nodes and its district's UIDs (the fleet's
//! [`Fleet::group_stamp`](crate::fleet::Fleet::group_stamp) moves when they
//! change), its record (supply, pause), the nodes of the group being
//! removed, and on the clock only at known instants (a fresh node goes
//! stale, a backoff or a pause ends): the part records the first of them.
//! What every group reads (the configuration, the operator's marks and
//! cordons, the fleet's pause) is compared as a whole: a change rebuilds
//! every group. The result is the document a full rebuild gives (the
//! tests check it after random changes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;

use super::{GroupStatus, NodeList, NodeStatus, ProfileStatus, Status, ops_of};
use crate::config::BrokerConfig;
use crate::core::Core;
use crate::core::operator::controls::Cordons;
use crate::ops::{GroupState, Pause};

/// Builds status documents, keeping each group's part between them.
#[derive(Debug, Default)]
pub struct StatusBuilder {
    shared: Option<Shared>,
    parts: BTreeMap<GroupKey, Part>,
    rebuilt: usize,
}

/// What every group's part reads.
#[derive(Debug)]
struct Shared {
    cfg: Arc<BrokerConfig>,
    marks: BTreeSet<String>,
    cordons: Cordons,
    fleet_pause: Option<Pause>,
}

impl Shared {
    fn of(core: &Core) -> Shared {
        Shared {
            cfg: core.cfg.clone(),
            marks: core.marks().clone(),
            cordons: core.cordons().clone(),
            fleet_pause: core.meta().fleet_pause.clone(),
        }
    }

    /// The same inputs: the configuration by identity (a reload swaps it).
    fn same(&self, other: &Shared) -> bool {
        Arc::ptr_eq(&self.cfg, &other.cfg)
            && self.marks == other.marks
            && self.cordons == other.cordons
            && self.fleet_pause == other.fleet_pause
    }
}

/// What one group's part was built from.
#[derive(Debug, PartialEq)]
struct Inputs {
    stamp: u64,
    state: Option<GroupState>,
    removing: Vec<String>,
}

#[derive(Debug)]
struct Part {
    inputs: Inputs,
    built: DateTime<Utc>,
    /// The part holds before this instant (`None`: until an input changes).
    expires: Option<DateTime<Utc>>,
    group: GroupStatus,
    nodes: Arc<[NodeStatus]>,
}

impl Part {
    fn holds(&self, inputs: &Inputs, now: DateTime<Utc>) -> bool {
        self.inputs == *inputs && now >= self.built && self.expires.is_none_or(|e| now < e)
    }
}

impl StatusBuilder {
    /// The document at `now`: the groups whose inputs did not change since
    /// the last document are reused, the others rebuilt.
    pub fn build(
        &mut self,
        core: &Core,
        agent: &str,
        now: DateTime<Utc>,
        refused: &BTreeMap<String, u64>,
    ) -> Status {
        let shared = Shared::of(core);
        if !self.shared.as_ref().is_some_and(|s| s.same(&shared)) {
            self.parts.clear();
        }
        self.shared = Some(shared);
        let mut removing: BTreeMap<GroupKey, Vec<String>> = BTreeMap::new();
        for n in core.facts().removing().iter() {
            if let Some(e) = core.fleet().get(n) {
                removing.entry(e.group()).or_default().push(n.clone());
            }
        }
        let mut keys: BTreeSet<GroupKey> = core.fleet().groups().into_iter().collect();
        keys.extend(core.config().configured_groups());
        self.parts.retain(|g, _| keys.contains(g));
        self.rebuilt = 0;
        let (mut groups, mut nodes) = (Vec::with_capacity(keys.len()), NodeList::default());
        for g in keys {
            let inputs = Inputs {
                stamp: core.fleet().group_stamp(&g),
                state: core.group_states().get(&g).cloned(),
                removing: removing.remove(&g).unwrap_or_default(),
            };
            if !self.parts.get(&g).is_some_and(|p| p.holds(&inputs, now)) {
                self.rebuilt += 1;
                let part = build_part(core, &g, inputs, now);
                self.parts.insert(g.clone(), part);
            }
            if let Some(p) = self.parts.get(&g) {
                groups.push(p.group.clone());
                nodes.push_part(p.nodes.clone());
            }
        }
        Status {
            agent: agent.to_string(),
            at: Some(now),
            breaker_open: core.meta().breaker_open,
            paused: core
                .meta()
                .fleet_pause
                .as_ref()
                .filter(|p| p.holds(now))
                .map(|p| format!("fleet {}", p.describe())),
            profiles: profiles_of(core, now),
            groups,
            nodes,
            ops: ops_of(core),
            refused: refused.clone(),
            reload: None,
            ha: None,
        }
    }

    /// Groups the last [`StatusBuilder::build`] rebuilt.
    pub fn rebuilt(&self) -> usize {
        self.rebuilt
    }
}

/// Every profile's figures (the fleet keeps them as running totals).
fn profiles_of(core: &Core, now: DateTime<Utc>) -> Vec<ProfileStatus> {
    core.fleet()
        .profiles()
        .into_iter()
        .map(|p| ProfileStatus {
            stats: core.profile_stats(&p, now),
            profile: p,
        })
        .collect()
}

/// One group's line and nodes, and the first instant they stop holding.
fn build_part(core: &Core, g: &GroupKey, inputs: Inputs, now: DateTime<Utc>) -> Part {
    let cfg = core.config();
    let s = cfg.group(g);
    let st = inputs.state.clone().unwrap_or_default();
    let mut expires = Expiry(None);
    let backoff_until = st.supply.backoff_until.filter(|t| *t > now);
    expires.at(backoff_until);
    let pause = core.pause_of(g, now);
    expires.at(pause.and_then(|p| p.until));
    let group = GroupStatus {
        district: g.district.clone(),
        profile: g.profile.clone(),
        handler: s.handler,
        min_nodes: s.min_nodes,
        max_nodes: s.max_nodes,
        stats: core.group_stats(g, now),
        exhausted: st.supply.exhausted.map(|e| {
            format!(
                "since {}: {}",
                e.since.format("%Y-%m-%d %H:%M:%S"),
                e.reason
            )
        }),
        backoff_until,
        paused: pause.map(|p| p.describe()),
    };
    let intervals = cfg.policy.stale_after_intervals;
    let nodes: Vec<NodeStatus> = core
        .fleet()
        .in_group(g)
        .map(|e| {
            let fresh = e.is_fresh(now, intervals);
            if fresh {
                expires.at(Some(e.received + e.stale_after(intervals)));
            }
            NodeStatus {
                node: e.report.node.clone(),
                district: g.district.clone(),
                profile: g.profile.clone(),
                active: e.report.active,
                fresh,
                gears_active: e.active_gears(),
                gears_total: e.total_gears(),
                max_active_gears: e.report.max_active_gears,
                do_not_disrupt: e.report.do_not_disrupt || core.marks().contains(&e.report.node),
                cordoned: core.cordons().get(&e.report.node).map(|c| c.describe()),
                last_report: e.received,
            }
        })
        .collect();
    Part {
        inputs,
        built: now,
        expires: expires.0,
        group,
        nodes: nodes.into(),
    }
}

/// The earliest of some instants.
struct Expiry(Option<DateTime<Utc>>);

impl Expiry {
    fn at(&mut self, t: Option<DateTime<Utc>>) {
        if let Some(t) = t {
            self.0 = Some(self.0.map_or(t, |e| e.min(t)));
        }
    }
}
