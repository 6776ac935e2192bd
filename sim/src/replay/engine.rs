//! The replay loop: the broker agent's real [`Core`] (policy, scale-up
//! operations, scale-down sagas, exhaustion) and its placement engine, fed
//! a trace in virtual time as the agent's loop feeds it live: each report
//! when it was received, an evaluation every `policy.interval` and when a
//! report showed pressure, the core's timers every tick; commands go to the
//! replay's nodes and handler calls to its cloud, and their answers come
//! back at once.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::core::{Action, CallResult, CallTag, Core, dur};
use gearshift_broker::paas::Outcome as PaasOutcome;
use gearshift_broker::planner::PlacementPlanner;
use gearshift_broker::trace::TraceLine;
use gearshift_proto::msg::NodeReport;

use super::outcome::{Outcome, Peak, Step};
use super::world::{CloudSpec, World};

/// How the replay runs besides the broker configuration.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The simulated cloud.
    pub cloud: CloudSpec,
    /// Virtual time between two ticks of the core's timers (default: as
    /// often as the agent ticks with the configuration replayed).
    pub tick: Option<Duration>,
    /// Virtual time the replay goes on after the trace's last report, for
    /// operations under way to finish.
    pub settle: Duration,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            cloud: CloudSpec {
                boot_delay: Duration::minutes(3),
                max_active: None,
                report_interval: Duration::minutes(1),
            },
            tick: None,
            settle: Duration::minutes(30),
        }
    }
}

struct Run {
    core: Core,
    world: World,
    out: Outcome,
    next_eval: DateTime<Utc>,
    interval: Duration,
}

/// Replays `trace` (in receive order) against `cfg`; a trace line that
/// cannot be read ends the replay with its error.
pub fn replay<E: std::fmt::Display>(
    cfg: BrokerConfig,
    trace: impl Iterator<Item = Result<TraceLine, E>>,
    opts: &ReplayOptions,
) -> Result<Outcome, String> {
    let wall = std::time::Instant::now();
    let mut trace = trace.peekable();
    let start = match trace.peek() {
        Some(Ok(l)) => l.at,
        Some(Err(_)) => {
            return Err(trace
                .next()
                .and_then(|r| r.err())
                .map(|e| e.to_string())
                .unwrap_or_default());
        }
        None => return Err("the trace holds no report".into()),
    };
    let tick = opts
        .tick
        .unwrap_or_else(|| dur(gearshift_broker::agent::tick_interval(&cfg)));
    let mut run = Run::new(cfg, opts, start)?;
    let mut now = start;
    let mut last = start;
    loop {
        while let Some(l) = next_due(&mut trace, now)? {
            last = l.at.max(last);
            run.out.reports += 1;
            if let Some(r) = run.world.recorded(l.report, l.at) {
                run.report(r, l.at);
            }
        }
        for r in run.world.due(now) {
            run.report(r, now);
        }
        let acts = run.core.tick(now);
        run.apply(acts, now);
        if now >= run.next_eval {
            run.evaluate(now, true);
        } else if run.core.evaluation_due().is_some_and(|t| now >= t) {
            run.evaluate(now, false);
        }
        let ended = trace.peek().is_none();
        if ended && (now >= last + opts.settle || run.core.ops().all(|o| o.is_done())) {
            break;
        }
        now = run.next_instant(
            now,
            tick,
            trace.peek().and_then(|l| l.as_ref().ok()).map(|l| l.at),
        );
    }
    run.out.finish(now, &run.world, wall.elapsed());
    Ok(run.out)
}

/// The next trace line received at or before `now`.
fn next_due<E: std::fmt::Display>(
    trace: &mut std::iter::Peekable<impl Iterator<Item = Result<TraceLine, E>>>,
    now: DateTime<Utc>,
) -> Result<Option<TraceLine>, String> {
    match trace.peek() {
        Some(Ok(l)) if l.at <= now => {}
        Some(Err(_)) => {}
        _ => return Ok(None),
    }
    match trace.next() {
        Some(Ok(l)) => Ok(Some(l)),
        Some(Err(e)) => Err(format!("trace: {e}")),
        None => Ok(None),
    }
}

impl Run {
    fn new(cfg: BrokerConfig, opts: &ReplayOptions, start: DateTime<Utc>) -> Result<Run, String> {
        let engine = gearshift_placement::Engine::new(&cfg.placement)
            .map_err(|e| format!("placement: {e}"))?;
        let planner = Arc::new(PlacementPlanner::new(engine));
        let interval = dur(cfg.policy.interval);
        let first_eval = start + dur(cfg.policy.interval.min(cfg.policy.startup_grace));
        let name = cfg.agent.name.clone();
        // The replay's world answers every handler's calls (as the demo's
        // cloud replaces its placeholder): no group runs dry, even one whose
        // configuration names the `log` handler.
        let mut names: Vec<String> = cfg.handlers.keys().cloned().collect();
        names.push("log".into());
        names.push(cfg.group_defaults.handler.clone());
        names.extend(cfg.groups.iter().filter_map(|g| g.handler.clone()));
        let kinds = names.into_iter().map(|n| (n, "replay".into())).collect();
        let mut ids = 0u128;
        // Deterministic ids, distinct in every part an operation id shows.
        let mut core = Core::new(Arc::new(cfg), planner, start).with_ids(move || {
            ids += 1;
            uuid::Uuid::from_u128((ids << 96) | ids)
        });
        core.set_handler_kinds(kinds);
        Ok(Run {
            core,
            world: World::new(&name, opts.cloud.clone(), start),
            out: Outcome::new(start),
            next_eval: first_eval,
            interval,
        })
    }

    /// The next instant to look at: the next tick while an operation is
    /// under way (its deadlines and polls), else the next thing due (a
    /// report, an evaluation, a booted node's report), so that the quiet
    /// hours of a day cost nothing. The replay's cloud has no quota, so no
    /// group is ever exhausted and waiting for a tick.
    fn next_instant(
        &self,
        now: DateTime<Utc>,
        tick: Duration,
        next_line: Option<DateTime<Utc>>,
    ) -> DateTime<Utc> {
        let step = now + tick;
        if self.core.ops().any(|o| !o.is_done()) {
            return step;
        }
        let due = [
            Some(self.next_eval),
            self.core.evaluation_due(),
            next_line,
            self.world.next_due(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(step);
        // On the tick grid, as the agent's timer would see it.
        let ticks = ((due - now).num_microseconds().unwrap_or(i64::MAX) as f64
            / tick.num_microseconds().unwrap_or(1).max(1) as f64)
            .ceil()
            .max(1.0);
        now + tick * (ticks.min(f64::from(i32::MAX)) as i32)
    }

    fn report(&mut self, r: NodeReport, now: DateTime<Utc>) {
        match self.core.on_report(r, now, now) {
            Ok(acts) => self.apply(acts, now),
            Err(_) => self.out.refused += 1,
        }
        if self.core.evaluation_due().is_some_and(|t| now >= t) {
            self.evaluate(now, false);
        }
    }

    /// The periodic evaluation of every group (`full`), or the early ones
    /// due, as the agent runs them.
    fn evaluate(&mut self, now: DateTime<Utc>, full: bool) {
        self.out.evaluations += 1;
        let acts = if full {
            self.next_eval = now + self.interval;
            self.core.evaluate(now)
        } else {
            self.core.evaluate_due(now)
        };
        self.apply(acts, now);
        for g in self.core.fleet().groups() {
            let s = self.core.group_stats(&g, now);
            self.out.peak(Peak::of(&g, &s, now));
        }
    }

    /// Carries out the core's actions and everything that follows at `now`.
    fn apply(&mut self, acts: Vec<Action>, now: DateTime<Utc>) {
        let mut work = std::collections::VecDeque::from(acts);
        while let Some(a) = work.pop_front() {
            match a {
                Action::Decide(d) => self.out.steps.push(Step::of(&d, now)),
                Action::Explain(_) => self.out.explanations += 1,
                // One agent, one epoch: no node can have seen a newer one.
                Action::StaleEpoch(_) => {}
                Action::Send {
                    node,
                    corr,
                    id,
                    msg,
                } => {
                    self.out.commands += 1;
                    for e in self.world.command(&node, corr.as_str(), id, msg, now) {
                        work.extend(self.core.on_event(
                            &e.from,
                            e.corr.as_deref(),
                            &e.msg,
                            now,
                            now,
                        ));
                    }
                }
                Action::Paas { op, call } => {
                    // The PaaS's district tools answer as the `none` adapter does.
                    self.out.calls += 1;
                    let done = CallResult::Paas {
                        call,
                        outcome: PaasOutcome::Done,
                    };
                    work.extend(self.core.on_handler_result(CallTag::Paas(op), done, now));
                }
                Action::Call { tag, call, .. } => {
                    self.out.calls += 1;
                    let res = self.world.call(&call, now);
                    work.extend(self.core.on_handler_result(tag, res, now));
                }
            }
        }
        // The journal's records are not kept: the replay never restarts.
        let _ = self.core.take_changes();
        let _ = self.core.take_history();
    }
}
