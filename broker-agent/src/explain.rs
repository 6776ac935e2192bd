//! Which explanations to publish: a group's explanation goes on the bus
//! when its content changed since the group's last published one (its
//! outcome, a rule's verdict, its figures or its operations in flight), and
//! otherwise only once every keep-alive period, so that a watcher that
//! joins late still hears of every group.
//!
//! At fleet scale this is what keeps an evaluation cheap: 2,000 groups
//! evaluated every second used to sign and publish 2,000 explanations a
//! second, most of them saying the same thing as the second before. The
//! details of the rules (durations, "agent up 5m") change with every
//! evaluation and are not content: they are refreshed by the keep-alive.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{Explanation, GroupStats};

use crate::history::{Meaning, meaning};

/// An unchanged group's explanation is published again after this long.
pub const KEEPALIVE: Duration = Duration::from_secs(300);

/// What was last published for a group.
#[derive(Debug, Clone, PartialEq)]
struct Published {
    meaning: Meaning,
    stats: GroupStats,
    ops: Vec<String>,
    at: DateTime<Utc>,
}

/// The last published explanation's content per group.
#[derive(Debug)]
pub struct ExplainGate {
    keepalive: chrono::Duration,
    last: HashMap<GroupKey, Published>,
}

impl Default for ExplainGate {
    fn default() -> Self {
        Self::new(KEEPALIVE)
    }
}

impl ExplainGate {
    /// A gate that republishes unchanged explanations after `keepalive`.
    pub fn new(keepalive: Duration) -> Self {
        ExplainGate {
            keepalive: chrono::Duration::from_std(keepalive)
                .unwrap_or_else(|_| chrono::Duration::seconds(300)),
            last: HashMap::new(),
        }
    }

    /// Whether `x`, evaluated at `now`, is to be published (and, if so,
    /// remembers it as the group's last published one).
    pub fn admit(&mut self, x: &Explanation, now: DateTime<Utc>) -> bool {
        let key = GroupKey {
            district: x.district.clone(),
            profile: x.profile.clone(),
        };
        let new = Published {
            meaning: meaning(x),
            stats: x.stats.clone(),
            ops: x.ops_in_flight.clone(),
            at: now,
        };
        if let Some(p) = self.last.get(&key)
            && p.meaning == new.meaning
            && p.stats == new.stats
            && p.ops == new.ops
            && now - p.at < self.keepalive
        {
            return false;
        }
        self.last.insert(key, new);
        true
    }

    /// Keeps only the groups `keep` says are still evaluated (a group that
    /// comes back is published at once).
    pub fn retain(&mut self, keep: impl Fn(&GroupKey) -> bool) {
        self.last.retain(|g, _| keep(g));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_proto::msg::{Outcome, Reason};

    fn x(usage: f64, ok: bool, detail: &str) -> Explanation {
        Explanation {
            district: "d1".into(),
            profile: "small".into(),
            evaluated_at: t(0),
            outcome: Outcome::None,
            summary: "nothing to do".into(),
            reasons: vec![Reason {
                rule: "startup_grace".into(),
                ok,
                detail: detail.into(),
            }],
            stats: GroupStats {
                usage_pct: usage,
                ..Default::default()
            },
            ops_in_flight: vec![],
        }
    }

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn an_unchanged_group_publishes_nothing_until_the_keepalive() {
        let mut g = ExplainGate::new(Duration::from_secs(60));
        assert!(g.admit(&x(50.0, true, "agent up 1m"), t(0)), "first one");
        // Same content, other details (durations): nothing to publish.
        assert!(!g.admit(&x(50.0, true, "agent up 1m 1s"), t(1)));
        assert!(!g.admit(&x(50.0, true, "agent up 1m 59s"), t(59)));
        // The keep-alive, then quiet again.
        assert!(g.admit(&x(50.0, true, "agent up 2m"), t(60)));
        assert!(!g.admit(&x(50.0, true, "agent up 2m 1s"), t(61)));
    }

    #[test]
    fn a_changed_group_publishes_at_once() {
        let mut g = ExplainGate::new(Duration::from_secs(60));
        assert!(g.admit(&x(50.0, true, ""), t(0)));
        // Figures.
        assert!(g.admit(&x(50.5, true, ""), t(1)));
        // A rule's verdict.
        assert!(g.admit(&x(50.5, false, ""), t(2)));
        // The outcome.
        let mut up = x(50.5, false, "");
        up.outcome = Outcome::ScaleUp;
        assert!(g.admit(&up, t(3)));
        // Operations in flight.
        up.ops_in_flight = vec!["op-1".into()];
        assert!(g.admit(&up, t(4)));
        assert!(!g.admit(&up, t(5)));
        // Another group is its own.
        let mut other = up.clone();
        other.district = "d2".into();
        assert!(g.admit(&other, t(5)));
    }

    #[test]
    fn a_group_that_left_and_came_back_is_published_at_once() {
        let mut g = ExplainGate::new(Duration::from_secs(60));
        assert!(g.admit(&x(50.0, true, ""), t(0)));
        g.retain(|k| k.district != "d1");
        assert!(g.admit(&x(50.0, true, ""), t(1)));
    }
}
