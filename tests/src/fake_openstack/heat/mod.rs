//! The fake Heat: stacks with one server group and its scaling policies,
//! the native API (`/heat/v1/{tenant}`) and pre-signed cfn alarm URLs.
//!
//! It follows what real Heat 27 did when measured (`docs/openstack-conformance.md`,
//! "Where the fakes differed"): a signal is answered 200 before anything
//! happens and ignored without an event while the group scales, cools down
//! or sits at `min_size`/`max_size`; a scale-down after a mark removes the
//! marked member and the oldest healthy one; every stack update resizes an
//! AutoScalingGroup to its `desired_capacity` (or its healthy count) and
//! replaces marked ResourceGroup members; a PATCH during an update is
//! accepted and supersedes it; missing resources are `ResourceNotFound`,
//! missing stacks `EntityNotFound`; bodies of successful calls are `null`
//! or HTML as Heat sends them. The HTTP calls live in [`api`], the group
//! mechanics in `scaling`; the template, previews, metadata and events in
//! `views`.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{Answer, FakeOpenStack, PROJECT_ID, State, heat_time};

mod api;
mod scaling;
mod views;

pub(crate) use api::{cfn_signal, route};

/// Which Heat group type holds the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// `OS::Heat::ResourceGroup`: `count` and `removal_policies` parameters.
    ResourceGroup,
    /// `OS::Heat::AutoScalingGroup` with scaling policies.
    AutoScalingGroup,
}

/// Where an AutoScalingGroup's `desired_capacity` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    /// A stack parameter (`{get_param: name}`).
    Param(String),
    /// A number in the template.
    Literal(u32),
}

/// The server group of a [`FakeStack`].
#[derive(Debug, Clone)]
pub struct FakeGroup {
    /// The group's resource name in the stack (`group` / `asg`).
    pub resource_name: String,
    /// Its type.
    pub kind: GroupKind,
    /// Member servers are named `<member_prefix><index>` in Nova.
    pub member_prefix: String,
    /// Members at creation.
    pub initial: u32,
    /// The stack parameter the group's `count` comes from (ResourceGroup).
    pub count_param: String,
    /// The stack parameter its `removal_policies` come from (ResourceGroup).
    pub removal_param: String,
    /// AutoScalingGroup `min_size` (default 0).
    pub min_size: u32,
    /// AutoScalingGroup `max_size` (default 100).
    pub max_size: u32,
    /// AutoScalingGroup `desired_capacity` (default none, as
    /// `docs/heat/gearshift-autoscaling.yaml`).
    pub desired: Option<Desired>,
    /// The `gearshift_op` parameter reaches a member property that replaces
    /// on change (a server's `user_data` under the default
    /// `user_data_update_policy: REPLACE`): changing it replaces every
    /// existing member. Default false (`IGNORE`: only new members get it).
    pub op_replaces: bool,
}

/// A stack to create in the fake.
#[derive(Debug, Clone)]
pub struct FakeStack {
    /// Stack name.
    pub name: String,
    /// Its server group.
    pub group: Option<FakeGroup>,
    /// Scaling policies: resource name -> adjustment (+1, -1).
    pub policies: BTreeMap<String, i32>,
    /// Policy cooldowns in seconds (default 0).
    pub cooldowns: BTreeMap<String, u64>,
    /// Extra parameters.
    pub parameters: BTreeMap<String, Value>,
}

impl FakeStack {
    fn with_group(name: &str, group: FakeGroup) -> Self {
        FakeStack {
            name: name.into(),
            group: Some(group),
            policies: BTreeMap::new(),
            cooldowns: BTreeMap::new(),
            parameters: BTreeMap::new(),
        }
    }

    fn group_spec(kind: GroupKind, resource: &str, prefix: &str, count: u32) -> FakeGroup {
        FakeGroup {
            resource_name: resource.into(),
            kind,
            member_prefix: prefix.into(),
            initial: count,
            count_param: "count".into(),
            removal_param: "removal_policies".into(),
            min_size: 0,
            max_size: 100,
            desired: None,
            op_replaces: false,
        }
    }

    /// A stack whose `group` is a ResourceGroup of `count` servers, sized
    /// by the `count` parameter, with a `removal_policies` json parameter.
    pub fn resource_group(name: &str, member_prefix: &str, count: u32) -> Self {
        let g = Self::group_spec(GroupKind::ResourceGroup, "group", member_prefix, count);
        Self::with_group(name, g)
    }

    /// A stack whose `asg` is an AutoScalingGroup of `count` servers with
    /// policies `scale_up` (+1) and `scale_down` (-1), cooldown 0, no
    /// `desired_capacity`, min 0, max 100.
    pub fn asg(name: &str, member_prefix: &str, count: u32) -> Self {
        let g = Self::group_spec(GroupKind::AutoScalingGroup, "asg", member_prefix, count);
        let mut s = Self::with_group(name, g);
        s.policies = [("scale_up".to_string(), 1), ("scale_down".to_string(), -1)]
            .into_iter()
            .collect();
        s
    }

    fn group_mut(&mut self) -> &mut FakeGroup {
        self.group.as_mut().expect("a stack with a group")
    }

    /// The AutoScalingGroup's `min_size` and `max_size`.
    pub fn with_limits(mut self, min: u32, max: u32) -> Self {
        let g = self.group_mut();
        (g.min_size, g.max_size) = (min, max);
        self
    }

    /// `desired_capacity: {get_param: <param>}`, the parameter set to the
    /// initial size.
    pub fn with_desired_param(mut self, param: &str) -> Self {
        let n = self.group_mut().initial;
        self.group_mut().desired = Some(Desired::Param(param.into()));
        self.parameters.insert(param.into(), json!(n.to_string()));
        self
    }

    /// `desired_capacity` written in the template.
    pub fn with_desired(mut self, n: u32) -> Self {
        self.group_mut().desired = Some(Desired::Literal(n));
        self
    }

    /// A policy's `cooldown` in seconds.
    pub fn with_cooldown(mut self, policy: &str, secs: u64) -> Self {
        self.cooldowns.insert(policy.into(), secs);
        self
    }

    /// `gearshift_op` replaces every member when it changes (see [`FakeGroup::op_replaces`]).
    pub fn with_op_replacing(mut self) -> Self {
        self.group_mut().op_replaces = true;
        self
    }
}

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeMember {
    /// Resource name in the group's nested stack (`0`, `1`, ... or 12
    /// random letters and digits, as Heat names them).
    pub name: String,
    /// The Nova server's id (the resource's physical id).
    pub server_id: String,
    /// The Nova server's name.
    pub server_name: String,
    /// `CREATE_COMPLETE`, or `CHECK_FAILED` once marked unhealthy.
    pub status: String,
    /// The reason given when marked unhealthy.
    pub reason: String,
    /// The stack's `gearshift_op` parameter when the member was created
    /// (what a template would hand to the new server's user data).
    pub boot_op: Option<String>,
    /// Heat's `creation_time`.
    pub created: String,
}

#[derive(Debug)]
struct GroupState {
    spec: FakeGroup,
    nested_name: String,
    nested_id: String,
    members: Vec<FakeMember>,
    next_index: u32,
    // The nested stack's own status: scaling-policy signals update it, not
    // the parent stack (as in Heat).
    status: String,
    reason: String,
    updated: Option<String>,
    polls_left: u32,
    /// A signal Heat accepted and has not applied yet: (policy, adjustment, event reason).
    signal: Option<(String, i32, String)>,
    scaling_in_progress: bool,
    cooldown_end: Option<DateTime<Utc>>,
    cooldown_reason: String,
}

#[derive(Debug)]
struct StackState {
    id: String,
    name: String,
    status: String,
    reason: String,
    created: String,
    updated: Option<String>,
    parameters: BTreeMap<String, Value>,
    group: Option<GroupState>,
    policies: BTreeMap<String, i32>,
    cooldowns: BTreeMap<String, u64>,
    polls_left: u32,
    /// An update in flight: the parameters before it (to see what changed).
    pending: Option<BTreeMap<String, Value>>,
    /// `SIGNAL` events, oldest first: (policy, event JSON).
    events: Vec<(String, Value)>,
}

#[derive(Debug, Default)]
pub(crate) struct HeatState {
    stacks: Vec<StackState>,
    update_polls: u32,
    fail_next_update: Option<String>,
}

/// 12 lowercase letters and digits, as Heat's short ids (`26qz6sxlbbcq`).
fn short_id(s: &mut State) -> String {
    s.counter += 1;
    let mut x = s.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66_D1CE_4E5B;
    (0..12)
        .map(|_| {
            let c = b"abcdefghijklmnopqrstuvwxyz0123456789"[(x % 36) as usize];
            x /= 36;
            c as char
        })
        .collect()
}

impl FakeOpenStack {
    /// Creates a stack (`CREATE_COMPLETE`); returns `name/id`.
    pub fn add_stack(&self, spec: FakeStack) -> String {
        let mut s = self.lock();
        let id = s.next_id("57ac");
        let created = heat_time(&mut s);
        let mut parameters = spec.parameters.clone();
        let group = spec.group.clone().map(|g| {
            let nested_id = s.next_id("4e5d");
            let nested_name = format!("{}-{}-{}", spec.name, g.resource_name, short_id(&mut s));
            let mut gs = GroupState {
                nested_name,
                nested_id,
                spec: g.clone(),
                members: Vec::new(),
                next_index: 0,
                status: "CREATE_COMPLETE".into(),
                reason: "Stack CREATE completed successfully".into(),
                updated: None,
                polls_left: 0,
                signal: None,
                scaling_in_progress: false,
                cooldown_end: (g.kind == GroupKind::AutoScalingGroup).then(Utc::now),
                cooldown_reason: format!("ExactCapacity : {}", g.initial),
            };
            for _ in 0..g.initial {
                scaling::add_member(&mut s, &mut gs, None);
            }
            if g.kind == GroupKind::ResourceGroup {
                parameters.insert(g.count_param.clone(), json!(g.initial.to_string()));
                parameters.insert(g.removal_param.clone(), json!("[]"));
            }
            gs
        });
        s.heat.stacks.push(StackState {
            id: id.clone(),
            name: spec.name.clone(),
            status: "CREATE_COMPLETE".into(),
            reason: "Stack CREATE completed successfully".into(),
            created,
            updated: None,
            parameters,
            group,
            policies: spec.policies,
            cooldowns: spec.cooldowns,
            polls_left: 0,
            pending: None,
            events: Vec::new(),
        });
        format!("{}/{}", spec.name, id)
    }

    fn with_stack<T>(&self, name: &str, f: impl FnOnce(&StackState) -> T) -> T {
        let s = self.lock();
        f(s.heat
            .stacks
            .iter()
            .find(|st| st.name == name)
            .expect("stack"))
    }

    /// Whether a stack of this name exists.
    pub fn stack_exists(&self, name: &str) -> bool {
        self.lock().heat.stacks.iter().any(|st| st.name == name)
    }

    /// A stack's `(stack_status, stack_status_reason)`.
    pub fn stack_status(&self, name: &str) -> (String, String) {
        self.with_stack(name, |st| (st.status.clone(), st.reason.clone()))
    }

    /// Forces a stack's status (for example `UPDATE_IN_PROGRESS` or `CREATE_FAILED`).
    pub fn set_stack_status(&self, name: &str, status: &str, reason: &str) {
        let mut s = self.lock();
        let st = s
            .heat
            .stacks
            .iter_mut()
            .find(|st| st.name == name)
            .expect("stack");
        st.status = status.into();
        st.reason = reason.into();
    }

    /// A stack's current parameter values.
    pub fn stack_parameters(&self, name: &str) -> BTreeMap<String, Value> {
        self.with_stack(name, |st| st.parameters.clone())
    }

    /// The members of a stack's group, oldest first.
    pub fn members(&self, name: &str) -> Vec<FakeMember> {
        self.with_stack(name, |st| {
            st.group
                .as_ref()
                .map(|g| g.members.clone())
                .unwrap_or_default()
        })
    }

    /// The nested stack of a stack's group, `name/id`.
    pub fn group_stack(&self, name: &str) -> String {
        self.with_stack(name, |st| {
            let g = st.group.as_ref().expect("group");
            format!("{}/{}", g.nested_name, g.nested_id)
        })
    }

    /// The `resource_status_reason` of a policy's `SIGNAL` events, oldest first.
    pub fn policy_events(&self, name: &str, policy: &str) -> Vec<String> {
        self.with_stack(name, |st| {
            st.events
                .iter()
                .filter(|(p, _)| p == policy)
                .map(|(_, e)| {
                    e["resource_status_reason"]
                        .as_str()
                        .unwrap_or("")
                        .to_string()
                })
                .collect()
        })
    }

    /// GETs of an updating stack before the update finishes (default 0:
    /// the first GET after a change already sees it finished; set 2 to see
    /// `UPDATE_IN_PROGRESS` twice).
    pub fn set_update_polls(&self, n: u32) {
        self.lock().heat.update_polls = n;
    }

    /// The next stack update or scaling ends `UPDATE_FAILED` with `reason`
    /// (for example "Resource CREATE failed: Forbidden: Quota exceeded for instances").
    pub fn fail_next_stack_update(&self, reason: &str) {
        self.lock().heat.fail_next_update = Some(reason.into());
    }

    /// The pre-signed `alarm_url` of a policy, shaped as heat-api-cfn 27
    /// makes it: the ARN's colons encoded, its slashes literal, then
    /// `SignatureMethod`, `SignatureVersion`, `AWSAccessKeyId`, `Signature`
    /// (no `Timestamp`: it never expires). No token needed.
    pub fn alarm_url(&self, stack: &str, policy: &str) -> String {
        let (name, id) = stack.split_once('/').expect("name/id");
        format!(
            "{}/heat-cfn/v1/signal/arn%3Aopenstack%3Aheat%3A%3A{PROJECT_ID}%3Astacks/{name}/{id}/resources/{policy}?SignatureMethod=HmacSHA256&SignatureVersion=2&AWSAccessKeyId=4a6a4a2b1e8c4d2f9e0b7a6c5d4e3f21&Signature={}",
            self.base_url(),
            scaling::expected_signature(name, policy)
        )
    }

    /// The native `signal_url` of a resource (POST with `X-Auth-Token`).
    pub fn signal_url(&self, stack: &str, resource: &str) -> String {
        format!(
            "{}/heat/v1/{PROJECT_ID}/stacks/{stack}/resources/{resource}/signal",
            self.base_url()
        )
    }
}

fn find_stack(s: &State, name: &str, id: Option<&str>) -> Option<usize> {
    s.heat.stacks.iter().position(|st| {
        (st.name == name || (id.is_none() && st.id == name)) && id.is_none_or(|i| i == st.id)
    })
}

/// The stack whose group's nested stack is `name` (or has id `name` when `id` is `None`).
fn find_group(s: &State, name: &str, id: Option<&str>) -> Option<usize> {
    s.heat.stacks.iter().position(|st| {
        st.group.as_ref().is_some_and(|g| {
            (g.nested_name == name || (id.is_none() && g.nested_id == name))
                && id.is_none_or(|i| i == g.nested_id)
        })
    })
}

fn heat_404(kind: &str, what: &str) -> Answer {
    Answer::json(
        404,
        json!({"explanation": "The resource could not be found.", "code": 404, "error": {"message": what, "traceback": null, "type": kind}, "title": "Not Found"}),
    )
}

/// A missing stack: `EntityNotFound`.
fn stack_not_found(name: &str) -> Answer {
    heat_404(
        "EntityNotFound",
        &format!("The Stack ({name}) could not be found."),
    )
}

/// A missing resource of an existing stack: `ResourceNotFound`.
fn resource_not_found(res: &str, stack: &str) -> Answer {
    heat_404(
        "ResourceNotFound",
        &format!("The Resource ({res}) could not be found in Stack {stack}."),
    )
}

/// heat-api's HTML page for a 202 or 302 (clients must not parse it).
fn html(status: u16, extra: Vec<(String, String)>) -> Answer {
    let code = StatusCode::from_u16(status).expect("status");
    let text = format!(
        "<html>\n <head>\n  <title>{code}</title>\n </head>\n <body>\n  <h1>{code}</h1>\n  The request is accepted for processing.<br /><br />\n\n\n\n </body>\n</html>"
    );
    let mut headers = vec![(
        "content-type".to_string(),
        "text/html; charset=UTF-8".to_string(),
    )];
    headers.extend(extra);
    Answer(code, headers, Some(Value::String(text)))
}
