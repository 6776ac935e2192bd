//! `cmd.remove` (the node is inactive and empty: run the removal action,
//! publish the result, then stop) and `cmd.heat_signal`.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{CommandResult, GearInfo, HeatAction};

use super::{Action, Confirm, Cx, NodeCore, Scan, ScanError, Wait, done, failed};
use crate::heat::{SignalError, SignalOutcome, is_idempotent};

impl NodeCore {
    /// Whether the current command was accepted by an earlier process.
    fn accepted_before_restart(&self, cx: Cx<'_>) -> bool {
        self.current
            .as_deref()
            .and_then(|c| c.entry.as_ref())
            .is_some_and(|e| e.boot != cx.config.boot)
    }

    /// Concludes the current journaled command with `event.failed` and acknowledges it.
    fn fail(
        &mut self,
        error: &str,
        retryable: bool,
        http_status: Option<u16>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_deref() else {
            return;
        };
        let msg = failed(&c.env, error, retryable, http_status);
        self.conclude(msg, out);
        self.finish(true, out);
    }

    fn wait(&mut self, wait: Wait) {
        if let Some(c) = self.current.as_deref_mut() {
            c.wait = wait;
        }
    }

    pub(super) fn remove_command(&mut self, out: &mut Vec<Action>) {
        if self.active {
            return self.fail(
                "the node is active: deactivate and evacuate it first",
                true,
                None,
                out,
            );
        }
        out.push(Action::Scan(Scan::Remove));
        self.wait(Wait::Scan);
    }

    pub(super) fn remove_scanned(
        &mut self,
        cx: Cx<'_>,
        result: Result<Vec<GearInfo>, ScanError>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        match result {
            Ok(gears) if !gears.is_empty() => {
                let n = gears.len();
                return self.fail(&format!("{n} gears are still on the node"), true, None, out);
            }
            Ok(_) => {}
            Err(e) => {
                let error = format!("cannot check that the node is empty: {}", e.message);
                return self.fail(&error, true, None, out);
            }
        }
        let action = cx.config.remove_action;
        if self.accepted_before_restart(cx) && action.is_some_and(|a| !is_idempotent(a)) {
            return self.fail(
                "the agent restarted while this removal's Heat signal was in flight; it is not sent again \
                 (it could scale twice): check the stack, then send a new cmd.remove",
                false,
                None,
                out,
            );
        }
        self.accepted(out);
        let reason = match self.current.as_deref().map(|c| &c.env.msg) {
            Some(gearshift_proto::msg::Message::Remove(r)) if !r.reason.is_empty() => {
                r.reason.clone()
            }
            _ => format!("gearshift: node {} removed (empty and inactive)", cx.name),
        };
        match action {
            None => self.removed_by(
                "none".into(),
                "no removal action configured; the node stops".into(),
                now,
                out,
            ),
            Some(a) if cx.config.heat => {
                out.push(Action::Signal { action: a, reason });
                self.wait(Wait::Signal {
                    removal: true,
                    action: a,
                });
            }
            Some(a) => {
                let e = SignalError::config(format!(
                    "remove_action {} needs Heat credentials, and none are configured",
                    a.as_str()
                ));
                tracing::error!(error = %e, "removal action failed");
                self.fail(&e.message, e.retryable, e.http_status, out)
            }
        }
    }

    /// The removal action succeeded: note it, publish the result and wait
    /// until the bus has it before acknowledging and stopping.
    fn removed_by(
        &mut self,
        action: String,
        detail: String,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_deref() else {
            return;
        };
        out.push(Action::PersistRemoved { at: now });
        tracing::info!(%action, %detail, "node removed; the agent stops");
        let msg = done(
            &c.env,
            CommandResult::Removed {
                action,
                detail: gearshift_proto::gate::clip(&detail),
            },
        );
        self.conclude_with(msg, Some(Confirm::Remove), out);
        self.wait(Wait::Confirm);
        if self.stopping {
            self.on_confirmed(Confirm::Remove, false, out);
        }
    }

    pub(super) fn heat_command(
        &mut self,
        cx: Cx<'_>,
        action: HeatAction,
        reason: &str,
        out: &mut Vec<Action>,
    ) {
        if self.accepted_before_restart(cx) && !is_idempotent(action) {
            return self.fail(
                "the agent restarted while this Heat signal was in flight; it is not sent again \
                 (it could scale twice): check the stack, then send a new command",
                false,
                None,
                out,
            );
        }
        if !cx.config.heat {
            return self.fail(
                "this node has no Heat configuration ([heat] in node.toml)",
                false,
                None,
                out,
            );
        }
        self.accepted(out);
        let reason = if reason.is_empty() {
            format!("gearshift {} from node {}", action.as_str(), cx.name)
        } else {
            reason.to_string()
        };
        out.push(Action::Signal { action, reason });
        self.wait(Wait::Signal {
            removal: false,
            action,
        });
    }

    pub(super) fn on_signalled(
        &mut self,
        r: Result<SignalOutcome, SignalError>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_deref() else {
            return tracing::warn!("Heat signal result without a command waiting for it");
        };
        let Wait::Signal { removal, action } = c.wait else {
            return tracing::warn!("Heat signal result without a command waiting for it");
        };
        match (r, removal) {
            (Ok(o), true) => self.removed_by(
                format!("heat:{}", action.as_str()),
                format!("HTTP {}: {}", o.status, o.detail),
                now,
                out,
            ),
            (Ok(o), false) => {
                tracing::info!(
                    action = action.as_str(),
                    status = o.status,
                    "Heat signal sent"
                );
                let msg = done(
                    &c.env,
                    CommandResult::HeatSignalled {
                        action,
                        status: o.status,
                        detail: gearshift_proto::gate::clip(&o.detail),
                    },
                );
                self.conclude(msg, out);
                self.finish(true, out);
            }
            (Err(e), removal) => {
                if removal {
                    tracing::error!(error = %e, http_status = ?e.http_status, "removal action failed");
                } else {
                    tracing::error!(action = action.as_str(), error = %e, http_status = ?e.http_status, "Heat signal failed");
                }
                self.fail(&e.message, e.retryable, e.http_status, out);
            }
        }
    }

    pub(super) fn on_confirmed(&mut self, confirm: Confirm, ok: bool, out: &mut Vec<Action>) {
        match confirm {
            Confirm::Evacuated(op) => self.evacuation_confirmed(&op, ok, out),
            Confirm::Remove => {
                if !self
                    .current
                    .as_deref()
                    .is_some_and(|c| matches!(c.wait, Wait::Confirm))
                {
                    return;
                }
                // Acknowledged only once the result is on the bus (or the agent stops).
                self.finish(true, out);
                self.removed = true;
                out.push(Action::Removed);
            }
        }
    }
}
