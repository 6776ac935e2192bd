//! The fencing invariant of the high-availability campaign: no node accepts
//! a command of a deposed leader, i.e. of an epoch older than one it has
//! already accepted a command of.
//!
//! The campaign watches every command (`cmd.#`, which carries the leader's
//! epoch) and every node event (`event.#`) on its own connection. A node's
//! first `event.ack` or `event.done` of a command is its acceptance (quick
//! commands are answered by their done alone; later events of the same
//! command are not counted again); the acceptances of one node arrive in
//! the order it made them (one connection, one publisher), so each must
//! carry an epoch at least the newest that node accepted before. Refusals of
//! stale epochs are counted: they are the fence at work. (The campaign kills
//! broker agents, not nodes, so no command journaled before a newer epoch
//! finishes late here.)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use gearshift_bus::{SharedBus, Subscription};
use gearshift_proto::msg::{Message, STALE_EPOCH};
use gearshift_proto::{Envelope, routing};
use uuid::Uuid;

use super::ChaosReport;
use crate::harness::bus;

/// The watch over commands and acceptances.
pub(super) struct FenceWatch {
    _bus: SharedBus,
    cmds: Subscription,
    events: Subscription,
    /// Each command's epoch, by envelope id.
    epochs: HashMap<Uuid, u64>,
    /// Acceptances whose command was not seen yet (its copy may come later).
    pending: Vec<(String, Uuid)>,
    /// Commands already accepted (a redelivery is acknowledged again).
    accepted: HashSet<Uuid>,
    /// The newest epoch each node accepted.
    newest: BTreeMap<String, u64>,
    acceptances: usize,
    stale_refusals: usize,
    violations: Vec<String>,
}

impl FenceWatch {
    /// Subscribes on a connection of its own.
    pub(super) async fn start(url: &str) -> anyhow::Result<FenceWatch> {
        let b = bus::connect(url, "gearshift-sim chaos fencing").await?;
        Ok(FenceWatch {
            cmds: b.subscribe("cmd.#").await?,
            events: b.subscribe(routing::ALL_EVENTS).await?,
            _bus: b,
            epochs: HashMap::new(),
            pending: vec![],
            accepted: HashSet::new(),
            newest: BTreeMap::new(),
            acceptances: 0,
            stale_refusals: 0,
            violations: vec![],
        })
    }

    /// Takes what arrived and checks it: one check per round.
    pub(super) async fn check(&mut self, round: usize, report: &mut ChaosReport) {
        for e in drain(&mut self.cmds).await {
            if let Some(epoch) = e.msg.epoch() {
                self.epochs.insert(e.id, epoch);
            }
        }
        let mut acks = std::mem::take(&mut self.pending);
        for e in drain(&mut self.events).await {
            match &e.msg {
                Message::Ack(a) => acks.push((e.from.clone(), a.cmd)),
                // A quick command is answered by its done alone.
                Message::Done(d) => acks.push((e.from.clone(), d.cmd)),
                Message::Refused(r) if r.reason == STALE_EPOCH => self.stale_refusals += 1,
                _ => {}
            }
        }
        for (node, cmd) in acks {
            self.accept(node, cmd);
        }
        report.check(
            round,
            "no_deposed_leaders_command_acted_upon",
            self.violations.is_empty(),
            format!(
                "{} acceptances checked, {} stale-epoch refusals, {} not matched yet; violations: {:?}",
                self.acceptances,
                self.stale_refusals,
                self.pending.len(),
                self.violations
            ),
        );
    }

    fn accept(&mut self, node: String, cmd: Uuid) {
        let Some(&epoch) = self.epochs.get(&cmd) else {
            self.pending.push((node, cmd));
            return;
        };
        if !self.accepted.insert(cmd) {
            return;
        }
        self.acceptances += 1;
        let newest = self.newest.entry(node.clone()).or_default();
        if epoch < *newest {
            self.violations.push(format!(
                "{node} accepted {cmd} of epoch {epoch} after epoch {newest}"
            ));
        }
        *newest = (*newest).max(epoch);
    }
}

/// Every message `s` holds now (decoded; undecodable ones are skipped).
async fn drain(s: &mut Subscription) -> Vec<Envelope> {
    let mut out = vec![];
    while let Ok(Some(d)) = s.next_timeout(Duration::from_millis(50)).await {
        if let Ok(e) = Envelope::decode(&d.payload) {
            out.push(e.envelope);
        }
    }
    out
}
