//! The `log` handler's dry run: a group whose handler is `log` gets every
//! decision published and explained, marked `dry_run`, and nothing else: no
//! operation starts, so no command reaches a node, no district changes and
//! no cloud call is made. The decision and the explanation say what would
//! have happened: the nodes asked for, or the victim and the moves the
//! evacuation planner would plan for its gears (from the counts the node
//! reports: the gear inventory is only read by a real drain).
//!
//! The group's memory records the decision as if taken, so the cooldowns
//! pace the dry run's decisions as they would pace real ones.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{DecisionKind, GearInfo, GearState};
use gearshift_proto::routing::NO_DISTRICT;

use super::Core;
use super::actions::{Action, Note};
use crate::planner::PlanInput;
use crate::policy::GroupVerdict;

impl Core {
    /// Whether group `g` runs dry: the handler the driver registered under
    /// its handler's name is the `log` handler (a configuration may name a
    /// placeholder the driver replaces), else what the configuration says.
    pub fn is_dry_run(&self, g: &GroupKey) -> bool {
        let name = self.cfg.group(g).handler;
        match self.handler_kinds.get(&name) {
            Some(kind) => kind == "log",
            None => self.cfg.dry_run(g),
        }
    }

    /// The kind (`log`, `nova`, ...) of each handler the driver runs, by name.
    pub fn set_handler_kinds(&mut self, kinds: BTreeMap<String, String>) {
        self.handler_kinds = kinds;
    }

    /// What `v` would start in group `key`, as decisions marked `dry_run`,
    /// and the explanation's summary of it (`None`: nothing would happen).
    pub(crate) fn dry_verdict(
        &mut self,
        key: &GroupKey,
        v: &GroupVerdict,
        now: DateTime<Utc>,
    ) -> (Vec<Action>, Option<String>) {
        let handler = self.cfg.group(key).handler;
        let mut out = vec![];
        let mut said = vec![];
        if v.creates > 0 {
            let what = format!(
                "would ask the cloud for {} node(s) (`event create-node --profile={} --district={}`): {}",
                v.creates, key.profile, key.district, v.up_reason
            );
            let m = &mut self.group_mut(key).memory;
            m.last_scale_up = Some(now);
            m.last_decision = Some(now);
            out.push(self.dry_decision(key, &handler, DecisionKind::ScaleUp, None, &what, now));
            said.push(what);
        }
        if let Some(d) = &v.drain {
            let what = format!("{}; {}", d.reason, self.would_drain(key, &d.node, now));
            let m = &mut self.group_mut(key).memory;
            m.last_scale_down = Some(now);
            m.last_decision = Some(now);
            let node = Some(d.node.clone());
            out.push(self.dry_decision(key, &handler, DecisionKind::ScaleDown, node, &what, now));
            said.push(what);
        }
        let summary = (!said.is_empty())
            .then(|| format!("dry run (log handler), nothing done: {}", said.join("; ")));
        (out, summary)
    }

    /// The drain of `node` that would run: deactivate, the planned moves, removal.
    fn would_drain(&self, key: &GroupKey, node: &str, now: DateTime<Utc>) -> String {
        let Some(e) = self.fleet.get(node) else {
            return format!("would drain {node}");
        };
        let (total, active) = (e.total_gears(), e.active_gears());
        let gears: Vec<GearInfo> = (0..total)
            .map(|i| GearInfo {
                id: format!("gear-{}", i + 1),
                app: None,
                state: if i < active {
                    GearState::Started
                } else {
                    GearState::Idle
                },
                uid: None,
                bytes: None,
                do_not_disrupt: false,
            })
            .collect();
        let input = PlanInput {
            victim: node,
            district: (key.district != NO_DISTRICT).then_some(key.district.as_str()),
            gears: &gears,
            candidates: self.candidates(key, node, now),
            now,
        };
        let moves = match self.planner.plan(&input) {
            Ok(moves) if moves.is_empty() => "nothing to move".to_string(),
            Ok(moves) => {
                let mut per: BTreeMap<String, u32> = BTreeMap::new();
                for m in moves {
                    *per.entry(m.target).or_default() += 1;
                }
                let parts: Vec<String> = per.iter().map(|(t, n)| format!("{n} to {t}")).collect();
                format!(
                    "move its {total} gears ({active} active): {}",
                    parts.join(", ")
                )
            }
            Err(why) => format!("plan its {total} gears' moves, which fails now: {why}"),
        };
        format!("would deactivate {node}, {moves}, then remove it through the handler")
    }

    fn dry_decision(
        &self,
        key: &GroupKey,
        handler: &str,
        kind: DecisionKind,
        node: Option<String>,
        what: &str,
        now: DateTime<Utc>,
    ) -> Action {
        let note = Note {
            kind,
            node,
            reason: format!("dry run (log handler): {what}"),
            stats: true,
        };
        let mut a = self.decision(key, None, handler, note, now);
        if let Action::Decide(d) = &mut a {
            d.dry_run = true;
        }
        a
    }
}

#[cfg(test)]
mod tests;
