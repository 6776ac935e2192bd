//! The replay's world in virtual time: the nodes, each with the node
//! agent's own decisions ([`NodeCore`], as a lite node has them, with the
//! lite nodes' in-memory gears), and a cloud that boots and deletes them.
//!
//! A recorded node's load follows its trace; what the replay changed of it
//! (gears moved in or out by its own evacuations) is kept as a difference
//! added to every later recorded report. The PaaS places nothing on an
//! inactive node, and a removed node is gone: the recorded changes of a node
//! the replay deactivated or removed go to the least busy active node of its
//! group instead, so that the group's load stays the recorded one. A node
//! the replay boots reports every interval from its gears.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use gearshift_broker::core::{CallResult, HandlerCall};
use gearshift_broker::fleet::group_of;
use gearshift_handlers::{Capacity, CreateOutcome, GroupKey, Lookup, Presence, RemoveOutcome};
use gearshift_node::core::{
    Action, Command, CoreConfig, Cx, Input, MoveDone, MoveResult, NodeCore, Reply, Tag,
};
use gearshift_node::heat::SignalError;
use gearshift_node::runtime::MoveOutcome;
use gearshift_node::state::journal::Journal;
use gearshift_proto::Envelope;
use gearshift_proto::msg::{DistrictInfo, GearCounts, Message, NodeReport};
use serde::Serialize;
use uuid::Uuid;

use crate::lite::{NodeState, gear_infos, lite_core_config};

/// How the simulated cloud behaves.
#[derive(Debug, Clone)]
pub struct CloudSpec {
    /// From a create request to the new node's first report.
    pub boot_delay: Duration,
    /// `max_active_gears` of a node the replay boots (default: the group's
    /// largest recorded value).
    pub max_active: Option<u32>,
    /// How often a booted node reports.
    pub report_interval: Duration,
}

/// A node the replay booted or removed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeChange {
    /// When (virtual time).
    pub at: DateTime<Utc>,
    /// The node.
    pub node: String,
    /// Its district.
    pub district: String,
    /// Its profile.
    pub profile: String,
}

/// One node of the replay.
struct VNode {
    st: NodeState,
    /// The last report, whose facts (district, profile, zone...) later ones keep.
    template: NodeReport,
    /// Gears moved in minus moved out by the replay: (total, started).
    delta: (i64, i64),
    /// The node has a recorded trace (else it reports on its own).
    traced: bool,
    /// Its last recorded (total, started) gears.
    recorded: (i64, i64),
    next_report: DateTime<Utc>,
}

/// A message from a node to the broker agent.
pub(super) struct NodeEvent {
    pub from: String,
    pub corr: Option<String>,
    pub msg: Message,
}

/// The nodes and the cloud.
pub(super) struct World {
    nodes: BTreeMap<String, VNode>,
    /// The names of `nodes` by group (the group of their template).
    by_group: BTreeMap<GroupKey, BTreeSet<String>>,
    /// Nodes whose state changed since their last report.
    touched: BTreeSet<String>,
    /// Nodes without a trace: they report on their own.
    untraced: BTreeSet<String>,
    /// Removed recorded nodes: their group and last recorded gears.
    ghosts: BTreeMap<String, (GroupKey, (i64, i64))>,
    /// Boots under way: when the node reports, its name, its first report.
    booting: Vec<(DateTime<Utc>, NodeReport)>,
    created: BTreeMap<String, String>,
    next_gear: u32,
    serial: u32,
    broker: String,
    cloud: CloudSpec,
    node_cfg: CoreConfig,
    pub booted: Vec<NodeChange>,
    pub removed: Vec<NodeChange>,
}

impl World {
    pub(super) fn new(broker: &str, cloud: CloudSpec, start: DateTime<Utc>) -> World {
        let mut node_cfg = lite_core_config(start);
        node_cfg.time_window = Duration::days(3650);
        World {
            nodes: BTreeMap::new(),
            by_group: BTreeMap::new(),
            touched: BTreeSet::new(),
            untraced: BTreeSet::new(),
            ghosts: BTreeMap::new(),
            booting: vec![],
            created: BTreeMap::new(),
            next_gear: 0,
            serial: 0,
            broker: broker.to_string(),
            cloud,
            node_cfg,
            booted: vec![],
            removed: vec![],
        }
    }

    /// A recorded report: what the broker agent gets of it now (`None`: the
    /// node is gone in the replay).
    pub(super) fn recorded(&mut self, r: NodeReport, now: DateTime<Utc>) -> Option<NodeReport> {
        let name = r.node.clone();
        let counts = (i64::from(r.gears.total()), i64::from(r.gears.started));
        if let Some((group, last)) = self.ghosts.get_mut(&name) {
            let diff = (counts.0 - last.0, counts.1 - last.1);
            *last = counts;
            let group = group.clone();
            self.shift(&name, &group, diff);
            return None;
        }
        if !self.nodes.contains_key(&name) {
            let n = self.new_node(r.clone(), true, now);
            self.nodes.insert(name.clone(), n);
            self.file(&name, None, Some(&r));
        } else if let Some(old) = self
            .nodes
            .get(&name)
            .filter(|n| !same_group(&r, &n.template))
            .map(|n| n.template.clone())
        {
            self.file(&name, Some(&old), Some(&r));
        }
        let node = self.nodes.get_mut(&name)?;
        let diff = (counts.0 - node.recorded.0, counts.1 - node.recorded.1);
        node.recorded = counts;
        let moved = !node.st.core.active() && diff != (0, 0);
        if moved {
            node.delta = (node.delta.0 - diff.0, node.delta.1 - diff.1);
        }
        let (total, started) = (counts.0 + node.delta.0, counts.1 + node.delta.1);
        set_load(&mut node.st, &mut self.next_gear, total, started);
        node.template = r;
        let report = report_of(&name, node);
        if moved {
            self.shift(&name, &group_of(&report), diff);
        }
        Some(report)
    }

    /// Gives `diff` gears (total, started) of node `from` to the least busy
    /// other active node of `group`, as the PaaS would place them.
    fn shift(&mut self, from: &str, group: &GroupKey, diff: (i64, i64)) {
        if diff == (0, 0) {
            return;
        }
        // The group's nodes in name order, as a scan of every node meets them.
        let target = self
            .by_group
            .get(group)
            .into_iter()
            .flatten()
            .filter(|n| n.as_str() != from)
            .filter_map(|n| self.nodes.get(n).map(|v| (n, v)))
            .filter(|(_, v)| v.st.core.active())
            .min_by_key(|(_, v)| v.st.started)
            .map(|(n, _)| n.clone());
        let Some(t) = target else {
            return;
        };
        let Some(v) = self.nodes.get_mut(&t) else {
            return;
        };
        v.delta = (v.delta.0 + diff.0, v.delta.1 + diff.1);
        let total = v.st.gears.len() as i64 + diff.0;
        let started = i64::from(v.st.started) + diff.1;
        set_load(&mut v.st, &mut self.next_gear, total, started);
        self.touched.insert(t);
    }

    /// Moves `name` in the group index from `old`'s group to `new`'s.
    fn file(&mut self, name: &str, old: Option<&NodeReport>, new: Option<&NodeReport>) {
        if let Some(g) = old.map(group_of)
            && let Some(set) = self.by_group.get_mut(&g)
        {
            set.remove(name);
            if set.is_empty() {
                self.by_group.remove(&g);
            }
        }
        if let Some(g) = new.map(group_of) {
            self.by_group.entry(g).or_default().insert(name.to_string());
        }
    }

    /// When the world next has something to report on its own (a boot, a
    /// booted node's periodic report, a changed node: now).
    pub(super) fn next_due(&self) -> Option<DateTime<Utc>> {
        let boots = self.booting.iter().map(|(t, _)| *t);
        let periodic = self
            .untraced
            .iter()
            .filter_map(|n| self.nodes.get(n))
            .map(|n| n.next_report);
        let changed = self
            .touched
            .iter()
            .filter_map(|n| self.nodes.get(n))
            .map(|_| DateTime::<Utc>::MIN_UTC);
        boots.chain(periodic).chain(changed).min()
    }

    /// Reports due at `now`: new nodes booted, booted nodes' periodic
    /// reports, and nodes whose state changed.
    pub(super) fn due(&mut self, now: DateTime<Utc>) -> Vec<NodeReport> {
        let (ready, later): (Vec<_>, Vec<_>) = self.booting.drain(..).partition(|(t, _)| *t <= now);
        self.booting = later;
        for (_, r) in ready {
            let n = self.new_node(r.clone(), false, now);
            self.untraced.insert(r.node.clone());
            self.nodes.insert(r.node.clone(), n);
            self.file(&r.node, None, Some(&r));
        }
        let every = self.cloud.report_interval;
        let periodic = self
            .untraced
            .iter()
            .filter(|name| self.nodes.get(*name).is_some_and(|n| n.next_report <= now));
        let due: BTreeSet<String> = periodic
            .cloned()
            .chain(std::mem::take(&mut self.touched))
            .collect();
        let mut out = vec![];
        for name in due {
            let Some(n) = self.nodes.get_mut(&name) else {
                continue;
            };
            n.st.dirty = false;
            if !n.traced && n.next_report <= now {
                n.next_report = now + every;
            }
            out.push(report_of(&name, n));
        }
        out
    }

    fn new_node(&mut self, r: NodeReport, traced: bool, now: DateTime<Utc>) -> VNode {
        let mut st = NodeState {
            seq: 0,
            gears: vec![],
            started: 0,
            dirty: false,
            core: NodeCore::new(r.active, Journal::default()),
        };
        set_load(
            &mut st,
            &mut self.next_gear,
            i64::from(r.gears.total()),
            i64::from(r.gears.started),
        );
        let recorded = (i64::from(r.gears.total()), i64::from(r.gears.started));
        VNode {
            st,
            template: r,
            delta: (0, 0),
            traced,
            recorded,
            next_report: now,
        }
    }

    /// A signed command, as the node agent takes it: its events for the broker agent.
    pub(super) fn command(
        &mut self,
        node: &str,
        corr: &str,
        id: Uuid,
        msg: Message,
        now: DateTime<Utc>,
    ) -> Vec<NodeEvent> {
        if !self.nodes.contains_key(node) {
            return vec![];
        }
        let mut env = Envelope::new_at(&self.broker, msg, now).with_corr(corr);
        env.id = id;
        let first = Input::Command(Command {
            tag: Tag(0),
            redelivered: false,
            reply: Reply::default(),
            admitted: Ok(env),
        });
        let mut inputs = std::collections::VecDeque::from([first, Input::Prune]);
        let mut events = vec![];
        while let Some(input) = inputs.pop_front() {
            let actions = {
                let n = self.nodes.get_mut(node).expect("checked above");
                let cx = Cx {
                    name: node,
                    config: &self.node_cfg,
                };
                n.st.core.handle(cx, input, now)
            };
            for a in actions {
                if let Some(next) = self.carry_out(node, a, &mut events) {
                    inputs.push_back(next);
                }
            }
        }
        events
    }

    /// What the node agent's runtime and outbox do of one action, at once.
    fn carry_out(&mut self, node: &str, a: Action, events: &mut Vec<NodeEvent>) -> Option<Input> {
        let n = self.nodes.get_mut(node)?;
        match a {
            Action::JournalBegin(_) => Some(Input::Journaled(Ok(()))),
            Action::PersistActive { .. } => Some(Input::Persisted(Ok(()))),
            Action::PersistEpoch(_) => Some(Input::EpochPersisted(Ok(()))),
            Action::Scan(scan) => Some(Input::Scanned {
                scan,
                result: Ok(gear_infos(&n.st)),
            }),
            Action::LoadPlan(_) => Some(Input::PlanLoaded(Ok(None))),
            Action::SavePlan { accept, .. } => accept.then_some(Input::PlanSaved(Ok(()))),
            Action::Signal { .. } => Some(Input::Signalled(Err(SignalError::config(
                "a replayed node sends no Heat signal",
            )))),
            Action::Emit(e) => {
                events.push(NodeEvent {
                    from: node.to_string(),
                    corr: e.corr,
                    msg: e.msg,
                });
                e.confirm
                    .map(|confirm| Input::Confirmed { confirm, ok: true })
            }
            Action::Ack { journaled, .. } => journaled.map(Input::Acked),
            Action::StartMove(m) => {
                let result = self.move_gear(node, &m.target, &m.gear);
                Some(Input::Moved(MoveDone {
                    op: m.op,
                    idx: m.idx,
                    result: MoveResult::Done(result),
                    attempts: 1,
                }))
            }
            Action::ReportNow => {
                self.touched.insert(node.to_string());
                None
            }
            _ => None,
        }
    }

    /// Moves one gear from `from` to `target` (a started one stays started).
    fn move_gear(&mut self, from: &str, target: &str, gear: &str) -> MoveOutcome {
        let id = gear.strip_prefix('g').and_then(|s| s.parse::<u32>().ok());
        if from == target || !self.nodes.contains_key(target) {
            return MoveOutcome::Missing;
        }
        let Some(src) = self.nodes.get_mut(from) else {
            return MoveOutcome::Missing;
        };
        let Some(pos) = id.and_then(|g| src.st.gears.iter().position(|x| *x == g)) else {
            return MoveOutcome::AlreadyMoved;
        };
        let started = (pos as u32) < src.st.started;
        let g = src.st.gears.remove(pos);
        src.st.started -= u32::from(started);
        src.delta.0 -= 1;
        src.delta.1 -= i64::from(started);
        self.touched.insert(from.to_string());
        let dst = self.nodes.get_mut(target).expect("checked above");
        if started {
            let at = dst.st.started as usize;
            dst.st.gears.insert(at, g);
            dst.st.started += 1;
        } else {
            dst.st.gears.push(g);
        }
        dst.delta.0 += 1;
        dst.delta.1 += i64::from(started);
        self.touched.insert(target.to_string());
        MoveOutcome::Moved
    }

    /// The cloud's answer to a handler call, at once.
    pub(super) fn call(&mut self, call: &HandlerCall, now: DateTime<Utc>) -> CallResult {
        match call {
            HandlerCall::Create(req) => {
                let node = match self.created.get(&req.op) {
                    Some(n) => n.clone(),
                    None => self.boot(req, now),
                };
                CallResult::Create(Ok(CreateOutcome {
                    node: Some(node.clone()),
                    cloud_id: Some(node),
                    detail: "replay: booting".into(),
                }))
            }
            HandlerCall::Remove(req) => {
                if let Some(n) = self.nodes.remove(&req.node) {
                    self.file(&req.node, Some(&n.template), None);
                    if n.traced {
                        self.ghosts
                            .insert(req.node.clone(), (req.group.clone(), n.recorded));
                    }
                    self.untraced.remove(&req.node);
                    self.removed.push(NodeChange {
                        at: now,
                        node: req.node.clone(),
                        district: req.group.district.clone(),
                        profile: req.group.profile.clone(),
                    });
                }
                CallResult::Remove(Ok(RemoveOutcome {
                    detail: "replay: deleted".into(),
                    gone: true,
                }))
            }
            HandlerCall::Lookup { op, .. } => {
                CallResult::Lookup(Ok(match self.created.get(op.as_str()) {
                    Some(n) => Lookup::Found(CreateOutcome {
                        node: Some(n.clone()),
                        cloud_id: Some(n.clone()),
                        detail: String::new(),
                    }),
                    None => Lookup::NotFound,
                }))
            }
            HandlerCall::Presence { node, .. } => {
                CallResult::Presence(Ok(if self.nodes.contains_key(node) {
                    Presence::Present
                } else {
                    Presence::Gone
                }))
            }
            HandlerCall::Capacity { .. } => CallResult::Capacity(Ok(Capacity {
                nodes_available: None,
                detail: "replay: no quota".into(),
            })),
        }
    }

    /// Starts booting a node for `req`; its first report comes after the boot delay.
    fn boot(&mut self, req: &gearshift_handlers::CreateRequest, now: DateTime<Utc>) -> String {
        self.serial += 1;
        let g = &req.group;
        let name = format!("replay-{}-{}", g.district, self.serial);
        let like = self
            .nodes
            .values()
            .map(|n| &n.template)
            .filter(|t| gearshift_broker::fleet::group_of(t) == *g);
        let max_active = self.cloud.max_active.unwrap_or_else(|| {
            like.clone()
                .map(|t| t.max_active_gears)
                .max()
                .unwrap_or(100)
        });
        let district = like
            .map(|t| t.district.clone())
            .next()
            .flatten()
            .or_else(|| {
                Some(DistrictInfo {
                    uuid: g.district.clone(),
                    active: true,
                    first_uid: None,
                    max_uid: None,
                })
            });
        let first = NodeReport {
            node: name.clone(),
            seq: 0,
            profile: g.profile.clone(),
            district,
            max_active_gears: max_active,
            gears: GearCounts::default(),
            active: true,
            region: None,
            zone: None,
            mem_free_mb: 0,
            mem_total_mb: 0,
            started_at: now + self.cloud.boot_delay,
            booted_at: Some(now + self.cloud.boot_delay),
            booted_for: Some(req.op.clone()),
            do_not_disrupt: false,
            pinned_gears: 0,
            operation: None,
            interval_secs: self.cloud.report_interval.num_seconds().max(1) as u32,
            agent_version: "replay".into(),
        };
        self.booting.push((now + self.cloud.boot_delay, first));
        self.created.insert(req.op.clone(), name.clone());
        self.booted.push(NodeChange {
            at: now,
            node: name.clone(),
            district: g.district.clone(),
            profile: g.profile.clone(),
        });
        name
    }
}

/// Whether two reports are of the same group (compared without building
/// the keys: asked on every recorded report).
fn same_group(a: &NodeReport, b: &NodeReport) -> bool {
    a.profile == b.profile && a.district_uuid() == b.district_uuid()
}

/// Sets a node's gears to `total`, `started` of them started (new gear ids
/// from `next`), keeping the gears it has where it can.
fn set_load(st: &mut NodeState, next: &mut u32, total: i64, started: i64) {
    let total = total.max(0) as usize;
    while st.gears.len() < total {
        st.gears.push(*next);
        *next += 1;
    }
    st.gears.truncate(total);
    st.started = started.clamp(0, total as i64) as u32;
}

/// The node's report now: its template's facts, its gears, its core's state.
fn report_of(name: &str, n: &mut VNode) -> NodeReport {
    n.st.seq += 1;
    let total = n.st.gears.len() as u32;
    let mut r = n.template.clone();
    r.node = name.to_string();
    r.seq = n.st.seq.max(r.seq);
    n.st.seq = r.seq;
    r.gears = GearCounts {
        started: n.st.started.min(total),
        idle: total - n.st.started.min(total),
        ..Default::default()
    };
    r.active = n.st.core.active();
    r.operation = n.st.core.operation();
    r
}
