//! Removing exactly one group member, as real Heat 27 does it
//! (`docs/openstack-conformance.md`, points 1 and 4):
//!
//! - AutoScalingGroup: mark the member unhealthy in its nested stack, then
//!   update the stack. A scale-down *signal* after the mark removes the
//!   member **and** the oldest healthy one (Heat sizes from the healthy
//!   members, then drops failed first). A stack update resizes the group to
//!   `desired_capacity` when the template sets one, else to its healthy
//!   members: without `desired_capacity`, `PATCH {"parameters": {}}`
//!   removes exactly the marked member; with one fed by a parameter, the
//!   PATCH sets that parameter to the healthy count; a literal
//!   `desired_capacity` is refused (the member would be replaced, or the
//!   group shrunk to it).
//! - ResourceGroup: `count` - 1 with `removal_policies: [{"resource_list":
//!   [member]}]` (a mark alone makes the next update *replace* the member).
//!
//! Heat does not refuse a PATCH while an update runs (it supersedes it, and
//! a stack update also undoes a running signal scale-up), so the stack, the
//! group's nested stack and its `scaling_in_progress` are checked first.
//! [`plan_removal`] is pure; [`Heat::remove_member`] does the I/O.

use std::time::Duration;

use serde_json::{Value, json};

use super::members::{GroupKind, MemberRef, Resource};
use super::scaling::metadata_flags;
use super::template::{GroupSpec, Size, Template};
use super::{Heat, StackId, ensure_settled};
use crate::error::CloudError;

/// How to remove: the parameter names the caller knows (else the
/// template's), whether to mark first, and the reason Heat records.
#[derive(Debug, Clone, Default)]
pub struct Removal {
    /// The stack parameter feeding a ResourceGroup's `count`.
    pub count_param: Option<String>,
    /// The stack parameter feeding its `removal_policies`.
    pub removal_policies_param: Option<String>,
    /// Mark a ResourceGroup member unhealthy too (AutoScalingGroup members
    /// are always marked: it is how Heat is told which one).
    pub mark_resource_group: bool,
    /// The reason written on the member.
    pub reason: String,
}

/// The update that removes the member.
#[derive(Debug, Clone, PartialEq)]
pub struct RemovalPlan {
    /// The stack PATCH body.
    pub body: Value,
    /// Whether to mark the member unhealthy before the PATCH.
    pub mark: bool,
    /// What it does, for logs and outcomes.
    pub summary: String,
}

fn refused(member: &MemberRef, reason: String) -> CloudError {
    CloudError::Refused {
        what: format!(
            "removing member {} of group {}",
            member.member.resource_name, member.group
        ),
        reason,
    }
}

fn param_of(given: Option<&String>, size: &Size) -> Option<String> {
    given.cloned().or_else(|| size.param().map(str::to_string))
}

/// The PATCH that removes exactly `member` from a group sized by `spec`
/// whose members (all of them, the victim included) are `members`.
pub fn plan_removal(
    member: &MemberRef,
    spec: &GroupSpec,
    members: &[Resource],
    how: &Removal,
) -> Result<RemovalPlan, CloudError> {
    let name = member.member.resource_name.as_str();
    match spec.kind {
        GroupKind::ResourceGroup => {
            let (Some(count), Some(policies)) = (
                param_of(how.count_param.as_ref(), &spec.count),
                param_of(how.removal_policies_param.as_ref(), &spec.removal_policies),
            ) else {
                return Err(refused(member, "a ResourceGroup removes a chosen member only through removal_policies: the template must take `count` and `removal_policies` from stack parameters".into()));
            };
            let n = spec.count.value().unwrap_or(members.len() as i64);
            Ok(RemovalPlan {
                body: json!({"parameters": {
                    count.clone(): (n - 1).max(0),
                    policies: [{"resource_list": [name]}],
                }}),
                mark: how.mark_resource_group,
                summary: format!("{count} {n} -> {} removing member {name}", (n - 1).max(0)),
            })
        }
        GroupKind::AutoScalingGroup => {
            let healthy = members
                .iter()
                .filter(|m| !m.is_failed() && m.resource_name != name)
                .count() as i64;
            if let Some(min) = spec.min_size.value()
                && healthy < min
            {
                return Err(refused(
                    member,
                    format!(
                        "the group would fall below its min_size {min}: Heat would replace the member instead"
                    ),
                ));
            }
            let body = match &spec.desired {
                Size::Absent => json!({"parameters": {}}),
                Size::Param { name: p, .. } => json!({"parameters": {p.clone(): healthy}}),
                Size::Literal(_) | Size::Unknown => {
                    return Err(refused(member, "the AutoScalingGroup's desired_capacity is fixed in the template: every stack update resizes the group to it, so a marked member would be replaced (or other members removed). Take desired_capacity from a stack parameter, or drop it".into()));
                }
            };
            Ok(RemovalPlan {
                summary: format!(
                    "marked member {name} unhealthy; stack update to {healthy} healthy members"
                ),
                body,
                mark: true,
            })
        }
    }
}

/// What a removal did.
#[derive(Debug, Clone, PartialEq)]
pub struct RemovalOutcome {
    /// The plan that ran (`None`: the member was already gone).
    pub plan: Option<RemovalPlan>,
    /// The members before, oldest first.
    pub before: Vec<String>,
    /// The members after the update (when waited for).
    pub after: Option<Vec<String>>,
}

impl Heat {
    /// Removes exactly `member`: checks the stack and the group are settled
    /// and not scaling, plans from the template, marks, PATCHes the stack
    /// that declares the group and, with `wait` (timeout, poll), waits for
    /// the update and checks that only the member went. Without `wait` it
    /// returns after Heat's 202 (a node removing itself).
    pub async fn remove_member(
        &self,
        member: &MemberRef,
        how: &Removal,
        wait: Option<(Duration, Duration)>,
    ) -> Result<RemovalOutcome, CloudError> {
        let top = self.get_stack(&member.group_stack.to_string()).await?;
        ensure_settled(&top)?;
        ensure_settled(&self.get_stack(&member.nested.to_string()).await?)?;
        if member.kind == GroupKind::AutoScalingGroup {
            let meta = self
                .resource_metadata(&member.group_stack, &member.group)
                .await?;
            if metadata_flags(&meta).0 {
                return Err(CloudError::Busy {
                    what: format!("group {} of stack {}", member.group, member.group_stack),
                    state: "scaling_in_progress".into(),
                });
            }
        }
        let template = self.get_template(&member.group_stack).await?;
        let mut spec = Template::new(&template, &top.parameters).group(&member.group)?;
        if let Some(p) = &how.count_param {
            spec.count = Size::Param {
                name: p.clone(),
                value: top.int_param(p),
            };
        }
        let members = self.members(&member.nested).await?;
        let before: Vec<String> = members.iter().map(|m| m.resource_name.clone()).collect();
        let name = member.member.resource_name.as_str();
        if !before.iter().any(|n| n == name) {
            return Ok(RemovalOutcome {
                plan: None,
                before,
                after: None,
            });
        }
        let plan = plan_removal(member, &spec, &members, how)?;
        if plan.mark {
            match self.mark_unhealthy(&member.nested, name, &how.reason).await {
                Err(e) if e.is_resource_not_found() => {
                    return Ok(RemovalOutcome {
                        plan: None,
                        before,
                        after: None,
                    });
                }
                other => drop(other?),
            }
        }
        self.patch_stack(&member.group_stack, &plan.body).await?;
        let Some((timeout, poll)) = wait else {
            return Ok(RemovalOutcome {
                plan: Some(plan),
                before,
                after: None,
            });
        };
        self.wait_update(
            &member.group_stack,
            top.updated_time.as_deref(),
            timeout,
            poll,
        )
        .await?;
        let after: Vec<String> = self
            .members(&member.nested)
            .await?
            .into_iter()
            .map(|m| m.resource_name)
            .collect();
        check_only_victim_went(member, &before, &after)?;
        Ok(RemovalOutcome {
            plan: Some(plan),
            before,
            after: Some(after),
        })
    }

    /// The members of a group's nested stack, oldest first.
    pub async fn members(&self, nested: &StackId) -> Result<Vec<Resource>, CloudError> {
        let mut m = self.list_resources(nested, 0).await?;
        m.sort_by(super::members::oldest_first);
        Ok(m)
    }
}

/// After the update: the victim gone, every other member still there.
fn check_only_victim_went(
    member: &MemberRef,
    before: &[String],
    after: &[String],
) -> Result<(), CloudError> {
    let name = &member.member.resource_name;
    let lost: Vec<&String> = before
        .iter()
        .filter(|n| *n != name && !after.contains(n))
        .collect();
    if after.contains(name) || !lost.is_empty() {
        return Err(CloudError::Failed {
            what: format!("group {} of stack {}", member.group, member.group_stack),
            state: "UPDATE_COMPLETE".into(),
            reason: format!("removing {name}: members before {before:?}, after {after:?}"),
            quota: false,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn member(kind: GroupKind, name: &str) -> MemberRef {
        MemberRef {
            group: "g".into(),
            kind,
            group_stack: StackId::parse("s/1").unwrap(),
            nested: StackId::parse("s-g-x/2").unwrap(),
            member: serde_json::from_value(json!({"resource_name": name})).unwrap(),
        }
    }

    fn members(names: &[&str]) -> Vec<Resource> {
        names
            .iter()
            .map(|n| {
                serde_json::from_value(
                    json!({"resource_name": n, "resource_status": "CREATE_COMPLETE"}),
                )
                .unwrap()
            })
            .collect()
    }

    fn spec(kind: GroupKind, desired: Size) -> GroupSpec {
        GroupSpec {
            kind,
            min_size: Size::Literal(1),
            max_size: Size::Absent,
            desired,
            count: Size::Param {
                name: "count".into(),
                value: Some(3),
            },
            removal_policies: Size::Param {
                name: "removal_policies".into(),
                value: None,
            },
        }
    }

    #[test]
    fn autoscaling_group_plans_follow_desired_capacity() {
        let m = member(GroupKind::AutoScalingGroup, "b");
        let ms = members(&["a", "b", "c"]);
        let how = Removal::default();
        let p = plan_removal(
            &m,
            &spec(GroupKind::AutoScalingGroup, Size::Absent),
            &ms,
            &how,
        )
        .unwrap();
        assert_eq!((p.body, p.mark), (json!({"parameters": {}}), true));
        let with = Size::Param {
            name: "asg_desired".into(),
            value: Some(3),
        };
        let p = plan_removal(&m, &spec(GroupKind::AutoScalingGroup, with), &ms, &how).unwrap();
        assert_eq!(p.body, json!({"parameters": {"asg_desired": 2}}));
        let e = plan_removal(
            &m,
            &spec(GroupKind::AutoScalingGroup, Size::Literal(3)),
            &ms,
            &how,
        )
        .unwrap_err();
        assert!(
            matches!(e, CloudError::Refused { .. }) && !e.is_retryable(),
            "{e}"
        );
        let e = plan_removal(
            &m,
            &spec(GroupKind::AutoScalingGroup, Size::Absent),
            &members(&["b"]),
            &how,
        )
        .unwrap_err();
        assert!(e.to_string().contains("min_size 1"), "{e}");
    }

    #[test]
    fn resource_group_plans_use_removal_policies() {
        let m = member(GroupKind::ResourceGroup, "1");
        let ms = members(&["0", "1", "2"]);
        let p = plan_removal(
            &m,
            &spec(GroupKind::ResourceGroup, Size::Absent),
            &ms,
            &Removal::default(),
        )
        .unwrap();
        assert_eq!(
            p.body,
            json!({"parameters": {"count": 2, "removal_policies": [{"resource_list": ["1"]}]}})
        );
        assert!(!p.mark);
        let mut fixed = spec(GroupKind::ResourceGroup, Size::Absent);
        fixed.removal_policies = Size::Unknown;
        assert!(plan_removal(&m, &fixed, &ms, &Removal::default()).is_err());
        let how = Removal {
            count_param: Some("n".into()),
            removal_policies_param: Some("rp".into()),
            mark_resource_group: true,
            reason: String::new(),
        };
        let p = plan_removal(&m, &fixed, &ms, &how).unwrap();
        assert_eq!(
            (p.body, p.mark),
            (
                json!({"parameters": {"n": 2, "rp": [{"resource_list": ["1"]}]}}),
                true
            )
        );
    }

    #[test]
    fn only_the_victim_may_go() {
        let m = member(GroupKind::AutoScalingGroup, "b");
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(check_only_victim_went(&m, &s(&["a", "b", "c"]), &s(&["a", "c"])).is_ok());
        assert!(
            check_only_victim_went(&m, &s(&["a", "b", "c"]), &s(&["c"])).is_err(),
            "two went"
        );
        assert!(check_only_victim_went(&m, &s(&["a", "b", "c"]), &s(&["a", "b", "c"])).is_err());
    }
}
