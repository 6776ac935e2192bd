//! The answers given to recent operator requests, so that a request the bus
//! delivers twice is answered twice alike instead of being refused.
//!
//! A transport may deliver a request again after it was acted upon: the
//! STOMP driver recycles its connection to give back deliveries of
//! cancelled subscriptions, and an acknowledgement lost with a connection
//! brings the message back. The replay record (`replay.rs`) refuses the
//! second copy, as it must refuse an attacker's; but the second copy of a
//! request already answered is the same signed bytes, so it gets the same
//! answer, sent to the same reply queue only (an unsigned `reply-to` cannot
//! redirect it). Bounded in count and bytes; kept in memory (after a restart
//! a redelivered request is refused as replayed, as before).

use std::collections::VecDeque;

use gearshift_proto::msg::AdminReply;
use uuid::Uuid;

/// Most answers remembered.
pub const CAPACITY: usize = 64;
/// Most bytes of answer data remembered (a large fleet's status is big).
pub const BUDGET: usize = 4 << 20;

/// One answer: to which request, sent where.
#[derive(Debug, Clone)]
struct Answer {
    id: Uuid,
    from: String,
    reply_to: String,
    corr: Option<String>,
    reply: AdminReply,
    bytes: usize,
}

/// The recent answers, oldest first.
#[derive(Debug, Default)]
pub struct Answers {
    recent: VecDeque<Answer>,
    bytes: usize,
}

impl Answers {
    /// Remembers the answer to request `id` of `from`, sent to `reply_to`.
    /// An answer larger than the whole budget is not kept.
    pub fn remember(
        &mut self,
        (id, from): (Uuid, &str),
        reply_to: &str,
        corr: Option<String>,
        reply: &AdminReply,
    ) {
        let bytes = reply.message.len() + reply.data.to_string().len();
        if bytes > BUDGET {
            return;
        }
        self.recent.retain(|a| a.id != id);
        self.bytes = self.recent.iter().map(|a| a.bytes).sum();
        while self.recent.len() >= CAPACITY || self.bytes + bytes > BUDGET {
            match self.recent.pop_front() {
                Some(old) => self.bytes -= old.bytes,
                None => break,
            }
        }
        self.bytes += bytes;
        self.recent.push_back(Answer {
            id,
            from: from.to_string(),
            reply_to: reply_to.to_string(),
            corr,
            reply: reply.clone(),
            bytes,
        });
    }

    /// The answer already given to request `id` of `from`, if it went to
    /// `reply_to`.
    pub fn again(
        &self,
        (id, from): (Uuid, &str),
        reply_to: &str,
    ) -> Option<(AdminReply, Option<String>)> {
        self.recent
            .iter()
            .rev()
            .find(|a| a.id == id && a.from == from && a.reply_to == reply_to)
            .map(|a| (a.reply.clone(), a.corr.clone()))
    }

    /// Number of answers remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.recent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(message: &str, data: serde_json::Value) -> AdminReply {
        AdminReply {
            ok: true,
            message: message.into(),
            data,
        }
    }

    #[test]
    fn a_request_seen_again_gets_the_same_answer_on_the_same_queue_only() {
        let mut a = Answers::default();
        let id = Uuid::new_v4();
        a.remember(
            (id, "alice"),
            "q1",
            Some("op-1".into()),
            &reply("done", serde_json::json!({"x": 1})),
        );
        let (r, corr) = a.again((id, "alice"), "q1").expect("remembered");
        assert_eq!(r.message, "done");
        assert_eq!(r.data["x"], 1);
        assert_eq!(corr.as_deref(), Some("op-1"));
        assert!(
            a.again((id, "alice"), "elsewhere").is_none(),
            "a replay cannot redirect the answer"
        );
        assert!(a.again((Uuid::new_v4(), "alice"), "q1").is_none());
        assert!(
            a.again((id, "bob"), "q1").is_none(),
            "another signer's id is not this one"
        );
    }

    #[test]
    fn bounded_in_count_and_bytes_oldest_first() {
        let mut a = Answers::default();
        let ids: Vec<Uuid> = (0..CAPACITY + 5).map(|_| Uuid::new_v4()).collect();
        for id in &ids {
            a.remember(
                (*id, "alice"),
                "q",
                None,
                &reply("ok", serde_json::Value::Null),
            );
        }
        assert_eq!(a.len(), CAPACITY);
        assert!(
            a.again((ids[0], "alice"), "q").is_none(),
            "the oldest is forgotten"
        );
        assert!(a.again((ids[CAPACITY + 4], "alice"), "q").is_some());
        // Two answers of 60 % of the budget cannot both stay.
        let big = "x".repeat(BUDGET * 6 / 10);
        let (b1, b2) = (Uuid::new_v4(), Uuid::new_v4());
        a.remember(
            (b1, "alice"),
            "q",
            None,
            &reply(&big, serde_json::Value::Null),
        );
        a.remember(
            (b2, "alice"),
            "q",
            None,
            &reply(&big, serde_json::Value::Null),
        );
        assert!(a.again((b1, "alice"), "q").is_none());
        assert!(a.again((b2, "alice"), "q").is_some());
        // One over the whole budget is not kept, and evicts nothing.
        let huge = "x".repeat(BUDGET + 1);
        let b3 = Uuid::new_v4();
        a.remember(
            (b3, "alice"),
            "q",
            None,
            &reply(&huge, serde_json::Value::Null),
        );
        assert!(a.again((b3, "alice"), "q").is_none());
        assert!(a.again((b2, "alice"), "q").is_some());
    }

    #[test]
    fn remembering_an_id_twice_keeps_one_answer() {
        let mut a = Answers::default();
        let id = Uuid::new_v4();
        a.remember(
            (id, "alice"),
            "q",
            None,
            &reply("first", serde_json::Value::Null),
        );
        a.remember(
            (id, "alice"),
            "q",
            None,
            &reply("second", serde_json::Value::Null),
        );
        assert_eq!(a.len(), 1);
        assert_eq!(a.again((id, "alice"), "q").unwrap().0.message, "second");
    }
}
