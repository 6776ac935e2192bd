//! The core task: the one owner of the node's [`NodeCore`]. It takes
//! commands and pings from the intake loops, move results from the
//! [`Mover`], completions from its own effects, feeds them to the core and
//! carries out the actions the core returns, in order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use gearshift_bus::{Delivery, OutMessage};
use gearshift_proto::{Envelope, Refusal, routing};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::shared::{Shared, View};
use crate::core::{
    Action, Command, Confirm, Cx, Event, Input, NodeCore, Reply, Scan, ScanError, Tag,
};
use crate::evacuate::plan::Plan;
use crate::evacuate::{self, Mover};
use crate::metrics::Metrics;
use crate::state::journal::JournalFiles;
use crate::state::read_json;

/// What the intake loops and effect tasks send to the core task.
pub(crate) enum ToCore {
    /// A delivery from the command queue and the gate's verdict on it.
    Command(Delivery, Result<Envelope, Refusal>),
    /// A broadcast ping and the gate's verdict on it.
    Ping(Reply, Result<Envelope, Refusal>),
    /// A completion of an effect that ran in its own task.
    Input(Input),
}

/// How often old journal entries are forgotten.
const HOUSEKEEPING: Duration = Duration::from_secs(60);

/// The core task.
pub(crate) struct Driver {
    shared: Arc<Shared>,
    pub(super) core: NodeCore,
    journal: JournalFiles,
    tx: mpsc::Sender<ToCore>,
    rx: mpsc::Receiver<ToCore>,
    deliveries: HashMap<u64, Delivery>,
    next_tag: u64,
    pub(super) mover: Mover,
    confirms: FuturesUnordered<BoxFuture<'static, (Confirm, bool)>>,
    published: Option<View>,
}

impl Driver {
    pub(crate) fn new(
        shared: Arc<Shared>,
        core: NodeCore,
        tx: mpsc::Sender<ToCore>,
        rx: mpsc::Receiver<ToCore>,
    ) -> Driver {
        Driver {
            journal: JournalFiles::new(&shared.state),
            mover: Mover::new(shared.runtime.clone(), shared.tracker.clone()),
            shared,
            core,
            tx,
            rx,
            deliveries: HashMap::new(),
            next_tag: 0,
            confirms: FuturesUnordered::new(),
            published: None,
        }
    }

    /// At start, before any command: forgets old journal entries, then
    /// resumes the evacuations the state directory holds.
    pub(crate) async fn start(&mut self) {
        self.step(Input::Prune).await;
        let state = self.shared.state.clone();
        let plans = self
            .shared
            .blocking(move || {
                let mut plans = Vec::new();
                for path in state.checkpoint_files()? {
                    match read_json::<Plan>(&path) {
                        Ok(Some(plan)) => plans.push(plan),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "evacuation checkpoint unreadable; skipped")
                        }
                    }
                }
                Ok(plans)
            })
            .await;
        match plans {
            Ok(plans) => self.step(Input::Resume(plans)).await,
            Err(e) => tracing::error!(error = %e, "cannot list evacuation checkpoints"),
        }
    }

    /// Runs until `stop`, then until the work under way settled (moves in
    /// flight end or are interrupted after the grace period).
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        housekeeping.tick().await;
        let grace = self.shared.limits.shutdown_grace;
        let mut give_up: Option<tokio::time::Instant> = None;
        loop {
            if give_up.is_some() && self.core.settled() && self.mover.in_flight() == 0 {
                return;
            }
            let input = tokio::select! {
                m = self.rx.recv() => match m {
                    Some(m) => self.intake(m),
                    None => None,
                },
                done = self.mover.next(), if self.mover.in_flight() > 0 => Some(Input::Moved(done)),
                Some((confirm, ok)) = self.confirms.next(), if !self.confirms.is_empty() => {
                    Some(Input::Confirmed { confirm, ok })
                }
                _ = stop.cancelled(), if give_up.is_none() => {
                    self.mover.stop(grace);
                    self.confirms = FuturesUnordered::new();
                    give_up = Some(tokio::time::Instant::now() + grace + Duration::from_secs(5));
                    Some(Input::Stop)
                }
                _ = sleep_until(give_up) => {
                    tracing::warn!("work still under way after the grace period; the core task stops");
                    return;
                }
                _ = housekeeping.tick() => Some(Input::Prune),
            };
            if let Some(input) = input {
                self.step(input).await;
            }
        }
    }

    fn intake(&mut self, m: ToCore) -> Option<Input> {
        Some(match m {
            ToCore::Command(d, admitted) => {
                let tag = Tag(self.next_tag);
                self.next_tag += 1;
                let c = Command {
                    tag,
                    redelivered: d.redelivered,
                    reply: Reply {
                        queue: d.reply_to.clone(),
                        correlation_id: d.correlation_id.clone(),
                    },
                    admitted,
                };
                self.deliveries.insert(tag.0, d);
                Input::Command(c)
            }
            ToCore::Ping(reply, admitted) => Input::BroadcastPing { reply, admitted },
            ToCore::Input(i) => i,
        })
    }

    /// Feeds `first` to the core, carries out its actions, and feeds the
    /// completions they produce, until none is left.
    pub(crate) async fn step(&mut self, first: Input) {
        let mut inputs = VecDeque::from([first]);
        while let Some(input) = inputs.pop_front() {
            let config = self.shared.core_config();
            let cx = Cx {
                name: &self.shared.name,
                config: &config,
            };
            let actions = self.core.handle(cx, input, Utc::now());
            // Before any effect: an event or a report must never show an
            // older state than the one that caused it.
            self.publish_view();
            for a in actions {
                if let Some(next) = self.execute(a).await {
                    inputs.push_back(next);
                }
            }
        }
    }

    /// Shows the core's flag and operation to the other tasks.
    fn publish_view(&mut self) {
        let view = View {
            active: self.core.active(),
            operation: self.core.operation(),
        };
        if self.published.as_ref() == Some(&view) {
            return;
        }
        let m = &self.shared.metrics;
        m.active.set(i64::from(view.active));
        let (moved, failed, remaining) = view
            .operation
            .as_ref()
            .map_or((0, 0, 0), |s| (s.moved, s.failed, s.remaining));
        Metrics::set_state(&m.evacuation_gears, "moved", i64::from(moved));
        Metrics::set_state(&m.evacuation_gears, "failed", i64::from(failed));
        Metrics::set_state(&m.evacuation_gears, "remaining", i64::from(remaining));
        self.shared.view.send_replace(view.clone());
        self.published = Some(view);
        self.shared.report_now.notify_one();
    }

    /// Carries out one action; returns the completion to feed back, if any.
    async fn execute(&mut self, a: Action) -> Option<Input> {
        let sh = self.shared.clone();
        match a {
            Action::JournalBegin(e) => {
                let files = self.journal.clone();
                let r = sh.blocking(move || files.write(&e)).await;
                return Some(Input::Journaled(r.map_err(|e| e.to_string())));
            }
            Action::JournalWrite(e) => {
                let files = self.journal.clone();
                if let Err(e) = sh.blocking(move || files.write(&e)).await {
                    tracing::error!(error = %e, "cannot write the command journal");
                }
            }
            Action::JournalForget(ids) => {
                let files = self.journal.clone();
                if let Err(e) = sh.blocking(move || files.remove(&ids)).await {
                    tracing::warn!(error = %e, "cannot prune the journal");
                }
            }
            Action::PersistActive {
                active,
                reason,
                by,
                at,
            } => {
                let r = sh
                    .state_file
                    .update(&sh.tracker, move |st| {
                        if st.active != active {
                            st.active = active;
                            st.changed_at = Some(at);
                            st.reason = reason;
                            st.changed_by = Some(by);
                        }
                    })
                    .await;
                return Some(Input::Persisted(r.map(drop).map_err(|e| e.to_string())));
            }
            Action::PersistEpoch(epoch) => {
                let r = sh
                    .state_file
                    .update(&sh.tracker, move |st| st.epoch = st.epoch.max(epoch))
                    .await;
                return Some(Input::EpochPersisted(
                    r.map(drop).map_err(|e| e.to_string()),
                ));
            }
            Action::PersistRemoved { at } => {
                let r = sh
                    .state_file
                    .update(&sh.tracker, |st| st.removed_at = Some(at))
                    .await;
                if let Err(e) = r {
                    tracing::warn!(error = %e, "cannot note the removal in the state file");
                }
            }
            Action::RuntimeActive(active) => {
                if let Err(e) = sh.runtime.set_active(active).await {
                    tracing::warn!(error = %e, "runtime did not take the new state");
                }
            }
            Action::Scan(scan) => return Some(self.scan(scan).await),
            other => return self.execute_more(other).await,
        }
        None
    }

    async fn execute_more(&mut self, a: Action) -> Option<Input> {
        let sh = self.shared.clone();
        match a {
            Action::LoadPlan(op) => {
                let path = sh.state.checkpoint_path(&op);
                let r = sh.blocking(move || read_json::<Plan>(&path)).await;
                return Some(Input::PlanLoaded(r.map_err(|e| e.to_string())));
            }
            Action::SavePlan { plan, accept } => {
                let r = save_plan(&sh, *plan).await;
                if accept {
                    return Some(Input::PlanSaved(r.map_err(|e| e.to_string())));
                }
                if let Err(e) = r {
                    sh.metrics.checkpoint_errors.inc();
                    tracing::error!(error = %e, "cannot write the evacuation checkpoint (moves go on; they are idempotent)");
                }
            }
            Action::ForgetPlan(op) => {
                let (state, path) = (sh.state.clone(), sh.state.checkpoint_path(&op));
                let _ = sh.blocking(move || state.remove(&path)).await;
            }
            Action::Signal { action, reason } => self.signal(action, reason),
            Action::Emit(e) => self.emit(e),
            Action::Pong { pong, corr, reply } => pong_to(&sh, pong, corr, reply).await,
            Action::Ack { tag, journaled } => return self.ack(tag, journaled).await,
            Action::StartMove(m) => {
                let s = sh.settings();
                let settings = evacuate::Settings {
                    attempts: s.evacuation.attempts,
                    backoff_min: s.evacuation.backoff_min,
                    backoff_max: s.evacuation.backoff_max,
                    grace: sh.limits.shutdown_grace,
                };
                self.mover.start(m, &settings);
            }
            Action::CancelMoves(op) => self.mover.cancel(&op),
            Action::Refused { refusal, broadcast } => {
                super::intake::count_refusal(&sh, &refusal, broadcast)
            }
            Action::Count { kind, outcome } => sh.metrics.command(kind, outcome),
            Action::GearMoved(o) => {
                use gearshift_proto::msg::GearOutcome;
                let state = match o {
                    GearOutcome::Moved => "moved",
                    GearOutcome::AlreadyMoved => "already_moved",
                    GearOutcome::Missing => "missing",
                    GearOutcome::Failed => "failed",
                }
                .to_string();
                sh.metrics
                    .gear_moves
                    .get_or_create(&crate::metrics::StateLabels { state })
                    .inc();
            }
            Action::ReportNow => sh.report_now.notify_one(),
            Action::Removed => {
                sh.removed.store(true, Ordering::SeqCst);
                sh.stop_self.cancel();
            }
            // Handled in `execute`.
            _ => {}
        }
        None
    }

    async fn scan(&mut self, scan: Scan) -> Input {
        let result = match self.shared.runtime.inventory().await {
            Ok(inv) => {
                let gears = inv.gears.clone();
                self.shared.inventory.send_replace(Some(inv));
                Ok(gears)
            }
            Err(e) => Err(ScanError {
                message: e.to_string(),
                retryable: e.is_retryable(),
                cached: self
                    .shared
                    .inventory
                    .borrow()
                    .as_ref()
                    .map(|i| i.gears.len() as u32),
            }),
        };
        Input::Scanned { scan, result }
    }

    fn signal(&self, action: gearshift_proto::msg::HeatAction, reason: String) {
        let signaller = self.shared.settings().signaller.clone();
        let tx = self.tx.clone();
        self.shared.tracker.spawn(async move {
            let r = match signaller {
                Some(s) => s.signal(action, &reason).await,
                None => Err(crate::heat::SignalError::config(
                    "this node has no Heat configuration ([heat] in node.toml)",
                )),
            };
            let _ = tx.send(ToCore::Input(Input::Signalled(r))).await;
        });
    }

    fn emit(&mut self, e: Event) {
        let m = self.shared.event_message(e.msg, e.corr.as_deref());
        match e.confirm {
            None => self.shared.outbox.event(m, e.droppable),
            Some(confirm) => {
                let rx = self.shared.outbox.event_confirmed(m);
                self.confirms
                    .push(async move { (confirm, rx.await.is_ok()) }.boxed());
            }
        }
    }
}

async fn save_plan(sh: &Shared, plan: Plan) -> Result<(), crate::state::StateError> {
    let state = sh.state.clone();
    let path = state.checkpoint_path(&plan.corr);
    sh.blocking(move || state.write(&path, &plan)).await
}

async fn pong_to(
    sh: &Shared,
    pong: gearshift_proto::msg::Pong,
    corr: Option<String>,
    reply: Reply,
) {
    {
        let payload = sh.seal(pong, corr.as_deref());
        let r = match &reply.queue {
            Some(q) => {
                let mut m = OutMessage::new(q.clone(), payload).transient();
                m.correlation_id = reply.correlation_id.clone();
                sh.bus.send_to_queue(q, m).await
            }
            None => {
                let mut m = OutMessage::new(routing::event(&sh.name), payload).transient();
                m.correlation_id = reply.correlation_id.clone();
                sh.bus.publish(m).await
            }
        };
        match r {
            Ok(()) => {
                sh.metrics.pongs.inc();
            }
            Err(e) => tracing::warn!(error = %e, "cannot answer a ping"),
        }
    }
}

impl Driver {
    /// Acknowledges a delivery; a journaled command is then noted as
    /// acknowledged (a later copy of the same id is a replay, not a redelivery).
    async fn ack(&mut self, tag: Tag, journaled: Option<uuid::Uuid>) -> Option<Input> {
        let d = self.deliveries.remove(&tag.0)?;
        match d.ack().await {
            Ok(()) => journaled.map(Input::Acked),
            Err(e) => {
                tracing::warn!(error = %e, "acknowledgement failed; the command will be redelivered");
                None
            }
        }
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
