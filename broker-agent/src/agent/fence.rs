//! What the agent does when a node refuses its command as from an older
//! leader epoch ([`Action::StaleEpoch`](crate::core::Action::StaleEpoch)).

use super::Agent;
use crate::core::StaleEpoch;

impl Agent {
    /// A node has seen a newer leader epoch than ours: this agent was
    /// deposed (another leads) or is behind. Counted
    /// (`gearshift_broker_stale_epoch_total`; the core logged it). The
    /// leadership machine steps down here: whatever leads must not go on
    /// deciding with an epoch the nodes refuse.
    pub(super) fn on_stale_epoch(&self, s: &StaleEpoch) {
        self.metrics.stale_epoch();
        tracing::debug!(node = %s.node, ours = s.ours, theirs = ?s.theirs, "stale epoch counted");
    }
}
