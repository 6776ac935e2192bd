//! `cmd.deactivate` and `cmd.activate`: the flag is persisted (fsync)
//! before anything else happens, and the delivery is acknowledged after it.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::CommandResult;

use super::{Action, NodeCore, Scan, Wait, done, failed};

/// Why an evacuation stops when the node is re-activated.
pub const REACTIVATED: &str = "node re-activated by cmd.activate";

impl NodeCore {
    pub(super) fn activation(
        &mut self,
        active: bool,
        reason: &str,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_mut() else {
            return;
        };
        let reason = if reason.is_empty() {
            format!("{} from {}", c.env.kind(), c.env.from)
        } else {
            reason.to_string()
        };
        out.push(Action::PersistActive {
            active,
            reason,
            by: c.env.id,
            at: now,
        });
        c.wait = Wait::State { active };
    }

    pub(super) fn on_persisted(
        &mut self,
        _cx: super::Cx<'_>,
        r: Result<(), String>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_deref() else {
            return tracing::warn!("state completion without a command waiting for it");
        };
        let Wait::State { active } = c.wait else {
            return tracing::warn!("state completion without a command waiting for it");
        };
        if let Err(e) = r {
            tracing::error!(error = %e, "cannot persist the node's state");
            let msg = failed(
                &c.env,
                &format!("cannot persist the node's state: {e}"),
                true,
                None,
            );
            self.conclude(msg, out);
            return self.finish(true, out);
        }
        tracing::info!(active, by = %c.env.from, id = %c.env.id,
            "node {}", if active { "activated" } else { "deactivated" });
        let activated = done(&c.env, CommandResult::Activated);
        self.active = active;
        out.push(Action::RuntimeActive(active));
        if active {
            // Re-activation aborts a drain in progress (the scale-down was called off).
            self.abort_evacuations(REACTIVATED, out);
        }
        out.push(Action::ReportNow);
        if active {
            self.conclude(activated, out);
            self.finish(true, out);
        } else if let Some(c) = self.current.as_deref_mut() {
            c.wait = Wait::Scan;
            out.push(Action::Scan(Scan::Deactivated));
        }
    }
}
