//! What the demo shows while it runs: decisions and short explanations as
//! they happen, what the simulated cloud does, the workload's phases, and
//! one progress bar per evacuation (indicatif on a terminal; plain lines
//! when stdout is not one; nothing at all with `--json`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use gearshift_broker::status::Status;
use gearshift_proto::msg::{Decision, DecisionKind, Explanation, Outcome};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::fleet::CloudEvent;

/// How the demo talks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Lines and live progress bars (stdout is a terminal).
    Live,
    /// Lines only (stdout is a pipe or a file).
    Plain,
    /// Nothing on stdout until the JSON summary.
    Quiet,
}

impl Mode {
    /// `Live` on a terminal, else `Plain`; `Quiet` when `json`.
    pub fn detect(json: bool) -> Mode {
        if json {
            Mode::Quiet
        } else if std::io::stdout().is_terminal() {
            Mode::Live
        } else {
            Mode::Plain
        }
    }
}

struct Evac {
    bar: Option<ProgressBar>,
    node: String,
    shown: (u32, u32),
}

/// The live display.
pub struct Display {
    mode: Mode,
    start: Instant,
    mp: Option<MultiProgress>,
    fleet: Option<ProgressBar>,
    evacs: BTreeMap<String, Evac>,
    last_why: BTreeMap<(String, String), String>,
}

impl std::fmt::Debug for Display {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Display")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// Cuts `s` to `max` characters.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The part of an explanation that does not change with every figure: the
/// outcome and the summary without digits (so that 61.2 % and 61.5 % are
/// the same explanation and only a change of rule is shown).
fn gist(x: &Explanation) -> String {
    let words: String = x
        .summary
        .chars()
        .filter(|c| !c.is_ascii_digit() && *c != '.')
        .collect();
    format!("{:?} {words}", x.outcome)
}

fn symbol(k: DecisionKind) -> &'static str {
    match k {
        DecisionKind::ScaleUp => "▲",
        DecisionKind::Joined => "+",
        DecisionKind::ScaleDown => "▼",
        DecisionKind::Removed | DecisionKind::Drained => "-",
        DecisionKind::Aborted | DecisionKind::DrainCancelled => "↺",
        DecisionKind::Exhausted | DecisionKind::BreakerOpen => "!",
        DecisionKind::HandlerFailed | DecisionKind::ProvisionTimeout => "✗",
        DecisionKind::ExhaustionLifted | DecisionKind::BreakerClosed => "✓",
    }
}

impl Display {
    /// A display in `mode`.
    pub fn new(mode: Mode) -> Display {
        let (mp, fleet) = if mode == Mode::Live {
            let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stdout_with_hz(10));
            let fleet = mp.add(ProgressBar::new_spinner());
            fleet.set_style(
                ProgressStyle::with_template("{spinner:.cyan} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            fleet.enable_steady_tick(Duration::from_millis(120));
            (Some(mp), Some(fleet))
        } else {
            (None, None)
        };
        Display {
            mode,
            start: Instant::now(),
            mp,
            fleet,
            evacs: BTreeMap::new(),
            last_why: BTreeMap::new(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Prints one line (above the bars), with the time since the start.
    pub fn line(&self, s: impl AsRef<str>) {
        let t = self.start.elapsed().as_secs_f64();
        let text = format!("[{t:5.1}s] {}", s.as_ref());
        match (&self.mode, &self.mp) {
            (Mode::Quiet, _) => {}
            (Mode::Live, Some(mp)) => {
                if mp.println(&text).is_err() {
                    println!("{text}");
                }
            }
            _ => println!("{text}"),
        }
    }

    /// Prints text without a time stamp (headers, the summary).
    pub fn text(&self, s: impl AsRef<str>) {
        match (&self.mode, &self.mp) {
            (Mode::Quiet, _) => {}
            (Mode::Live, Some(mp)) => {
                if mp.println(s.as_ref()).is_err() {
                    println!("{}", s.as_ref());
                }
            }
            _ => println!("{}", s.as_ref()),
        }
    }

    /// A decision of the broker agent.
    pub fn decision(&self, d: &Decision) {
        let node = d
            .node
            .as_deref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        self.line(format!(
            "{} {:<12} {}/{}{node}: {}",
            symbol(d.decision),
            d.decision.as_str(),
            d.district,
            d.profile,
            cut(&d.reason, 160)
        ));
    }

    /// An evaluation's explanation: shown when its gist changes.
    pub fn explanation(&mut self, x: &Explanation) {
        let key = (x.district.clone(), x.profile.clone());
        let g = gist(x);
        if self.last_why.get(&key) == Some(&g) {
            return;
        }
        self.last_why.insert(key, g);
        if x.outcome == Outcome::None && self.last_why.len() == 1 && x.summary.is_empty() {
            return;
        }
        self.line(format!(
            "  why {}/{} ({}): {}",
            x.district,
            x.profile,
            match x.outcome {
                Outcome::ScaleUp => "scale up",
                Outcome::ScaleDown => "scale down",
                Outcome::DrainCancelled => "drain cancelled",
                Outcome::None => "nothing to do",
                Outcome::Held => "held",
            },
            cut(&x.summary, 150)
        ));
    }

    /// Something the simulated cloud did.
    pub fn cloud(&self, e: &CloudEvent) {
        match e {
            CloudEvent::Booting { node, op } => {
                self.line(format!("  cloud: booting {node} for {op}"))
            }
            CloudEvent::Booted { node } => self.line(format!(
                "  cloud: {node} is up; its node agent starts reporting"
            )),
            CloudEvent::BootFailed { node, reason } => {
                self.line(format!("  cloud: {node} failed to boot: {reason}"))
            }
            CloudEvent::Deleted { node, gears_left } => self.line(format!(
                "  cloud: deleted {node}{}",
                if *gears_left > 0 {
                    format!(" WITH {gears_left} GEARS ON IT")
                } else {
                    " (it was empty)".into()
                }
            )),
        }
    }

    /// The fleet line (live mode) from the broker agent's status.
    pub fn fleet(&self, line: &str) {
        if let Some(f) = &self.fleet {
            f.set_message(line.to_string());
        }
    }

    /// Evacuation progress of every scale-down in the status.
    pub fn progress(&mut self, s: &Status) {
        for o in s.ops.iter().filter(|o| o.kind == "scale_down") {
            let node = o.node.clone().unwrap_or_default();
            if o.done {
                if let Some(e) = self.evacs.remove(&o.id)
                    && let Some(b) = e.bar
                {
                    b.finish_and_clear();
                    if let Some(mp) = &self.mp {
                        mp.remove(&b);
                    }
                    let moved = o.progress.map_or(0, |p| p.moved_total);
                    self.line(format!(
                        "  evacuation of {} over: {moved} gears moved; saga {}",
                        e.node, o.state
                    ));
                }
                continue;
            }
            let Some(p) = o.progress.filter(|p| p.total > 0) else {
                continue;
            };
            let e = self.evacs.entry(o.id.clone()).or_insert_with(|| {
                let bar = self.mp.as_ref().map(|mp| {
                    let b = mp.add(ProgressBar::new(u64::from(p.total)));
                    b.set_style(
                        ProgressStyle::with_template(
                            "  evacuating {prefix:<10} [{bar:30.green/white}] {pos}/{len} gears {msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("█▉▊▋▌▍▎▏ "),
                    );
                    b.set_prefix(node.clone());
                    b
                });
                Evac {
                    bar,
                    node: node.clone(),
                    shown: (u32::MAX, u32::MAX),
                }
            });
            let done = p.moved + p.failed;
            if let Some(b) = &e.bar {
                b.set_length(u64::from(p.total));
                b.set_position(u64::from(done));
                b.set_message(if p.failed > 0 {
                    format!("({} failed) {}", p.failed, o.state)
                } else {
                    o.state.clone()
                });
            }
            if (done, p.total) != e.shown {
                e.shown = (done, p.total);
                if self.mode == Mode::Plain {
                    let text = format!(
                        "  evacuating {}: {}/{} gears moved{}",
                        e.node,
                        p.moved,
                        p.total,
                        if p.failed > 0 {
                            format!(", {} failed", p.failed)
                        } else {
                            String::new()
                        }
                    );
                    self.line(text);
                }
            }
        }
    }

    /// Removes the bars (before the summary).
    pub fn finish(&mut self) {
        for (_, e) in std::mem::take(&mut self.evacs) {
            if let Some(b) = e.bar {
                b.finish();
            }
        }
        if let Some(f) = self.fleet.take() {
            f.finish_and_clear();
        }
        if let Some(mp) = &self.mp {
            let _ = mp.clear();
        }
    }
}

/// The fleet line of the live display.
pub fn fleet_line(s: &Status) -> String {
    let mut parts = vec![];
    for g in &s.groups {
        let t = &g.stats;
        parts.push(format!(
            "{}/{}: {} nodes ({} inactive{}), {} active gears, usage {:.1} %",
            g.district,
            g.profile,
            t.nodes_active + t.nodes_inactive,
            t.nodes_inactive,
            if t.nodes_missing > 0 {
                format!(", {} missing", t.nodes_missing)
            } else {
                String::new()
            },
            t.gears_active,
            t.usage_pct
        ));
    }
    let ops = s.in_flight().count();
    if ops > 0 {
        parts.push(format!("{ops} operation(s) in flight"));
    }
    if parts.is_empty() {
        "waiting for the first reports".into()
    } else {
        parts.join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gist_ignores_figures_but_not_rules() {
        let x = |s: &str| Explanation {
            district: "d".into(),
            profile: "p".into(),
            evaluated_at: chrono::Utc::now(),
            outcome: Outcome::Held,
            summary: s.into(),
            reasons: vec![],
            stats: Default::default(),
            ops_in_flight: vec![],
        };
        assert_eq!(gist(&x("usage 61.2 %")), gist(&x("usage 61.5 %")));
        assert_ne!(
            gist(&x("held: cooldown_after_scale_up")),
            gist(&x("held: scale_down_stabilization"))
        );
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
