//! The `heat` handler: node hosts are members of a Heat stack's group
//! (`OS::Heat::ResourceGroup` or `OS::Heat::AutoScalingGroup`). Every step
//! follows what real Heat 27 does (`docs/openstack-conformance.md`).
//!
//! ## Add a node
//! - `scale_up = "signal"` (default): check that Heat will act (the stack
//!   and the group settled, the group's metadata neither
//!   `scaling_in_progress` nor in its cooldown, below `max_size`), signal
//!   the scale-up policy (its pre-signed `scale_up_alarm_url`, or the
//!   policy's signal API with a token), then watch the group: Heat answers
//!   200 to every signal and ignores some without a trace, so the signal
//!   must *start* something within `signal_timeout` (else
//!   [`gearshift_cloud::CloudError::SignalIgnored`]) and end with the
//!   policy's `SIGNAL` event within `update_timeout`.
//! - `scale_up = "count"`: PATCH the stack with `count_param` + 1 (and
//!   `op_param` = the operation id, when set, after Heat's update preview
//!   showed that no existing member would be replaced) and wait for the
//!   stack's `UPDATE_COMPLETE`.
//!
//! ## Remove exactly this node
//! The node's server (its `cloud_id`, else the Nova server named after the
//! host) is found among the group's members (`GET .../resources?nested_depth=2`,
//! by physical id), then [`gearshift_cloud::heat::removal`] removes it:
//! ResourceGroup `count` - 1 with `removal_policies`; AutoScalingGroup:
//! mark unhealthy, then the stack update that drops exactly it. The
//! members after the update are checked: only the victim went.
//!
//! ## Concurrency and refusals
//! Heat does not refuse a PATCH while an update runs (the new update
//! supersedes it; a count read twice loses a scale-up), so one handler runs
//! one call on its stack at a time and checks the stack and the group are
//! settled before each. A stack (or group) `*_IN_PROGRESS` is
//! [`HandlerError::Busy`]; `*_FAILED` is refused with its reason
//! ([`HandlerError::Quota`] when the reason names a quota, else
//! [`HandlerError::Permanent`]: an operator must look). An update that ends
//! `UPDATE_FAILED` is mapped the same way.

use async_trait::async_trait;
use gearshift_cloud::heat::members::{MemberKey, find_member};
use gearshift_cloud::heat::removal::Removal;
use gearshift_cloud::heat::scaling::{SignalTarget, signal_details};
use gearshift_cloud::heat::{Heat, Stack, StackId, ensure_settled, post_alarm_url};
use gearshift_cloud::nova::Nova;
use serde_json::{Value, json};

use crate::cloud::{resolve_server, to_handler_error};
use crate::config::{HeatConfig, HeatRemove, HeatScaleUp};
use crate::{
    BuildError, Capacity, CreateOutcome, CreateRequest, GroupKey, Handler, HandlerError, NodeShape,
    Presence, RemoveOutcome, RemoveRequest,
};

/// Scales a Heat stack's group.
#[derive(Debug)]
pub struct HeatHandler {
    cfg: HeatConfig,
    heat: Heat,
    nova: Nova,
    /// One call on the stack at a time: two count reads before either
    /// PATCH would lose a scale-up (Heat lets the second update replace the
    /// first).
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl HeatHandler {
    /// Reads the credentials; connects on first use.
    pub fn new(cfg: HeatConfig) -> Result<Self, BuildError> {
        cfg.validate()?;
        let session = crate::cloud::session(&cfg.auth)?;
        Ok(Self::with_session(cfg, session))
    }

    /// A handler on an existing session.
    pub fn with_session(cfg: HeatConfig, session: gearshift_cloud::Session) -> Self {
        HeatHandler {
            heat: Heat::new(session.clone()),
            nova: Nova::new(session),
            cfg,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    async fn settled_stack(&self) -> Result<Stack, HandlerError> {
        let s = self
            .heat
            .get_stack(&self.cfg.stack)
            .await
            .map_err(to_handler_error)?;
        ensure_settled(&s).map_err(to_handler_error)?;
        Ok(s)
    }

    /// The group's nested stack, settled.
    async fn settled_group(&self, top: &StackId) -> Result<StackId, HandlerError> {
        let nested = self
            .heat
            .group_stack(top, &self.cfg.group_resource)
            .await
            .map_err(to_handler_error)?;
        let s = self
            .heat
            .get_stack(&nested.to_string())
            .await
            .map_err(to_handler_error)?;
        ensure_settled(&s).map_err(to_handler_error)?;
        Ok(nested)
    }

    async fn member_names(&self, nested: &StackId) -> Result<Vec<String>, HandlerError> {
        Ok(self
            .heat
            .members(nested)
            .await
            .map_err(to_handler_error)?
            .into_iter()
            .map(|m| m.resource_name)
            .collect())
    }

    fn count_of(&self, s: &Stack) -> Result<i64, HandlerError> {
        s.int_param(&self.cfg.count_param).ok_or_else(|| {
            HandlerError::Permanent(format!(
                "stack {} has no integer parameter {:?} (count_param)",
                s.stack_name, self.cfg.count_param
            ))
        })
    }

    /// `scale_up = "count"`: count + 1 in one PATCH, refused when Heat's
    /// preview says it would replace existing members.
    async fn scale_up_count(&self, top: &Stack, op: &str) -> Result<String, HandlerError> {
        let top_id = top.stack_id();
        let nested = self.settled_group(&top_id).await?;
        let count = self.count_of(top)?;
        let mut params = serde_json::Map::new();
        params.insert(self.cfg.count_param.clone(), json!(count + 1));
        if let Some(p) = &self.cfg.op_param {
            params.insert(p.clone(), json!(op));
        }
        let body = json!({ "parameters": params });
        let before = self.member_names(&nested).await?;
        if self.cfg.op_param.is_some() {
            self.refuse_replacing(&top_id, &body, &before).await?;
        }
        self.heat
            .patch_stack(&top_id, &body)
            .await
            .map_err(to_handler_error)?;
        self.heat
            .wait_update(
                &top_id,
                top.updated_time.as_deref(),
                self.cfg.update_timeout,
                self.cfg.poll_interval,
            )
            .await
            .map_err(to_handler_error)?;
        let after = self.member_names(&nested).await?;
        Ok(format!(
            "stack {top_id}: {} {count} -> {} (added {:?})",
            self.cfg.count_param,
            count + 1,
            added(&before, &after)
        ))
    }

    /// Heat replaces every existing member whose properties change under a
    /// replace-on-update policy: the `op_param` would rebuild the group.
    async fn refuse_replacing(
        &self,
        top: &StackId,
        body: &Value,
        members: &[String],
    ) -> Result<(), HandlerError> {
        let preview = self
            .heat
            .preview_patch(top, body)
            .await
            .map_err(to_handler_error)?;
        let group = self.cfg.group_resource.as_str();
        let replaced: Vec<&str> = preview
            .replaced
            .iter()
            .filter(|r| {
                r.parent_resource
                    .as_deref()
                    .is_some_and(|p| p == group || members.iter().any(|m| m == p))
            })
            .map(|r| r.resource_name.as_str())
            .collect();
        if replaced.is_empty() {
            return Ok(());
        }
        Err(HandlerError::Permanent(format!(
            "refused: setting op_param {:?} in stack {top} would make Heat replace existing members {replaced:?} \
             (its update preview says so: the parameter reaches a property that replaces on change, such as an \
             OS::Nova::Server's user_data under the default user_data_update_policy REPLACE). Set \
             user_data_update_policy: IGNORE on the server, or remove op_param",
            self.cfg.op_param.as_deref().unwrap_or_default()
        )))
    }

    /// `scale_up = "signal"`: checked, signalled, confirmed.
    async fn scale_up_signal(&self, top: &Stack, reason: &str) -> Result<String, HandlerError> {
        let target = SignalTarget {
            stack: top.stack_id(),
            group: self.cfg.group_resource.clone(),
            policy: self.cfg.scale_up_policy.clone(),
        };
        let prepared = self
            .heat
            .prepare_signal(&target)
            .await
            .map_err(to_handler_error)?;
        let details = signal_details(reason);
        match self.cfg.scale_up_alarm_url.as_deref() {
            Some(url) => post_alarm_url(self.heat.session().http(), url, Some(&details)).await,
            None => {
                self.heat
                    .signal_resource(&target.stack, &target.policy, Some(&details))
                    .await
            }
        }
        .map_err(to_handler_error)?;
        let after = self
            .heat
            .confirm_signal(
                &target,
                &prepared,
                self.cfg.signal_timeout.min(self.cfg.update_timeout),
                Some(self.cfg.update_timeout),
                self.cfg.poll_interval,
            )
            .await
            .map_err(to_handler_error)?;
        Ok(format!(
            "stack {}: signalled {}; group {} {} -> {} members (added {:?})",
            target.stack,
            target.policy,
            target.group,
            prepared.before.members.len(),
            after.members.len(),
            added(&prepared.before.names(), &after.names())
        ))
    }
}

fn added(before: &[String], after: &[String]) -> Vec<String> {
    after
        .iter()
        .filter(|n| !before.contains(n))
        .cloned()
        .collect()
}

#[async_trait]
impl Handler for HeatHandler {
    fn kind(&self) -> &'static str {
        "heat"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let _one = self.one_at_a_time.lock().await;
        let top = self.settled_stack().await?;
        let reason = format!(
            "gearshift {}: scale up {} (op {})",
            req.group.district, req.group.profile, req.op
        );
        let detail = match self.cfg.scale_up {
            HeatScaleUp::Count => self.scale_up_count(&top, &req.op).await?,
            HeatScaleUp::Signal => self.scale_up_signal(&top, &reason).await?,
        };
        Ok(CreateOutcome {
            node: None,
            cloud_id: None,
            detail,
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let Some(server_id) = resolve_server(
            &self.nova,
            &req.node,
            req.cloud_id.as_deref(),
            self.cfg.server_name,
        )
        .await?
        else {
            return Ok(RemoveOutcome {
                detail: format!("no Nova server for {}: already gone", req.node),
                gone: true,
            });
        };
        let _one = self.one_at_a_time.lock().await;
        let top_id = self.settled_stack().await?.stack_id();
        let resources = self
            .heat
            .list_resources(&top_id, 2)
            .await
            .map_err(to_handler_error)?;
        let member = find_member(
            &resources,
            MemberKey::PhysicalId(&server_id),
            Some(&self.cfg.group_resource),
        )
        .map_err(|e| {
            HandlerError::Permanent(format!(
                "{} (server {server_id}) in stack {top_id}: {e}",
                req.node
            ))
        })?;
        let how = Removal {
            count_param: Some(self.cfg.count_param.clone()),
            removal_policies_param: Some(self.cfg.removal_policies_param.clone()),
            mark_resource_group: self.cfg.remove == HeatRemove::MarkUnhealthy,
            reason: format!(
                "gearshift: {} drained for removal (op {})",
                req.node, req.op
            ),
        };
        let out = self
            .heat
            .remove_member(
                &member,
                &how,
                Some((self.cfg.update_timeout, self.cfg.poll_interval)),
            )
            .await
            .map_err(to_handler_error)?;
        let what = match &out.plan {
            Some(p) => p.summary.clone(),
            None => "the member was already gone".to_string(),
        };
        Ok(RemoveOutcome {
            detail: format!(
                "stack {top_id}: {what} ({}, server {server_id}); members {:?} -> {:?}",
                req.node, out.before, out.after
            ),
            gone: true,
        })
    }

    async fn presence(&self, node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        Ok(
            match resolve_server(&self.nova, node, None, self.cfg.server_name).await? {
                Some(_) => Presence::Present,
                None => Presence::Gone,
            },
        )
    }

    async fn capacity(
        &self,
        _group: &GroupKey,
        shape: &NodeShape,
    ) -> Result<Capacity, HandlerError> {
        let Some(flavor) = self.cfg.flavor.as_deref().or(shape.flavor.as_deref()) else {
            return Ok(Capacity::unknown());
        };
        let flavor = self
            .nova
            .find_flavor(flavor)
            .await
            .map_err(to_handler_error)?;
        let limits = self.nova.limits().await.map_err(to_handler_error)?;
        let (n, detail) = limits.servers_that_fit(&flavor);
        Ok(Capacity {
            nodes_available: n.map(|n| n.min(u32::MAX as u64) as u32),
            detail,
        })
    }
}
