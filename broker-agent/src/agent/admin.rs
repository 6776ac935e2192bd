//! Operator requests: through the gate with its replay record, answered on
//! the request's reply queue (refusals too, once the envelope could be read).
//! `enroll.request`s share the queue and go their own way (`enroll.rs`).

use std::time::Duration;

use chrono::Utc;
use gearshift_bus::{Delivery, OutMessage};
use gearshift_proto::msg::{AdminReply, Kind, Message, Role};
use gearshift_proto::{Envelope, Expect, Refusal, Step};

use super::deliveries::{Log, ack};
use super::{Agent, Result2, RunState};
use crate::core::{Core, operator};

/// Operator requests, from operators (or another broker agent), fresh and
/// never twice.
const REQUESTS: Expect =
    Expect::kinds(|k| k == Kind::AdminRequest).roles(&[Role::Operator, Role::Broker]);

impl Agent {
    /// One request: its effects are journaled and carried out, then it is
    /// answered, then acknowledged.
    pub(super) async fn on_admin_delivery(
        &mut self,
        core: &mut Core,
        st: &mut RunState,
        d: Delivery,
    ) -> Result2<()> {
        if d.too_large.is_none() && Envelope::peek_kind(&d.payload) == Some(Kind::EnrollRequest) {
            self.on_enroll_delivery(st, d).await;
            return Ok(());
        }
        let now = Utc::now();
        // One the transport dropped for its size is refused as too_large.
        let admitted = match &d.too_large {
            Some(t) => Err(Refusal::oversized(t.size, t.limit)),
            None => self
                .gate()
                .admit_once(&d.payload, REQUESTS, now, &mut st.replay),
        };
        let (reply, corr, acts, asker) = match admitted {
            Ok(a) => {
                let Envelope {
                    id,
                    from,
                    corr,
                    msg,
                    ..
                } = a.envelope;
                let Message::AdminRequest(req) = msg else {
                    let reply = operator::refused("not an admin.request".into());
                    return self.answer(core, st, d, (reply, corr), vec![], now).await;
                };
                let agent = &self.cfg.agent.name;
                let (reply, acts) = core.on_operator(&from, req, agent, &st.refused, now);
                (reply, corr, acts, Some((id, from)))
            }
            Err(r) => {
                if self.answer_again(st, &d, &r).await {
                    ack(d).await;
                    return Ok(());
                }
                self.refuse(st, Log::Admin, &r);
                if r.step == Step::Decode {
                    ack(d).await;
                    return Ok(());
                }
                let reply = operator::refused(format!("refused: {}", r.detail));
                (reply, r.corr, vec![], None)
            }
        };
        if let (Some((id, from)), Some(q)) = (asker, d.reply_to.as_deref()) {
            st.answers.remember((id, &from), q, corr.clone(), &reply);
        }
        self.answer(core, st, d, (reply, corr), acts, now).await
    }

    /// A request refused as replayed that this agent already answered (the
    /// bus delivered it twice) is answered again alike, on the same reply
    /// queue; returns whether it was.
    async fn answer_again(&self, st: &RunState, d: &Delivery, r: &Refusal) -> bool {
        let (Some(id), Some(from), Some(q)) = (r.id, r.from.as_deref(), d.reply_to.as_deref())
        else {
            return false;
        };
        if r.reason != "replayed" {
            return false;
        }
        let Some((reply, corr)) = st.answers.again((id, from), q) else {
            return false;
        };
        tracing::info!(%id, "an operator request delivered again: answered again alike");
        self.reply(d, reply, corr).await;
        true
    }

    /// Journals and carries out `acts`, answers, then acknowledges.
    async fn answer(
        &self,
        core: &mut Core,
        st: &mut RunState,
        d: Delivery,
        (reply, corr): (AdminReply, Option<String>),
        acts: Vec<crate::core::Action>,
        now: chrono::DateTime<Utc>,
    ) -> Result2<()> {
        self.apply(core, st, acts, now).await?;
        self.reply(&d, reply, corr).await;
        ack(d).await;
        Ok(())
    }

    /// Sends `reply` to the request's reply queue, if it named one.
    pub(super) async fn reply(
        &self,
        d: &Delivery,
        reply: impl Into<Message>,
        corr: Option<String>,
    ) {
        let Some(q) = d.reply_to.clone() else {
            return;
        };
        let mut e = Envelope::new(&self.cfg.agent.name, reply).with_ttl(Duration::from_secs(60));
        if let Some(c) = corr {
            e = e.with_corr(c);
        }
        let mut m = OutMessage::new(q.clone(), self.signer.seal(e)).transient();
        m.correlation_id = d.correlation_id.clone();
        if let Err(e) = self.bus.send_to_queue(&q, m).await {
            tracing::warn!(error = %e, "cannot send the admin reply");
        }
    }
}
