//! Scaling signals, checked before they are sent and confirmed after.
//!
//! Heat answers a policy signal (native, `signal_url` or pre-signed
//! `alarm_url`) with 200 *before* it does anything, handles it in the
//! engine seconds later, and silently ignores it (no event, 200 all the
//! same) while the group is scaling, in its cooldown, at `max_size` /
//! `min_size`, or not `COMPLETE`. Measured on Heat 27 (one signal, members
//! taking 6 s): group metadata `scaling_in_progress: true` at 1.8 s, the
//! nested stack `UPDATE_IN_PROGRESS` at 6.9 s and `UPDATE_COMPLETE` at
//! 15.4 s, then `scaling_in_progress: false` and the policy's
//! `SIGNAL_COMPLETE` event at 16.0 s. So:
//!
//! - [`check_signal`] (pure) refuses what Heat would ignore, from the
//!   group's state (metadata, members) and the template's sizes;
//! - [`progress`] (pure) compares the group before and after: a new policy
//!   `SIGNAL` event means done; `scaling_in_progress` or a new nested
//!   `updated_time` means started; nothing within a bound means ignored;
//! - [`Heat::prepare_signal`] and [`Heat::confirm_signal`] do the I/O.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::Value;

use super::members::{GroupKind, Resource};
use super::template::{GroupSpec, PolicySpec, Template};
use super::{Heat, Stack, StackId, ensure_settled};
use crate::error::{CloudError, Ignored, bounded, heat_reason_names_quota};

/// The signal body gearshift sends: Aodh's shape, the only object Heat
/// turns into a readable policy event ("alarm state changed from ok to
/// alarm (`<reason>`)"; any other object is recorded as "Unknown"). The
/// policy scales whatever the states say.
pub fn signal_details(reason: &str) -> Value {
    serde_json::json!({ "previous": "ok", "current": "alarm", "reason": reason })
}

/// A scaling policy and the group it scales.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalTarget {
    /// The stack declaring both.
    pub stack: StackId,
    /// The group resource.
    pub group: String,
    /// The policy resource.
    pub policy: String,
}

impl std::fmt::Display for SignalTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group {} of stack {} (policy {})",
            self.group, self.stack, self.policy
        )
    }
}

/// The group as one look at Heat finds it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupState {
    /// The group's nested stack.
    pub nested: Stack,
    /// Its members, oldest first.
    pub members: Vec<Resource>,
    /// Group metadata `scaling_in_progress`.
    pub scaling_in_progress: bool,
    /// Group metadata `cooldown_end` (Heat's naive UTC ISO time), if any.
    pub cooldown_end: Option<String>,
    /// The policy's newest `SIGNAL` event: (id, status, reason).
    pub last_signal: Option<(String, String, String)>,
}

impl GroupState {
    /// The size Heat scales from: members not `*_FAILED`.
    pub fn size(&self) -> i64 {
        self.members.iter().filter(|m| !m.is_failed()).count() as i64
    }

    /// The member names, oldest first.
    pub fn names(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.resource_name.clone())
            .collect()
    }

    /// The cooldown end, when it is after `now`.
    pub fn cooling_until(&self, now: DateTime<Utc>) -> Option<&str> {
        let end = self.cooldown_end.as_deref()?;
        let t = NaiveDateTime::parse_from_str(end, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
        (t > now.naive_utc()).then_some(end)
    }
}

/// Reads `scaling_in_progress` and `cooldown_end` from a group's metadata
/// (`{"cooldown_end": {"<time>": "<reason>"}, "scaling_in_progress": false}`).
pub fn metadata_flags(metadata: &Value) -> (bool, Option<String>) {
    let scaling = metadata
        .get("scaling_in_progress")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let end = metadata
        .get("cooldown_end")
        .and_then(Value::as_object)
        .and_then(|o| o.keys().next().cloned());
    (scaling, end)
}

/// What Heat would do with the signal now: `Ok` when it would act, else
/// the [`CloudError::SignalIgnored`] saying why.
pub fn check_signal(
    target: &SignalTarget,
    group: &GroupSpec,
    policy: &PolicySpec,
    state: &GroupState,
    now: DateTime<Utc>,
) -> Result<(), CloudError> {
    let ignored = |why| {
        Err(CloudError::SignalIgnored {
            what: target.to_string(),
            why,
        })
    };
    if state.scaling_in_progress {
        return ignored(Ignored::Scaling);
    }
    if let Some(until) = state.cooling_until(now) {
        return ignored(Ignored::Cooldown {
            until: until.to_string(),
        });
    }
    match (
        policy.direction(),
        group.max_size.value(),
        group.min_size.value(),
    ) {
        (1, Some(max), _) if state.size() >= max => ignored(Ignored::AtMax { max }),
        (-1, _, Some(min)) if state.size() <= min => ignored(Ignored::AtMin { min }),
        _ => Ok(()),
    }
}

/// How far a signal got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// No sign of it yet.
    NotStarted,
    /// The group is scaling.
    Started,
    /// The policy wrote its `SIGNAL` event: the resize is over.
    Done,
    /// The group's update failed, with Heat's reason.
    Failed(String),
}

/// Compares the group before the signal with the group now.
pub fn progress(before: &GroupState, now: &GroupState) -> Progress {
    let updated = now.nested.updated_time != before.nested.updated_time;
    if updated && now.nested.state() == "FAILED" {
        return Progress::Failed(now.nested.stack_status_reason.clone().unwrap_or_default());
    }
    let new_event = now.last_signal.is_some()
        && now.last_signal.as_ref().map(|e| &e.0) != before.last_signal.as_ref().map(|e| &e.0);
    // Heat clears `scaling_in_progress` just before it writes the event.
    let settled_again = updated && !now.scaling_in_progress && now.nested.state() == "COMPLETE";
    if new_event || settled_again {
        return Progress::Done;
    }
    if now.scaling_in_progress || updated {
        Progress::Started
    } else {
        Progress::NotStarted
    }
}

/// A signal ready to send: the group's sizing and its state before.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The group's sizing.
    pub group: GroupSpec,
    /// The policy.
    pub policy: PolicySpec,
    /// The group's nested stack.
    pub nested: StackId,
    /// The group before the signal.
    pub before: GroupState,
}

impl Heat {
    /// The group's nested stack, from the declaring stack's listing.
    pub async fn group_stack(&self, stack: &StackId, group: &str) -> Result<StackId, CloudError> {
        let resources = self.list_resources(stack, 0).await?;
        let g = resources
            .iter()
            .find(|r| r.resource_name == group)
            .ok_or_else(|| {
                CloudError::Config(format!("stack {stack} has no resource {group:?}"))
            })?;
        if GroupKind::of_type(&g.resource_type).is_none() {
            return Err(CloudError::Config(format!(
                "resource {group:?} of stack {stack} is a {}, not a group",
                g.resource_type
            )));
        }
        if let Some(n) = g.nested_stack() {
            return Ok(n);
        }
        if g.physical_resource_id.is_empty() {
            return Err(CloudError::Config(format!(
                "group {group} of stack {stack} has no nested stack yet"
            )));
        }
        Ok(self.get_stack(&g.physical_resource_id).await?.stack_id())
    }

    /// The target of a signal to `policy` of `stack`: the group is the one
    /// the template's policy names. `None` when `policy` is not a scaling
    /// policy (a wait condition, ...): such a signal cannot be confirmed.
    pub async fn signal_target(
        &self,
        stack: &StackId,
        policy: &str,
    ) -> Result<Option<SignalTarget>, CloudError> {
        let top = self.get_stack(&stack.to_string()).await?;
        let template = self.get_template(&top.stack_id()).await?;
        let group = Template::new(&template, &top.parameters).policy_group(policy);
        Ok(group.map(|group| SignalTarget {
            stack: top.stack_id(),
            group,
            policy: policy.to_string(),
        }))
    }

    /// One look at the group (4 requests: nested stack, its resources, the
    /// group's metadata, the policy's newest `SIGNAL` event).
    pub async fn group_state(
        &self,
        target: &SignalTarget,
        nested: &StackId,
    ) -> Result<GroupState, CloudError> {
        let stack = self.get_stack(&nested.to_string()).await?;
        let mut members = self.list_resources(nested, 0).await?;
        members.sort_by(super::members::oldest_first);
        let meta = self.resource_metadata(&target.stack, &target.group).await?;
        let (scaling_in_progress, cooldown_end) = metadata_flags(&meta);
        let last_signal = self
            .signal_events(&target.stack, &target.policy, 1)
            .await?
            .into_iter()
            .next()
            .map(|e| {
                (
                    e.id,
                    e.resource_status,
                    e.resource_status_reason.unwrap_or_default(),
                )
            });
        Ok(GroupState {
            nested: stack,
            members,
            scaling_in_progress,
            cooldown_end,
            last_signal,
        })
    }

    /// Checks that Heat will act on a signal of `target` now: the group's
    /// nested stack settled, not scaling, out of its cooldown, not at the
    /// size limit the policy would cross. The caller sends the signal next.
    pub async fn prepare_signal(&self, target: &SignalTarget) -> Result<Prepared, CloudError> {
        let top = self.get_stack(&target.stack.to_string()).await?;
        ensure_settled(&top)?;
        let template = self.get_template(&target.stack).await?;
        let tpl = Template::new(&template, &top.parameters);
        let group = tpl.group(&target.group)?;
        let policy = tpl.policy(&target.policy)?;
        let nested = self.group_stack(&target.stack, &target.group).await?;
        let before = self.group_state(target, &nested).await?;
        ensure_settled(&before.nested)?;
        check_signal(target, &group, &policy, &before, Utc::now())?;
        Ok(Prepared {
            group,
            policy,
            nested,
            before,
        })
    }

    /// Watches the group after a signal: it must start within `start`
    /// (else [`CloudError::SignalIgnored`], with the reason the group's
    /// state then gives); with `done`, also wait that long for the policy's
    /// event (the resize finished) and return the group then. A failed
    /// group update is [`CloudError::Failed`].
    pub async fn confirm_signal(
        &self,
        target: &SignalTarget,
        prepared: &Prepared,
        start: Duration,
        done: Option<Duration>,
        poll: Duration,
    ) -> Result<GroupState, CloudError> {
        let t0 = tokio::time::Instant::now();
        let mut started = false;
        loop {
            let now = self.group_state(target, &prepared.nested).await?;
            match progress(&prepared.before, &now) {
                Progress::Done => return Ok(now),
                Progress::Failed(reason) => {
                    return Err(CloudError::Failed {
                        what: target.to_string(),
                        state: now.nested.stack_status.clone(),
                        quota: heat_reason_names_quota(&reason),
                        reason: bounded(&reason),
                    });
                }
                Progress::Started if done.is_none() => return Ok(now),
                Progress::Started => started = true,
                Progress::NotStarted if !started && t0.elapsed() >= start => {
                    let why = match check_signal(
                        target,
                        &prepared.group,
                        &prepared.policy,
                        &now,
                        Utc::now(),
                    ) {
                        Err(CloudError::SignalIgnored { why, .. }) => why,
                        _ => Ignored::Unexplained { waited: start },
                    };
                    return Err(CloudError::SignalIgnored {
                        what: target.to_string(),
                        why,
                    });
                }
                Progress::NotStarted => {}
            }
            if let Some(d) = done
                && t0.elapsed() >= d
            {
                return Err(CloudError::Timeout {
                    what: format!("{target} to finish scaling"),
                    waited: d,
                    last_state: now.nested.stack_status,
                });
            }
            tokio::time::sleep(poll).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heat::template::Size;
    use serde_json::json;

    fn state(
        members: &[(&str, &str)],
        updated: Option<&str>,
        meta: Value,
        event: Option<&str>,
    ) -> GroupState {
        let (scaling_in_progress, cooldown_end) = metadata_flags(&meta);
        GroupState {
            nested: serde_json::from_value(json!({"id": "n1", "stack_name": "s-asg-x", "stack_status": "UPDATE_COMPLETE", "updated_time": updated})).unwrap(),
            members: members
                .iter()
                .map(|(n, st)| serde_json::from_value(json!({"resource_name": n, "resource_status": st})).unwrap())
                .collect(),
            scaling_in_progress,
            cooldown_end,
            last_signal: event.map(|e| (e.to_string(), "SIGNAL_COMPLETE".into(), "Unknown".into())),
        }
    }

    fn target() -> SignalTarget {
        SignalTarget {
            stack: StackId::parse("s/1").unwrap(),
            group: "asg".into(),
            policy: "scale_up".into(),
        }
    }

    fn specs(direction: i64) -> (GroupSpec, PolicySpec) {
        let g = GroupSpec {
            kind: GroupKind::AutoScalingGroup,
            min_size: Size::Literal(1),
            max_size: Size::Param {
                name: "asg_max".into(),
                value: Some(3),
            },
            desired: Size::Absent,
            count: Size::Absent,
            removal_policies: Size::Absent,
        };
        let p = PolicySpec {
            group: Some("asg".into()),
            adjustment: Size::Literal(direction),
            adjustment_type: "changeincapacity".into(),
            cooldown: Size::Literal(0),
        };
        (g, p)
    }

    #[test]
    fn what_heat_ignores_is_refused_before_signalling() {
        let now: DateTime<Utc> = "2026-11-25T13:37:20Z".parse().unwrap();
        let ok =
            |s: &GroupState, dir| check_signal(&target(), &specs(dir).0, &specs(dir).1, s, now);
        let meta = json!({"cooldown_end": {"2026-11-25T13:37:25.304176": "change_in_capacity : 1"}, "scaling_in_progress": false});
        let two = [("a", "CREATE_COMPLETE"), ("b", "CREATE_COMPLETE")];
        let e = ok(&state(&two, None, meta, None), 1).unwrap_err();
        assert!(
            e.is_busy()
                && e.to_string()
                    .contains("cooldown until 2026-11-25T13:37:25.304176"),
            "{e}"
        );
        let past =
            json!({"cooldown_end": {"2026-11-25T13:37:05.1": "x"}, "scaling_in_progress": false});
        assert!(ok(&state(&two, None, past.clone(), None), 1).is_ok());
        let busy = json!({"scaling_in_progress": true});
        assert!(ok(&state(&two, None, busy, None), 1).unwrap_err().is_busy());
        let three = [
            ("a", "CREATE_COMPLETE"),
            ("b", "CHECK_FAILED"),
            ("c", "CREATE_COMPLETE"),
            ("d", "CREATE_COMPLETE"),
        ];
        let e = ok(&state(&three, None, past.clone(), None), 1).unwrap_err();
        assert!(e.is_quota(), "3 healthy members at max_size 3: {e}");
        let one = [("a", "CREATE_COMPLETE")];
        assert!(
            !ok(&state(&one, None, past.clone(), None), -1)
                .unwrap_err()
                .is_retryable()
        );
        assert!(ok(&state(&one, None, past, None), 1).is_ok());
    }

    #[test]
    fn progress_reads_metadata_updates_and_events() {
        let m = [("a", "CREATE_COMPLETE")];
        let before = state(&m, Some("t1"), json!({}), Some("e1"));
        assert_eq!(progress(&before, &before.clone()), Progress::NotStarted);
        assert_eq!(
            progress(
                &before,
                &state(
                    &m,
                    Some("t1"),
                    json!({"scaling_in_progress": true}),
                    Some("e1")
                )
            ),
            Progress::Started
        );
        let mut updating = state(&m, Some("t2"), json!({}), Some("e1"));
        updating.nested.stack_status = "UPDATE_IN_PROGRESS".into();
        assert_eq!(progress(&before, &updating), Progress::Started);
        assert_eq!(
            progress(
                &before,
                &state(
                    &m,
                    Some("t2"),
                    json!({"scaling_in_progress": true}),
                    Some("e1")
                )
            ),
            Progress::Started
        );
        assert_eq!(
            progress(&before, &state(&m, Some("t2"), json!({}), Some("e1"))),
            Progress::Done
        );
        assert_eq!(
            progress(&before, &state(&m, Some("t2"), json!({}), Some("e2"))),
            Progress::Done
        );
        let first = state(&m, None, json!({}), None);
        assert_eq!(
            progress(&first, &state(&m, None, json!({}), Some("e1"))),
            Progress::Done
        );
        let mut failed = state(&m, Some("t2"), json!({}), Some("e1"));
        failed.nested.stack_status = "UPDATE_FAILED".into();
        failed.nested.stack_status_reason = Some("Quota exceeded for instances".into());
        assert_eq!(
            progress(&before, &failed),
            Progress::Failed("Quota exceeded for instances".into())
        );
    }
}
