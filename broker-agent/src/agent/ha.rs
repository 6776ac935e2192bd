//! High availability in the driver: the election machine ([`crate::lead`])
//! fed from the bus (candidate tokens, announcements, the replicated
//! journal, connection losses), the takeover (load the newest journal,
//! resume its sagas, consume the shared queues) and the step-down (drop
//! them, forget the journal, stand by). A standby consumes only its own
//! report queue, the announcements and the replicated journal, and
//! publishes only its tokens (and answers pings).

use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_bus::{
    BusError, BusEvent, ConsumeOptions, Delivery, OutMessage, QueueSpec, Subscription,
};
use gearshift_proto::gate::Step;
use gearshift_proto::msg::{Kind, LeadToken, LeaderAnnouncement, Message};
use gearshift_proto::{Envelope, Expect, Refusal, routing};
use gearshift_service::refusals::admit_delivery;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::deliveries::{Log, ack};
use super::proof::Proof;
use super::subs::{Subs, next};
use super::{Agent, Result2, RunState};
use crate::core::Core;
use crate::lead::replica::{self, Replica};
use crate::lead::{HaStatus, Input, Lead, LeadAction, LeadTiming, Role, StepDown};

/// How often the election machine ticks.
const TICK: Duration = Duration::from_millis(100);
/// The leader republishes its journal this often without changes (for
/// standbys that started since).
const SNAPSHOT_EVERY: Duration = Duration::from_secs(5);
const TOKENS: Expect = Expect::kinds(|k| k == Kind::LeadToken);
const LEADERS: Expect = Expect::kinds(|k| k == Kind::Leader);
/// The replicated journal may wait in the queue while the standby is busy.
const JOURNALS: Expect = Expect::kinds(|k| k == Kind::JournalSnapshot).any_age();

/// The driver's election state.
pub(super) struct Ha {
    pub lead: Lead,
    /// This run's id in tokens and announcements.
    instance: String,
    replica: Replica,
    snapshot_seq: u64,
    last_snapshot: Option<tokio::time::Instant>,
    /// The last announcement of another leader, and when it came.
    seen: Option<(LeaderAnnouncement, DateTime<Utc>)>,
    /// The newest epoch a node named when it refused our command as stale,
    /// fed to the election at its next input (see [`Ha::stale_epoch_seen`]).
    stale: Option<u64>,
    /// Whether it may still carry out effects while leading.
    pub proof: Proof,
}

impl Ha {
    /// A standby that has seen `epoch` (its journal's).
    pub fn new(timing: LeadTiming, epoch: u64) -> Self {
        Ha {
            lead: Lead::new(timing, epoch),
            instance: uuid::Uuid::new_v4().simple().to_string(),
            replica: Replica::default(),
            snapshot_seq: 0,
            last_snapshot: None,
            seen: None,
            stale: None,
            proof: Proof::default(),
        }
    }

    /// Whether this leader may still carry out effects (see [`Proof`]).
    pub fn still_proven(&mut self, connected: bool) -> bool {
        self.leading() && self.proof.doubt(connected).is_none()
    }

    /// A node refused our command because it has seen `theirs`, a newer
    /// epoch: another agent led since. The election steps down at its next
    /// input (a leader never goes on deciding with an epoch nodes refuse).
    pub fn stale_epoch_seen(&mut self, theirs: u64) {
        self.stale = self.stale.max(Some(theirs));
    }

    /// Whether this agent leads.
    pub fn leading(&self) -> bool {
        self.lead.is_leader()
    }

    /// The status's view.
    pub fn status(&self, agent: &str, cluster: &str) -> HaStatus {
        let mut s = HaStatus {
            cluster: cluster.to_string(),
            replica: self.replica.version().map(|(e, q)| format!("{e}.{q}")),
            announced_at: self.seen.as_ref().map(|(_, at)| *at),
            ..HaStatus::default()
        };
        match self.lead.role() {
            Role::Leader { epoch, since } => {
                s.role = "leader".into();
                s.leader = Some(agent.to_string());
                s.epoch = Some(*epoch);
                s.since = Some(*since);
            }
            Role::Standby => {
                s.role = "standby".into();
                if let Some((a, _)) = &self.seen {
                    s.leader = Some(a.agent.clone());
                    s.epoch = Some(a.epoch);
                    s.since = Some(a.since);
                }
            }
        }
        s
    }
}

/// The timing `[agent]` sets.
pub(super) fn timing(cfg: &crate::config::AgentSection) -> LeadTiming {
    LeadTiming {
        period: cfg.lead_period,
        lease: cfg.lead_lease,
    }
}

/// The election's subscriptions and timer; `None` until subscribed.
#[derive(Default)]
pub(super) struct HaSubs {
    tokens: Option<Subscription>,
    journal: Option<Subscription>,
    leaders: Option<Subscription>,
    events: Option<broadcast::Receiver<BusEvent>>,
    tick: Option<tokio::time::Interval>,
}

/// One input for the election.
pub(super) enum HaIn {
    Tick,
    Token(Delivery),
    Journal(Delivery),
    Leader(Delivery),
    Bus(BusEvent),
    /// The leader queue's consumer ended.
    Lost,
}

impl HaSubs {
    /// Whether every subscription is up.
    pub fn complete(&self) -> bool {
        self.tokens.is_some() && self.journal.is_some() && self.leaders.is_some()
    }

    /// The next input (never, before the first [`Agent::ensure_ha_subs`]).
    pub async fn next(&mut self) -> HaIn {
        let HaSubs {
            tokens,
            journal,
            leaders,
            events,
            tick,
        } = self;
        let tick = async {
            match tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        // Biased: a replicated journal already received is taken before a
        // token that could make this agent take over with an older one.
        tokio::select! {
            biased;
            d = next(journal) => match d {
                Some(d) => HaIn::Journal(d),
                None => {
                    *journal = None;
                    HaIn::Tick
                }
            },
            e = bus_event(events) => HaIn::Bus(e),
            d = next(tokens) => match d {
                Some(d) => HaIn::Token(d),
                None => {
                    *tokens = None;
                    HaIn::Lost
                }
            },
            d = next(leaders) => match d {
                Some(d) => HaIn::Leader(d),
                None => {
                    *leaders = None;
                    HaIn::Tick
                }
            },
            _ = tick => HaIn::Tick,
        }
    }
}

/// The next connection change (never once the bus closed its channel).
async fn bus_event(events: &mut Option<broadcast::Receiver<BusEvent>>) -> BusEvent {
    loop {
        let Some(rx) = events.as_mut() else {
            return std::future::pending().await;
        };
        match rx.recv().await {
            Ok(e) => return e,
            // Missed changes: the connection changed at least once.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                return BusEvent::Disconnected {
                    reason: "missed connection events".into(),
                };
            }
            Err(broadcast::error::RecvError::Closed) => *events = None,
        }
    }
}

impl Agent {
    /// Subscribes what the election needs and is not subscribed yet.
    pub(super) async fn ensure_ha_subs(&self, subs: &mut HaSubs) {
        let cluster = &self.cfg.agent.cluster;
        if subs.events.is_none() {
            subs.events = Some(self.bus.events());
        }
        if subs.tick.is_none() {
            subs.tick = Some(super::tick::ticker(TICK));
        }
        if subs.tokens.is_none() {
            let spec = QueueSpec::durable(
                routing::leader_queue(cluster),
                vec![routing::lead_token(cluster)],
            )
            .with_single_active_consumer();
            let opts = ConsumeOptions { prefetch: 16 };
            let r = match self.bus.consume(&spec, opts).await {
                // A bus that cannot give a queue one active consumer
                // (RabbitMQ's STOMP plugin): every agent on it receives
                // every token and leads, so only one may run there.
                Err(BusError::Invalid(why)) => {
                    tracing::warn!(
                        reason = %why,
                        "this bus cannot elect one leader: run a single broker agent on it \
                         (docs/ha.md), or connect the agents over AMQP or ActiveMQ"
                    );
                    let mut plain = spec.clone();
                    plain.single_active_consumer = false;
                    self.bus.consume(&plain, opts).await
                }
                other => other,
            };
            match r {
                Ok(s) => subs.tokens = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume the leader queue yet; retrying")
                }
            }
        }
        if subs.journal.is_none() {
            match self.subscribe_journal().await {
                Ok(s) => subs.journal = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to the replicated journal yet; retrying")
                }
            }
        }
        if subs.leaders.is_none() {
            match self.bus.subscribe(&routing::leader(cluster)).await {
                Ok(s) => subs.leaders = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to leader announcements yet; retrying")
                }
            }
        }
    }

    /// The replicated journal through a queue of our own holding only the
    /// newest snapshot, or a plain subscription where the bus cannot bound
    /// a queue (ActiveMQ over STOMP).
    async fn subscribe_journal(&self) -> Result<Subscription, BusError> {
        let key = routing::journal(&self.cfg.agent.cluster);
        let spec = QueueSpec::transient(
            format!(
                "gearshift.broker.journal.{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            vec![key.clone()],
        )
        .with_max_length(1);
        match self
            .bus
            .consume(&spec, ConsumeOptions { prefetch: 1 })
            .await
        {
            Err(BusError::Invalid(_)) => self.bus.subscribe(&key).await,
            other => other,
        }
    }

    /// One election input, then what the machine asks for.
    pub(super) async fn on_ha(
        &mut self,
        core: &mut Core,
        st: &mut RunState,
        subs: &mut Subs,
        input: HaIn,
        token: &CancellationToken,
    ) -> Result2<()> {
        let now = Utc::now();
        let step = match input {
            HaIn::Tick => Some(Input::Tick),
            HaIn::Token(d) => self.on_token(st, d, now).await,
            HaIn::Leader(d) => self.on_announcement(st, d, now),
            HaIn::Journal(d) => self.on_journal(st, d, now).await,
            HaIn::Bus(BusEvent::Connected { reconnects: 0 }) => None,
            HaIn::Bus(e) => {
                tracing::info!(event = ?e, "bus connection changed: leadership must be proved again");
                Some(Input::BusReset)
            }
            HaIn::Lost => Some(Input::BusReset),
        };
        // In doubt (see `Ha::still_proven`): step down, then prove it again.
        let doubt = st.ha.proof.doubt(self.bus.health().connected);
        if let (true, Some(why)) = (st.ha.leading(), doubt) {
            tracing::warn!(
                reason = why,
                "leadership in doubt: stepping down to prove it again"
            );
            for a in st.ha.lead.step(Input::BusReset, now) {
                self.on_lead_action(core, st, subs, a, token).await?;
            }
        }
        if let Some(epoch) = st.ha.stale.take() {
            let i = Input::EpochSeen {
                epoch,
                other_leader: true,
            };
            for a in st.ha.lead.step(i, now) {
                self.on_lead_action(core, st, subs, a, token).await?;
            }
        }
        if let Some(i) = step {
            let acts = st.ha.lead.step(i, now);
            for a in acts {
                self.on_lead_action(core, st, subs, a, token).await?;
            }
        }
        let due = st
            .ha
            .last_snapshot
            .is_none_or(|t| t.elapsed() >= SNAPSHOT_EVERY);
        if st.ha.leading() && due && !self.replicate(core, st).await {
            st.ha.proof.replication_failed();
        }
        Ok(())
    }

    /// Counts a refused election message, unless it was only late (a
    /// token that waited in the queue while its consumer died, say).
    fn refuse_ha(&self, st: &mut RunState, r: &Refusal) {
        if r.step == Step::Time {
            tracing::debug!(reason = r.reason, "late election message dropped");
        } else {
            self.refuse(st, Log::Events, r);
        }
    }

    async fn on_token(&self, st: &mut RunState, d: Delivery, now: DateTime<Utc>) -> Option<Input> {
        let r = admit_delivery(&self.gate(), &d, TOKENS, now);
        ack(d).await;
        match r {
            Ok(a) => match a.envelope.msg {
                Message::LeadToken(t) => Some(Input::Token {
                    own: t.instance == st.ha.instance,
                    seq: t.seq,
                }),
                _ => None,
            },
            Err(r) => {
                self.refuse_ha(st, &r);
                None
            }
        }
    }

    fn on_announcement(&self, st: &mut RunState, d: Delivery, now: DateTime<Utc>) -> Option<Input> {
        match admit_delivery(&self.gate(), &d, LEADERS, now) {
            Ok(a) => match a.envelope.msg {
                Message::Leader(l) if l.instance != st.ha.instance => {
                    let epoch = l.epoch;
                    st.ha.seen = Some((l, now));
                    st.status_dirty = true;
                    Some(Input::EpochSeen {
                        epoch,
                        other_leader: true,
                    })
                }
                _ => None,
            },
            Err(r) => {
                self.refuse_ha(st, &r);
                None
            }
        }
    }

    async fn on_journal(
        &self,
        st: &mut RunState,
        d: Delivery,
        now: DateTime<Utc>,
    ) -> Option<Input> {
        let r = admit_delivery(&self.gate(), &d, JOURNALS, now);
        ack(d).await;
        let s = match r {
            Ok(a) => match a.envelope.msg {
                Message::JournalSnapshot(s) => s,
                _ => return None,
            },
            Err(r) => {
                self.refuse_ha(st, &r);
                return None;
            }
        };
        // Our own, while leading: nothing to keep.
        if st.ha.lead.epoch() == Some(s.epoch) {
            return None;
        }
        let epoch = s.epoch;
        if let Err(e) = st.ha.replica.offer(s) {
            tracing::warn!(error = %e, epoch, "unreadable replicated journal ignored");
            return None;
        }
        Some(Input::EpochSeen {
            epoch,
            other_leader: false,
        })
    }

    async fn on_lead_action(
        &mut self,
        core: &mut Core,
        st: &mut RunState,
        subs: &mut Subs,
        a: LeadAction,
        token: &CancellationToken,
    ) -> Result2<()> {
        let name = &self.cfg.agent.name;
        let cluster = &self.cfg.agent.cluster;
        match a {
            LeadAction::PublishToken { seq } => {
                let t = LeadToken {
                    agent: name.clone(),
                    instance: st.ha.instance.clone(),
                    seq,
                };
                self.publish_ha(routing::lead_token(cluster), t).await;
            }
            LeadAction::Announce => {
                if let Role::Leader { epoch, since } = st.ha.lead.role().clone() {
                    let l = LeaderAnnouncement {
                        agent: name.clone(),
                        instance: st.ha.instance.clone(),
                        epoch,
                        since,
                    };
                    self.publish_ha(routing::leader(cluster), l).await;
                }
            }
            LeadAction::BecomeLeader { epoch } => {
                self.take_over(core, st, subs, epoch, token).await?
            }
            LeadAction::StepDown(why) => self.step_down(core, st, subs, why),
        }
        Ok(())
    }

    /// Publishes an election message (transient, signed, short-lived).
    async fn publish_ha(&self, key: String, body: impl Into<Message>) {
        let ttl = self.cfg.agent.lead_lease;
        let e = Envelope::new(&self.cfg.agent.name, body).with_ttl(ttl);
        let m = OutMessage::new(key, self.signer.seal(e)).transient();
        if let Err(e) = self.bus.publish(m).await {
            tracing::debug!(error = %e, "election message not published");
        }
    }

    /// Publishes the journal to the standbys: after each commit, before the
    /// commit's effects, and every few seconds.
    /// Returns whether the bus took it.
    pub(super) async fn replicate(&self, core: &mut Core, st: &mut RunState) -> bool {
        // Built before the await: the core is not shared across threads.
        let m = self.snapshot_message(core, st);
        match self.bus.publish(m).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "journal not replicated: a standby taking over now would resume from an older one");
                false
            }
        }
    }

    fn snapshot_message(&self, core: &Core, st: &mut RunState) -> OutMessage {
        st.ha.snapshot_seq += 1;
        st.ha.last_snapshot = Some(tokio::time::Instant::now());
        let s = replica::snapshot(core, &self.cfg.agent.name, st.ha.snapshot_seq);
        let e = Envelope::new(&self.cfg.agent.name, s);
        OutMessage::new(
            routing::journal(&self.cfg.agent.cluster),
            self.signer.seal(e),
        )
        .transient()
    }

    /// Takes over with `epoch`: the newest journal (the replicated one when
    /// it is newer than ours), its sagas resumed, the shared queues consumed.
    async fn take_over(
        &mut self,
        core: &mut Core,
        st: &mut RunState,
        subs: &mut Subs,
        epoch: u64,
        token: &CancellationToken,
    ) -> Result2<()> {
        let now = Utc::now();
        st.ha.proof.arm(self.bus.events());
        core.forget_journaled();
        let own = self.journal.load()?;
        let restored = match st.ha.replica.newer_than(own.meta.epoch) {
            Some((from, j)) => {
                tracing::info!(
                    from,
                    ops = j.ops.len(),
                    "loading the previous leader's journal"
                );
                self.journal.replace(j)?;
                j.clone()
            }
            None => own,
        };
        core.restore(restored);
        core.set_epoch(epoch);
        st.ha.snapshot_seq = 0;
        self.metrics.takeover();
        self.metrics.lead(&self.cfg.agent.name, Some(epoch));
        tracing::warn!(
            epoch,
            ops = core.ops().filter(|o| !o.is_done()).count(),
            "leading: resuming the journal's operations"
        );
        subs.leading = true;
        self.ensure_subs(subs).await;
        if self.placement_service && self.cfg.agent.placement_service {
            self.spawn_placement(token.clone());
        }
        let acts = core.resume(now);
        self.apply(core, st, acts, now).await?;
        let first_eval = self.cfg.policy.interval.min(self.cfg.policy.startup_grace);
        st.next_eval = tokio::time::Instant::now() + first_eval;
        st.status_dirty = true;
        Ok(())
    }

    /// Stops deciding at once: the shared queues dropped (what they hold
    /// goes to the next leader), the placement service stopped, the journal's
    /// records forgotten (handler calls in flight finish unheard).
    fn step_down(&mut self, core: &mut Core, st: &mut RunState, subs: &mut Subs, why: StepDown) {
        tracing::warn!(reason = why.as_str(), "no longer leading: standing by");
        st.ha.proof.disarm();
        subs.leading = false;
        subs.events = None;
        subs.admin = None;
        if let Some(t) = self.placement_stop.take() {
            t.cancel();
        }
        core.forget_journaled();
        st.pressure = None;
        st.status_dirty = true;
        self.metrics.lead(&self.cfg.agent.name, None);
    }
}
