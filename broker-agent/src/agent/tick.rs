//! The timers: ticks (deadlines, polls, retries), evaluations, the fleet
//! snapshot that handlers and the placement service read, and the status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;

use super::{Agent, Result2, RunState};
use crate::config::BrokerConfig;
use crate::core::Core;

impl Agent {
    /// A tick: the core's deadlines, an evaluation when one is due, the
    /// fleet snapshot and the periodic status.
    pub(super) async fn on_tick(
        &self,
        core: &mut Core,
        st: &mut RunState,
        tick_every: Duration,
    ) -> Result2<()> {
        let now = Utc::now();
        if st.ha.leading() {
            let acts = core.tick(now);
            self.apply(core, st, acts, now).await?;
        }
        if tokio::time::Instant::now() >= st.next_eval {
            st.next_eval = tokio::time::Instant::now() + self.cfg.policy.interval;
            self.evaluate(core, st, now, true).await?;
        } else if core.evaluation_due().is_some_and(|t| now >= t) {
            self.evaluate(core, st, now, false).await?;
        }
        self.refresh_fleet_paced(core, st, now, tick_every);
        self.publish_status(core, st, now, true);
        if let Some(t) = st.trace.as_mut() {
            t.flush();
        }
        Ok(())
    }

    /// One evaluation of every group (`full`), or the early evaluations due
    /// (what reports pushed over a threshold); the decision latency
    /// runs from the report that showed pressure to the confirmed
    /// publication of the first decision (see `apply`).
    pub(super) async fn evaluate(
        &self,
        core: &mut Core,
        st: &mut RunState,
        now: DateTime<Utc>,
        full: bool,
    ) -> Result2<()> {
        if !st.ha.leading() {
            return Ok(());
        }
        st.pressure = core.take_pressure_seen();
        let acts = if full {
            core.evaluate(now)
        } else {
            core.evaluate_due(now)
        };
        self.metrics.evaluation();
        self.metrics.capacity(core, &acts, now, full);
        if full {
            // Groups gone since the last evaluation of every group.
            let evaluated: std::collections::HashSet<GroupKey> = acts
                .iter()
                .filter_map(|a| match a {
                    crate::core::Action::Explain(x) => Some(GroupKey {
                        district: x.district.clone(),
                        profile: x.profile.clone(),
                    }),
                    _ => None,
                })
                .collect();
            st.explained.retain(|g| evaluated.contains(g));
        }
        let r = self.apply(core, st, acts, now).await;
        st.pressure = None;
        r
    }

    /// Refreshes the fleet snapshot every tick, or less often when a refresh
    /// costs more than a twentieth of the time between them (large fleets).
    fn refresh_fleet_paced(
        &self,
        core: &Core,
        st: &mut RunState,
        now: DateTime<Utc>,
        tick: Duration,
    ) {
        let gap = tick.max(st.fleet_cost * 20);
        if st.fleet_refreshed.is_some_and(|t| t.elapsed() < gap) {
            return;
        }
        let t = tokio::time::Instant::now();
        self.refresh_fleet(core, now);
        st.fleet_cost = t.elapsed();
        st.fleet_refreshed = Some(t);
    }

    fn refresh_fleet(&self, core: &Core, now: DateTime<Utc>) {
        // Only a handler that reads the fleet view needs its active nodes.
        if core.config().handlers.values().any(|h| h.reads_fleet()) {
            self.refresh_active(core, now);
        }
        // Only the placement service reads the candidates.
        if self.placement_service && self.cfg.agent.placement_service {
            let mut nodes = vec![];
            for g in core.fleet().groups() {
                nodes.extend(core.candidates(&g, "", now));
            }
            if let Ok(mut n) = self.fleet.nodes.write() {
                *n = nodes;
            }
        }
        if let Ok(mut c) = self.fleet.cordoned.write() {
            *c = core.cordons().nodes().keys().cloned().collect();
        }
    }

    /// The fleet view's active, fresh nodes of every group, fewest active
    /// gears first.
    fn refresh_active(&self, core: &Core, now: DateTime<Utc>) {
        let intervals = core.config().policy.stale_after_intervals;
        let mut active: BTreeMap<GroupKey, Vec<(u32, String)>> = BTreeMap::new();
        for e in core.fleet().nodes() {
            if e.is_active() && e.is_fresh(now, intervals) {
                active
                    .entry(e.group())
                    .or_default()
                    .push((e.active_gears(), e.report.node.clone()));
            }
        }
        let active = active
            .into_iter()
            .map(|(g, mut v)| {
                v.sort();
                (g, v.into_iter().map(|x| x.1).collect())
            })
            .collect();
        if let Ok(mut a) = self.fleet.active.write() {
            *a = active;
        }
    }

    /// Publishes the status: after changes at once (unless the status of a
    /// large fleet was built very recently), and every 500 ms.
    pub(super) fn publish_status(
        &self,
        core: &Core,
        st: &mut RunState,
        now: DateTime<Utc>,
        periodic: bool,
    ) {
        if let Some(t) = st.last_status {
            let since = (now - t).to_std().unwrap_or_default();
            // Periodic: every 500 ms, and any change not yet published.
            if periodic && !st.status_dirty && since < Duration::from_millis(500) {
                return;
            }
            // Changes: at once, unless the status of a large fleet was built
            // very recently (the next tick publishes it).
            if since < st.status_cost * 20 {
                return;
            }
        }
        st.last_status = Some(now);
        st.status_dirty = false;
        let t = std::time::Instant::now();
        self.metrics.refresh(core);
        let mut s = st
            .status
            .build(core, &self.cfg.agent.name, now, &st.refused);
        s.reload = st.reload.clone();
        s.ha = Some(st.ha.status(&self.cfg.agent.name, &self.cfg.agent.cluster));
        let _ = self.status_tx.send(Arc::new(s));
        st.status_cost = t.elapsed();
    }
}

/// The loop's timer, every `every`, late ticks delayed rather than bunched.
pub(super) fn ticker(every: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(every);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// How often the agent runs the core's timers: a quarter of the shortest
/// timer of `cfg`, between 20 ms and 1 s (the replay ticks as often).
pub fn tick_interval(cfg: &BrokerConfig) -> Duration {
    let s = &cfg.saga;
    let p = &cfg.policy;
    let shortest = [
        p.interval,
        s.command_timeout,
        s.presence_poll,
        p.react_delay.max(Duration::from_millis(20)),
    ]
    .into_iter()
    .min()
    .unwrap_or(Duration::from_secs(1));
    (shortest / 4).clamp(Duration::from_millis(20), Duration::from_secs(1))
}
