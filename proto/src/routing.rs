//! Logical routing keys, queue names and the segment encoding.
//!
//! Routing keys are dot-separated, so a name that contains dots (a host name
//! such as `node-1.example.com`) is encoded as one segment: every byte outside
//! `[A-Za-z0-9_-]` becomes `%XX` (upper-case hex). `node-1.example.com` is
//! therefore the segment `node-1%2Eexample%2Ecom`. Absent districts are `_none`.

use std::fmt::Write;

use crate::msg::DecisionKind;

/// The AMQP topic exchange (durable) every message goes through.
pub const EXCHANGE: &str = "gearshift";
/// Segment used for nodes without a district.
pub const NO_DISTRICT: &str = "_none";
/// Segment used for fleet-wide decisions.
pub const ALL: &str = "_all";
/// Broadcast liveness key.
pub const PING: &str = "ping";
/// Placement requests to the broker agent.
pub const PLACEMENT: &str = "placement.request";
/// Operator requests to the broker agent.
pub const ADMIN: &str = "admin.request";

/// Pattern matching every node report.
pub const ALL_REPORTS: &str = "report.#";
/// Pattern matching every node event.
pub const ALL_EVENTS: &str = "event.#";
/// Pattern matching every decision.
pub const ALL_DECISIONS: &str = "decision.#";
/// Pattern matching every explanation.
pub const ALL_EXPLANATIONS: &str = "explain.#";

/// Encodes one name as one routing-key segment.
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    out
}

/// Decodes a segment made by [`segment`]; `None` if it is not well formed.
pub fn unsegment(seg: &str) -> Option<String> {
    let bytes = seg.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = seg.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out == [0] {
        return Some(String::new());
    }
    String::from_utf8(out).ok()
}

fn district_seg(district: Option<&str>) -> String {
    district.map_or_else(|| NO_DISTRICT.to_string(), segment)
}

/// `report.<district>.<node>`
pub fn report(district: Option<&str>, node: &str) -> String {
    format!("report.{}.{}", district_seg(district), segment(node))
}

/// `cmd.<node>`
pub fn command(node: &str) -> String {
    format!("cmd.{}", segment(node))
}

/// `event.<node>`
pub fn event(node: &str) -> String {
    format!("event.{}", segment(node))
}

/// `decision.<kind>.<district>.<profile>`
pub fn decision(kind: DecisionKind, district: &str, profile: &str) -> String {
    format!(
        "decision.{}.{}.{}",
        kind.as_str(),
        segment(district),
        segment(profile)
    )
}

/// `explain.<district>.<profile>`
pub fn explain(district: &str, profile: &str) -> String {
    format!("explain.{}.{}", segment(district), segment(profile))
}

/// The durable command queue of a node: `gearshift.node.<node>`, bound to `cmd.<node>`.
pub fn node_queue(node: &str) -> String {
    format!("gearshift.node.{}", segment(node))
}

/// Whether a topic `pattern` (`*` one word, `#` zero or more) matches `key`,
/// with AMQP topic-exchange semantics.
pub fn topic_matches(pattern: &str, key: &str) -> bool {
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    matches_from(&p, &k)
}

fn matches_from(p: &[&str], k: &[&str]) -> bool {
    match p.split_first() {
        None => k.is_empty(),
        Some((&"#", rest)) => (0..=k.len()).any(|skip| matches_from(rest, &k[skip..])),
        Some((&"*", rest)) => !k.is_empty() && matches_from(rest, &k[1..]),
        Some((word, rest)) => k.first() == Some(word) && matches_from(rest, &k[1..]),
    }
}

/// Where broker agents of `cluster` publish their candidate tokens
/// (`broker.candidate.<cluster>`).
pub fn lead_token(cluster: &str) -> String {
    format!("broker.candidate.{cluster}")
}

/// Where the leader of `cluster` announces itself (`broker.leader.<cluster>`).
pub fn leader(cluster: &str) -> String {
    format!("broker.leader.{cluster}")
}

/// Where the leader of `cluster` publishes its journal
/// (`broker.journal.<cluster>`).
pub fn journal(cluster: &str) -> String {
    format!("broker.journal.{cluster}")
}

/// The leader queue of `cluster`: durable, one active consumer
/// (`gearshift.broker.leader.<cluster>`).
pub fn leader_queue(cluster: &str) -> String {
    format!("gearshift.broker.leader.{cluster}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_round_trip() {
        for name in ["node-1.example.com", "a_b", "ünïcode", "x*y#z", "", "%"] {
            let s = segment(name);
            assert!(!s.contains('.') && !s.contains('*') && !s.contains('#'));
            assert_eq!(unsegment(&s).as_deref(), Some(name));
        }
    }

    #[test]
    fn keys() {
        assert_eq!(
            report(Some("d1"), "node-1.example.com"),
            "report.d1.node-1%2Eexample%2Ecom"
        );
        assert_eq!(report(None, "n"), "report._none.n");
        assert_eq!(command("n.x"), "cmd.n%2Ex");
        assert_eq!(node_queue("n.x"), "gearshift.node.n%2Ex");
        assert_eq!(
            decision(DecisionKind::ScaleUp, "d1", "small"),
            "decision.scale_up.d1.small"
        );
    }

    #[test]
    fn topic_semantics() {
        assert!(topic_matches("report.#", "report.d.n"));
        assert!(topic_matches("report.#", "report"));
        assert!(topic_matches("report.*.n", "report.d.n"));
        assert!(!topic_matches("report.*", "report.d.n"));
        assert!(topic_matches("#", "a.b.c"));
        assert!(topic_matches("#.c", "a.b.c"));
        assert!(topic_matches("a.#.c", "a.c"));
        assert!(!topic_matches("cmd.n1", "cmd.n2"));
    }
}
