//! Report intake at fleet scale: what a batch of report deliveries costs.
//!
//! A node reports every interval, so when the agent falls behind, its queue
//! holds reports that a newer one of the same node already supersedes.
//! Verifying a signature costs more than everything else a report does, so
//! a batch is first *peeked* (the sender and the report's `seq`, no
//! signature, no canonical form) and *coalesced*: per sender, the reports
//! newest first. The driver verifies the newest of every sender in one
//! batch verification; only when one is refused does it try that sender's
//! next (in another batch), so a forged report with a high `seq` cannot
//! silence a node's genuine ones. The others are superseded: acknowledged
//! once the survivor's effect is applied, never verified. Reports no newer
//! than what the fleet already holds are stale and refused unverified.
//!
//! The survivors that carry news (a node's figures changed, see
//! [`crate::fleet::Fleet::is_news`]) are applied before the plain
//! keep-alives, and an evaluation they make due runs before the rest of the
//! batch: a threshold crossing does not wait behind the batch's backlog.

use std::collections::HashMap;

use serde::Deserialize;

/// What a report says of itself before it is verified: who sent it, its
/// `seq`. Untrusted: it only orders work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peek {
    pub from: String,
    pub seq: u64,
}

#[derive(Deserialize)]
struct PeekEnvelope<'a> {
    #[serde(borrow)]
    from: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    body: PeekBody,
}

/// Every other field is skipped unread (serde ignores unknown fields).
#[derive(Deserialize)]
struct PeekBody {
    seq: u64,
}

/// The sender and `seq` of a report envelope, or `None` for anything else
/// (it then goes through the gate alone, to be refused with its reason).
pub(crate) fn peek(bytes: &[u8]) -> Option<Peek> {
    if bytes.len() > gearshift_proto::envelope::MAX_MESSAGE_BYTES {
        return None;
    }
    let e: PeekEnvelope<'_> = serde_json::from_slice(bytes).ok()?;
    (e.kind == "report").then(|| Peek {
        from: e.from.into_owned(),
        seq: e.body.seq,
    })
}

/// A batch, coalesced.
#[derive(Debug)]
pub(crate) struct Coalesced<T> {
    /// Per sender, newest first: the driver applies the first that passes
    /// the gate; the rest are superseded.
    pub nodes: Vec<Vec<T>>,
    /// Reports not newer than the fleet's: refused unverified.
    pub stale: Vec<(Peek, T)>,
    /// Deliveries that could not be peeked.
    pub other: Vec<T>,
}

/// Sorts a batch: per sender newest first, stale ones (`known` gives the
/// fleet's last accepted `seq` of a node) and unpeekable ones aside.
/// Senders keep the order of their first delivery in the batch.
pub(crate) fn coalesce<T>(
    batch: Vec<(Option<Peek>, T)>,
    known: impl Fn(&str) -> Option<u64>,
) -> Coalesced<T> {
    let mut out = Coalesced {
        nodes: vec![],
        stale: vec![],
        other: vec![],
    };
    let mut slot: HashMap<String, usize> = HashMap::new();
    let mut per: Vec<Vec<(u64, T)>> = vec![];
    for (p, item) in batch {
        let Some(p) = p else {
            out.other.push(item);
            continue;
        };
        if known(&p.from).is_some_and(|last| p.seq <= last) {
            out.stale.push((p, item));
            continue;
        }
        let i = *slot.entry(p.from).or_insert_with(|| {
            per.push(vec![]);
            per.len() - 1
        });
        per[i].push((p.seq, item));
    }
    out.nodes = per
        .into_iter()
        .map(|mut v| {
            // Stable: equal `seq`s (a duplicate delivery) keep their order.
            v.sort_by_key(|x| std::cmp::Reverse(x.0));
            v.into_iter().map(|(_, t)| t).collect()
        })
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_proto::KeyPair;
    use gearshift_proto::msg::NodeReport;

    fn sealed(node: &str, seq: u64) -> Vec<u8> {
        let r = NodeReport {
            seq,
            ..crate::fleet::tests::report(node, Some("d1"), "small", 100, 10, 0)
        };
        let key = KeyPair::from_seed(&[7; 32]);
        key.seal(gearshift_proto::Envelope::new(node, r))
    }

    fn p(from: &str, seq: u64) -> Option<Peek> {
        Some(Peek {
            from: from.into(),
            seq,
        })
    }

    #[test]
    fn a_signed_report_is_peeked_and_anything_else_is_not() {
        assert_eq!(peek(&sealed("n1", 42)), p("n1", 42));
        assert_eq!(peek(b"not json"), None);
        assert_eq!(
            peek(br#"{"from":"n1","kind":"ping","body":{"seq":1}}"#),
            None
        );
        assert_eq!(peek(br#"{"from":"n1","kind":"report","body":{}}"#), None);
    }

    #[test]
    fn newest_first_per_node_and_stale_ones_aside() {
        let batch = vec![
            (p("a", 3), "a3"),
            (p("b", 7), "b7"),
            (p("a", 5), "a5"),
            (None, "junk"),
            (p("a", 4), "a4"),
            (p("c", 2), "c2"),
            (p("b", 9), "b9"),
        ];
        // The fleet already has c at seq 2, and a at seq 1.
        let known = |n: &str| match n {
            "a" => Some(1),
            "c" => Some(2),
            _ => None,
        };
        let c = coalesce(batch, known);
        assert_eq!(c.nodes, vec![vec!["a5", "a4", "a3"], vec!["b9", "b7"]]);
        assert_eq!(
            c.stale,
            vec![(
                Peek {
                    from: "c".into(),
                    seq: 2
                },
                "c2"
            )]
        );
        assert_eq!(c.other, vec!["junk"]);
    }

    #[test]
    fn duplicates_keep_their_order() {
        let c = coalesce(vec![(p("a", 3), 1), (p("a", 3), 2)], |_| None);
        assert_eq!(c.nodes, vec![vec![1, 2]]);
    }
}
