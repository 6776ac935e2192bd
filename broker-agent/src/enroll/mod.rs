//! Node enrollment, decided without I/O: whether a node that proved it
//! holds a key, with a token that verified, becomes trusted as its host.
//!
//! The [`Ledger`] remembers, per token id, the hosts it enrolled (until the
//! token expires): it counts uses, and it keeps a token from enrolling a
//! host twice, so that a revoked host (its `nodes.d` file removed) cannot
//! come back with the token it first used. [`decide`] is the whole policy;
//! the agent (`agent/enroll.rs`) verifies, writes `nodes.d/<host>.pub`,
//! records the use ([`Ledger::record`], persisted by [`store`]) and answers.

pub mod store;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use gearshift_proto::enroll::Token;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most live tokens the ledger tracks; a new token beyond it is refused
/// (`failed`) until older ones expire. Far above any real deployment.
pub const MAX_TOKENS: usize = 10_000;

/// What a token has enrolled so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spent {
    /// The token's `not_after`: the entry is forgotten after it.
    pub not_after: DateTime<Utc>,
    /// The hosts it enrolled.
    pub hosts: BTreeSet<String>,
}

/// The uses of every live token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Per token id.
    pub tokens: BTreeMap<Uuid, Spent>,
}

/// What a node asks: its host name, the id of the key it proved it holds,
/// and the group it says it joins.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The envelope's `from`.
    pub host: &'a str,
    /// Key id of the presented key.
    pub key_id: &'a str,
    /// The district the node says it joins.
    pub district: Option<&'a str>,
    /// The profile the node says it has.
    pub profile: Option<&'a str>,
}

/// The decision on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Trust the key for the host: write its file, record the use.
    Enroll,
    /// The host is enrolled with this very key (a retried request): answer
    /// yes again, and make sure the use is recorded.
    Already,
    /// Refuse, with a stable reason label and a detail.
    Refuse(&'static str, String),
}

impl Verdict {
    /// The label of `gearshift_broker_enrollments_total{result}` and of the reply.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Enroll => "enrolled",
            Verdict::Already => "already_enrolled",
            Verdict::Refuse(r, _) => r,
        }
    }
}

/// Decides `ask` under a verified `token` at `now`; `enrolled` is the key id
/// of the host's current `nodes.d` file, if it has one.
pub fn decide(
    ledger: &Ledger,
    token: &Token,
    ask: Ask<'_>,
    enrolled: Option<&str>,
    now: DateTime<Utc>,
) -> Verdict {
    let refuse = |r: &'static str, d: String| Verdict::Refuse(r, d);
    let g = &token.grant;
    if let Err(e) = gearshift_proto::msg::check_host(ask.host) {
        return refuse("bad_request", format!("{:?}: {e}", ask.host));
    }
    if token.not_after <= now {
        return refuse("token_expired", format!("expired at {}", token.not_after));
    }
    if let Some(h) = &g.host
        && h != ask.host
    {
        return refuse("wrong_host", format!("the token is for {h}"));
    }
    let group = (g.district.as_str(), g.profile.as_str());
    if ask.district.is_some_and(|d| d != group.0) || ask.profile.is_some_and(|p| p != group.1) {
        return refuse(
            "wrong_group",
            format!(
                "the token is for {}/{}, the node says {}/{}",
                group.0,
                group.1,
                ask.district.unwrap_or("-"),
                ask.profile.unwrap_or("-")
            ),
        );
    }
    match enrolled {
        Some(k) if k == ask.key_id => return Verdict::Already,
        Some(k) => {
            return refuse(
                "host_taken",
                format!("{} is enrolled with another key ({k})", ask.host),
            );
        }
        None => {}
    }
    let spent = ledger.tokens.get(&token.id);
    if spent.is_some_and(|s| s.hosts.contains(ask.host)) {
        return refuse(
            "revoked",
            format!(
                "token {} already enrolled {}, whose key was removed since",
                token.id, ask.host
            ),
        );
    }
    let used = spent.map_or(0, |s| s.hosts.len());
    if used >= g.max_uses as usize {
        return refuse(
            "token_used_up",
            format!("token {} used {used} of {} times", token.id, g.max_uses),
        );
    }
    if spent.is_none() && ledger.tokens.len() >= MAX_TOKENS {
        return refuse(
            "failed",
            format!("{MAX_TOKENS} live tokens tracked already"),
        );
    }
    Verdict::Enroll
}

impl Ledger {
    /// Records that `token` enrolled `host`; returns whether that changed
    /// anything (a retried request records nothing new).
    pub fn record(&mut self, token: &Token, host: &str) -> bool {
        let spent = self.tokens.entry(token.id).or_insert_with(|| Spent {
            not_after: token.not_after,
            hosts: BTreeSet::new(),
        });
        spent.hosts.insert(host.to_string())
    }

    /// Forgets the tokens expired before `now`; returns whether any was.
    pub fn expire(&mut self, now: DateTime<Utc>) -> bool {
        let before = self.tokens.len();
        self.tokens.retain(|_, s| s.not_after > now);
        self.tokens.len() != before
    }
}
