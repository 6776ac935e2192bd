//! The `heat` handler: node hosts are members of a Heat stack's group
//! (`OS::Heat::ResourceGroup` or `OS::Heat::AutoScalingGroup`).
//!
//! ## Add a node
//! - `scale_up = "signal"` (default): signal the scale-up policy, through
//!   its pre-signed `scale_up_alarm_url` (no token) or the policy resource's
//!   signal API (token), then wait for the group's nested stack to reach
//!   `UPDATE_COMPLETE`.
//! - `scale_up = "count"`: PATCH the stack with `count_param` + 1 (and
//!   `op_param` = the operation id, when set) and wait for the stack's
//!   `UPDATE_COMPLETE`.
//!
//! ## Remove exactly this node
//! The node's Nova server (its `cloud_id`, else the server named after the
//! host) is found among the group's members (`GET .../resources?nested_depth=2`).
//! - `remove = "removal-policies"` (default): PATCH the stack with
//!   `count_param` - 1 and `removal_policies_param` =
//!   `[{"resource_list": ["<member>"]}]`, then wait for `UPDATE_COMPLETE`.
//!   The template must pass these parameters to the ResourceGroup.
//! - `remove = "mark-unhealthy"`: PATCH the member with `mark_unhealthy`
//!   (Heat's AutoScalingGroup removes unhealthy members first), then
//!   signal the scale-down policy and wait for the group's update.
//!
//! ## Refusals
//! Before acting, a stack (or group) `*_IN_PROGRESS` is
//! [`HandlerError::Busy`] and `*_FAILED` is refused with its reason
//! ([`HandlerError::Quota`] when the reason names a quota, else
//! [`HandlerError::Permanent`]: an operator must look). An update that ends
//! `UPDATE_FAILED` is mapped the same way.

use async_trait::async_trait;
use gearshift_cloud::heat::{Heat, Resource, Stack, StackId, ensure_settled, post_alarm_url};
use gearshift_cloud::nova::Nova;
use serde_json::json;

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
    async fn settled_group(&self, top: &StackId) -> Result<Stack, HandlerError> {
        let resources = self
            .heat
            .list_resources(top, 0)
            .await
            .map_err(to_handler_error)?;
        let group = resources
            .iter()
            .find(|r| r.resource_name == self.cfg.group_resource)
            .ok_or_else(|| {
                HandlerError::Permanent(format!(
                    "stack {top} has no resource {:?} (group_resource)",
                    self.cfg.group_resource
                ))
            })?;
        if group.physical_resource_id.is_empty() {
            return Err(HandlerError::Permanent(format!(
                "group {} of stack {top} has no nested stack yet",
                self.cfg.group_resource
            )));
        }
        let nested = self
            .heat
            .get_stack(&group.physical_resource_id)
            .await
            .map_err(to_handler_error)?;
        ensure_settled(&nested).map_err(to_handler_error)?;
        Ok(nested)
    }

    async fn signal(
        &self,
        top: &StackId,
        alarm_url: Option<&str>,
        policy: &str,
        reason: &str,
    ) -> Result<(), HandlerError> {
        let details = json!({ "reason": reason });
        match alarm_url {
            Some(url) => post_alarm_url(self.heat.session().http(), url, Some(&details)).await,
            None => self.heat.signal_resource(top, policy, Some(&details)).await,
        }
        .map(drop)
        .map_err(to_handler_error)
    }

    async fn wait(&self, stack: &StackId, before: Option<&str>) -> Result<Stack, HandlerError> {
        self.heat
            .wait_update(
                stack,
                before,
                self.cfg.update_timeout,
                self.cfg.poll_interval,
            )
            .await
            .map_err(to_handler_error)
    }

    fn count_of(&self, s: &Stack) -> Result<i64, HandlerError> {
        s.int_param(&self.cfg.count_param).ok_or_else(|| {
            HandlerError::Permanent(format!(
                "stack {} has no integer parameter {:?} (count_param)",
                s.stack_name, self.cfg.count_param
            ))
        })
    }
}

impl HeatHandler {
    /// The group member (its name and resource) that holds `server_id`:
    /// the server itself, or the nested stack holding it.
    fn member_of<'r>(
        &self,
        resources: &'r [Resource],
        top_id: &StackId,
        server_id: &str,
        node: &str,
    ) -> Result<(String, &'r Resource), HandlerError> {
        let group = self.cfg.group_resource.as_str();
        let server_res = resources
            .iter()
            .find(|r| r.physical_resource_id == server_id)
            .ok_or_else(|| {
                HandlerError::Permanent(format!(
                    "server {server_id} of {node} is not in stack {top_id}"
                ))
            })?;
        let member_name = if server_res.parent_resource.as_deref() == Some(group) {
            server_res.resource_name.clone()
        } else {
            server_res.parent_resource.clone().ok_or_else(|| {
                HandlerError::Permanent(format!("server {server_id} has no parent group member"))
            })?
        };
        let member = resources
            .iter()
            .find(|r| r.resource_name == member_name && r.parent_resource.as_deref() == Some(group))
            .ok_or_else(|| {
                HandlerError::Permanent(format!(
                    "{node} (server {server_id}) is not a member of group {group}"
                ))
            })?;
        Ok((member_name, member))
    }

    /// `remove = "removal-policies"`: one stack PATCH, count - 1 and this
    /// member in the removal policies.
    async fn remove_by_policy(
        &self,
        top: &Stack,
        member_name: &str,
        node: &str,
    ) -> Result<String, HandlerError> {
        let top_id = top.stack_id();
        let count = self.count_of(top)?;
        let body = json!({ "parameters": {
            self.cfg.count_param.clone(): (count - 1).max(0),
            self.cfg.removal_policies_param.clone(): [{ "resource_list": [member_name] }],
        }});
        self.heat
            .patch_stack(&top_id, &body)
            .await
            .map_err(to_handler_error)?;
        self.wait(&top_id, top.updated_time.as_deref()).await?;
        Ok(format!(
            "stack {top_id}: {} {count} -> {} removing member {member_name} ({node})",
            self.cfg.count_param,
            (count - 1).max(0),
        ))
    }

    /// `remove = "mark-unhealthy"`: mark the member, then signal the
    /// scale-down policy.
    async fn remove_marked(
        &self,
        top_id: &StackId,
        member: &Resource,
        member_name: &str,
        req: &RemoveRequest,
    ) -> Result<String, HandlerError> {
        let group = self.settled_group(top_id).await?;
        let owning = member.owning_stack().unwrap_or_else(|| group.stack_id());
        let reason = format!(
            "gearshift: {} drained for removal (op {})",
            req.node, req.op
        );
        self.heat
            .mark_unhealthy(&owning, member_name, &reason)
            .await
            .map_err(to_handler_error)?;
        self.signal(
            top_id,
            self.cfg.scale_down_alarm_url.as_deref(),
            &self.cfg.scale_down_policy,
            &reason,
        )
        .await?;
        self.wait(&group.stack_id(), group.updated_time.as_deref())
            .await?;
        Ok(format!(
            "stack {top_id}: marked member {member_name} ({}) unhealthy and signalled {}",
            req.node, self.cfg.scale_down_policy
        ))
    }
}

#[async_trait]
impl Handler for HeatHandler {
    fn kind(&self) -> &'static str {
        "heat"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let top = self.settled_stack().await?;
        let top_id = top.stack_id();
        let reason = format!(
            "gearshift {}: scale up {} (op {})",
            req.group.district, req.group.profile, req.op
        );
        let detail = match self.cfg.scale_up {
            HeatScaleUp::Count => {
                let count = self.count_of(&top)?;
                let mut params = serde_json::Map::new();
                params.insert(self.cfg.count_param.clone(), json!(count + 1));
                if let Some(p) = &self.cfg.op_param {
                    params.insert(p.clone(), json!(req.op));
                }
                let body = json!({ "parameters": params });
                self.heat
                    .patch_stack(&top_id, &body)
                    .await
                    .map_err(to_handler_error)?;
                self.wait(&top_id, top.updated_time.as_deref()).await?;
                format!(
                    "stack {top_id}: {} {count} -> {}",
                    self.cfg.count_param,
                    count + 1
                )
            }
            HeatScaleUp::Signal => {
                let group = self.settled_group(&top_id).await?;
                self.signal(
                    &top_id,
                    self.cfg.scale_up_alarm_url.as_deref(),
                    &self.cfg.scale_up_policy,
                    &reason,
                )
                .await?;
                self.wait(&group.stack_id(), group.updated_time.as_deref())
                    .await?;
                format!(
                    "stack {top_id}: signalled {} and the group grew",
                    self.cfg.scale_up_policy
                )
            }
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
        let top = self.settled_stack().await?;
        let top_id = top.stack_id();
        let resources = self
            .heat
            .list_resources(&top_id, 2)
            .await
            .map_err(to_handler_error)?;
        let (member_name, member) = self.member_of(&resources, &top_id, &server_id, &req.node)?;
        let detail = match self.cfg.remove {
            HeatRemove::RemovalPolicies => {
                self.remove_by_policy(&top, &member_name, &req.node).await?
            }
            HeatRemove::MarkUnhealthy => {
                self.remove_marked(&top_id, member, &member_name, req)
                    .await?
            }
        };
        let gone = self
            .nova
            .get_server(&server_id)
            .await
            .map_err(to_handler_error)?
            .is_none();
        Ok(RemoveOutcome { detail, gone })
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
