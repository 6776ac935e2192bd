//! The fake Heat: stacks with one server group and its scaling policies,
//! the native API (`/heat/v1/{tenant}`) and pre-signed cfn alarm URLs
//! ([`api`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Answer, FakeOpenStack, PROJECT_ID, Signal, State, heat_time};

mod api;
pub(crate) use api::{cfn_signal, route};

/// Which Heat group type holds the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// `OS::Heat::ResourceGroup`: `count` and `removal_policies` parameters.
    ResourceGroup,
    /// `OS::Heat::AutoScalingGroup` with scaling policies.
    AutoScalingGroup,
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
    /// Extra parameters.
    pub parameters: BTreeMap<String, Value>,
}

impl FakeStack {
    /// A stack whose `group` is a ResourceGroup of `count` servers, sized
    /// by the `count` parameter, with a `removal_policies` json parameter.
    pub fn resource_group(name: &str, member_prefix: &str, count: u32) -> Self {
        FakeStack {
            name: name.into(),
            group: Some(FakeGroup {
                resource_name: "group".into(),
                kind: GroupKind::ResourceGroup,
                member_prefix: member_prefix.into(),
                initial: count,
                count_param: "count".into(),
                removal_param: "removal_policies".into(),
            }),
            policies: BTreeMap::new(),
            parameters: BTreeMap::new(),
        }
    }

    /// A stack whose `asg` is an AutoScalingGroup of `count` servers with
    /// policies `scale_up` (+1) and `scale_down` (-1).
    pub fn asg(name: &str, member_prefix: &str, count: u32) -> Self {
        FakeStack {
            name: name.into(),
            group: Some(FakeGroup {
                resource_name: "asg".into(),
                kind: GroupKind::AutoScalingGroup,
                member_prefix: member_prefix.into(),
                initial: count,
                count_param: "count".into(),
                removal_param: "removal_policies".into(),
            }),
            policies: [("scale_up".to_string(), 1), ("scale_down".to_string(), -1)]
                .into_iter()
                .collect(),
            parameters: BTreeMap::new(),
        }
    }
}

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeMember {
    /// Resource name in the group's nested stack.
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
}

#[derive(Debug, Clone)]
enum Pending {
    Update(serde_json::Map<String, Value>),
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
    pending: Option<i32>,
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
    polls_left: u32,
    pending: Option<Pending>,
}

#[derive(Debug, Default)]
pub(crate) struct HeatState {
    stacks: Vec<StackState>,
    update_polls: u32,
    fail_next_update: Option<String>,
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
            let mut gs = GroupState {
                nested_name: format!("{}-{}-x7k2q", spec.name, g.resource_name),
                nested_id,
                spec: g.clone(),
                members: Vec::new(),
                next_index: 0,
                status: "CREATE_COMPLETE".into(),
                reason: "Stack CREATE completed successfully".into(),
                updated: None,
                polls_left: 0,
                pending: None,
            };
            for _ in 0..g.initial {
                add_member(&mut s, &mut gs);
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
            polls_left: 0,
            pending: None,
        });
        format!("{}/{}", spec.name, id)
    }

    /// Whether a stack of this name exists.
    pub fn stack_exists(&self, name: &str) -> bool {
        self.lock().heat.stacks.iter().any(|st| st.name == name)
    }

    /// A stack's `(stack_status, stack_status_reason)`.
    pub fn stack_status(&self, name: &str) -> (String, String) {
        let s = self.lock();
        let st = s
            .heat
            .stacks
            .iter()
            .find(|st| st.name == name)
            .expect("stack");
        (st.status.clone(), st.reason.clone())
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
        let s = self.lock();
        s.heat
            .stacks
            .iter()
            .find(|st| st.name == name)
            .expect("stack")
            .parameters
            .clone()
    }

    /// The members of a stack's group, oldest first.
    pub fn members(&self, name: &str) -> Vec<FakeMember> {
        let s = self.lock();
        let st = s
            .heat
            .stacks
            .iter()
            .find(|st| st.name == name)
            .expect("stack");
        st.group
            .as_ref()
            .map(|g| g.members.clone())
            .unwrap_or_default()
    }

    /// The nested stack of a stack's group, `name/id`.
    pub fn group_stack(&self, name: &str) -> String {
        let s = self.lock();
        let st = s
            .heat
            .stacks
            .iter()
            .find(|st| st.name == name)
            .expect("stack");
        let g = st.group.as_ref().expect("group");
        format!("{}/{}", g.nested_name, g.nested_id)
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

    /// The pre-signed cfn `alarm_url` of a policy, as Heat's `alarm_url`
    /// attribute gives it (EC2 signature v2 in the query; no token needed).
    pub fn alarm_url(&self, stack: &str, policy: &str) -> String {
        let (name, id) = stack.split_once('/').expect("name/id");
        let arn = format!("arn:openstack:heat::{PROJECT_ID}:stacks/{name}/{id}/resources/{policy}");
        let arn: String = url::form_urlencoded::byte_serialize(arn.as_bytes()).collect::<String>();
        format!(
            "{}/heat-cfn/v1/signal/{arn}?Timestamp=2024-05-01T10%3A00%3A00Z&SignatureMethod=HmacSHA256&AWSAccessKeyId=4a6a4a2b1e&SignatureVersion=2&Signature={}",
            self.base_url(),
            expected_signature(name, policy)
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

fn expected_signature(stack: &str, policy: &str) -> String {
    format!("c2lnLX{stack}-{policy}%3D")
}

fn add_member(s: &mut State, g: &mut GroupState) {
    add_member_for(s, g, None)
}

fn add_member_for(s: &mut State, g: &mut GroupState, boot_op: Option<String>) {
    let index = g.next_index;
    g.next_index += 1;
    let server_name = format!("{}{}", g.spec.member_prefix, index);
    let server_id = super::compute::spawn_server(s, &server_name);
    let name = match g.spec.kind {
        GroupKind::ResourceGroup => index.to_string(),
        GroupKind::AutoScalingGroup => format!("m{index:03}ab"),
    };
    g.members.push(FakeMember {
        name,
        server_id,
        server_name,
        status: "CREATE_COMPLETE".into(),
        reason: "state changed".into(),
        boot_op,
    });
}

fn remove_member(s: &mut State, g: &mut GroupState, i: usize) {
    let m = g.members.remove(i);
    super::compute::drop_server(s, &m.server_id);
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

fn not_found(what: &str) -> Answer {
    Answer::json(
        404,
        json!({"explanation": "The resource could not be found.", "code": 404, "error": {"message": what, "traceback": null, "type": "EntityNotFound"}, "title": "Not Found"}),
    )
}

fn in_progress(name: &str, status: &str) -> Answer {
    let action = status.split('_').next().unwrap_or("UPDATE");
    Answer::json(
        409,
        json!({"explanation": "There was a conflict when trying to complete your request.", "code": 409, "error": {"message": format!("Stack {name} already has an action ({action}) in progress."), "traceback": null, "type": "ActionInProgress"}, "title": "Conflict"}),
    )
}

fn stack_json(st: &StackState, base: &str) -> Value {
    let params: serde_json::Map<String, Value> = st
        .parameters
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), Value::String(v))
        })
        .chain([
            ("OS::stack_id".to_string(), json!(st.id)),
            ("OS::stack_name".to_string(), json!(st.name)),
            ("OS::project_id".to_string(), json!(PROJECT_ID)),
        ])
        .collect();
    json!({
        "capabilities": [],
        "creation_time": st.created,
        "deletion_time": null,
        "description": "gearshift test stack",
        "disable_rollback": true,
        "id": st.id,
        "links": [{"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{}/{}", st.name, st.id), "rel": "self"}],
        "notification_topics": [],
        "outputs": [],
        "parameters": params,
        "parent": null,
        "stack_name": st.name,
        "stack_owner": null,
        "stack_status": st.status,
        "stack_status_reason": st.reason,
        "stack_user_project_id": "8f3c9ee6f1a9446d9f0f0e0d8c5a3b2d",
        "tags": null,
        "template_description": "gearshift test stack",
        "timeout_mins": null,
        "updated_time": st.updated,
    })
}

fn nested_json(st: &StackState, g: &GroupState, base: &str) -> Value {
    json!({
        "capabilities": [], "creation_time": st.created, "deletion_time": null,
        "description": "No description", "disable_rollback": true, "id": g.nested_id,
        "links": [{"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{}/{}", g.nested_name, g.nested_id), "rel": "self"}],
        "notification_topics": [], "outputs": [], "parameters": {"OS::stack_id": g.nested_id, "OS::stack_name": g.nested_name, "OS::project_id": PROJECT_ID},
        "parent": st.id, "stack_name": g.nested_name, "stack_owner": null,
        "stack_status": g.status, "stack_status_reason": g.reason,
        "stack_user_project_id": "8f3c9ee6f1a9446d9f0f0e0d8c5a3b2d", "tags": null,
        "template_description": "No description", "timeout_mins": null, "updated_time": g.updated,
    })
}

/// Advances a group's in-progress nested stack (a policy signal) by one poll.
fn advance_group(s: &mut State, idx: usize) {
    let Some(g) = s.heat.stacks[idx].group.as_mut() else {
        return;
    };
    if g.pending.is_none() || !g.status.ends_with("_IN_PROGRESS") {
        return;
    }
    if g.polls_left > 0 {
        g.polls_left -= 1;
        return;
    }
    let adj = g.pending.take().expect("pending");
    if let Some(reason) = s.heat.fail_next_update.take() {
        let g = s.heat.stacks[idx].group.as_mut().expect("group");
        g.status = "UPDATE_FAILED".into();
        g.reason = reason;
        return;
    }
    let mut g = s.heat.stacks[idx].group.take().expect("group");
    if adj > 0 {
        for _ in 0..adj {
            add_member(s, &mut g);
        }
    } else {
        for _ in 0..(-adj) {
            // Unhealthy (FAILED) members first, then the oldest.
            let i = g
                .members
                .iter()
                .position(|m| m.status.ends_with("FAILED"))
                .unwrap_or(0);
            if !g.members.is_empty() {
                remove_member(s, &mut g, i);
            }
        }
    }
    g.status = "UPDATE_COMPLETE".into();
    g.reason = "Stack UPDATE completed successfully".into();
    s.heat.stacks[idx].group = Some(g);
}

/// Advances an in-progress stack by one poll; applies the change at the end.
fn advance(s: &mut State, idx: usize) {
    if !s.heat.stacks[idx].status.ends_with("_IN_PROGRESS") || s.heat.stacks[idx].pending.is_none()
    {
        return;
    }
    if s.heat.stacks[idx].polls_left > 0 {
        s.heat.stacks[idx].polls_left -= 1;
        return;
    }
    let pending = s.heat.stacks[idx].pending.take().expect("pending");
    if let Some(reason) = s.heat.fail_next_update.take() {
        let st = &mut s.heat.stacks[idx];
        st.status = "UPDATE_FAILED".into();
        st.reason = reason;
        return;
    }
    let mut group = s.heat.stacks[idx].group.take();
    match pending {
        Pending::Update(params) => {
            for (k, v) in params {
                s.heat.stacks[idx].parameters.insert(k, v);
            }
            if let Some(g) = group
                .as_mut()
                .filter(|g| g.spec.kind == GroupKind::ResourceGroup)
            {
                let p = &s.heat.stacks[idx].parameters;
                let count = match p.get(&g.spec.count_param) {
                    Some(Value::String(c)) => c.parse::<usize>().unwrap_or(g.members.len()),
                    Some(Value::Number(n)) => n.as_u64().unwrap_or(0) as usize,
                    _ => g.members.len(),
                };
                let policies = match p.get(&g.spec.removal_param) {
                    Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(json!([])),
                    Some(v) => v.clone(),
                    None => json!([]),
                };
                let boot_op = match p.get("gearshift_op") {
                    Some(Value::String(op)) if !op.is_empty() => Some(op.clone()),
                    _ => None,
                };
                let mut blacklist = Vec::new();
                for pol in policies.as_array().cloned().unwrap_or_default() {
                    for r in pol["resource_list"].as_array().cloned().unwrap_or_default() {
                        if let Some(r) = r.as_str() {
                            blacklist.push(r.to_string());
                        }
                    }
                }
                // Blacklisted members go first (and their names are never reused).
                while let Some(i) = g
                    .members
                    .iter()
                    .position(|m| blacklist.contains(&m.name) || blacklist.contains(&m.server_id))
                {
                    remove_member(s, g, i);
                }
                while g.members.len() > count {
                    let last = g.members.len() - 1;
                    remove_member(s, g, last);
                }
                while g.members.len() < count {
                    add_member_for(s, g, boot_op.clone());
                }
            }
        }
    }
    let st = &mut s.heat.stacks[idx];
    st.group = group;
    st.status = "UPDATE_COMPLETE".into();
    st.reason = "Stack UPDATE completed successfully".into();
}

fn start_change(s: &mut State, idx: usize, pending: Pending) {
    let t = heat_time(s);
    let polls = s.heat.update_polls;
    let st = &mut s.heat.stacks[idx];
    st.status = "UPDATE_IN_PROGRESS".into();
    st.reason = "Stack UPDATE started".into();
    st.updated = Some(t);
    st.pending = Some(pending);
    st.polls_left = polls;
}

/// Applies a policy signal: Heat accepts it (200) even when the group
/// cannot scale now, and then does nothing (`NoActionRequired`).
fn signal_policy(
    s: &mut State,
    idx: usize,
    policy: &str,
    via: &'static str,
    details: Option<Value>,
) -> Answer {
    let name = s.heat.stacks[idx].name.clone();
    let Some(adj) = s.heat.stacks[idx].policies.get(policy).copied() else {
        return not_found(&format!(
            "The Resource ({policy}) could not be found in Stack {name}."
        ));
    };
    let settled = s.heat.stacks[idx].status.ends_with("_COMPLETE")
        && s.heat.stacks[idx]
            .group
            .as_ref()
            .is_none_or(|g| g.status.ends_with("_COMPLETE"));
    s.signals.push(Signal {
        stack: name,
        resource: policy.into(),
        via,
        details,
        applied: settled,
    });
    if settled {
        let t = heat_time(s);
        let polls = s.heat.update_polls;
        if let Some(g) = s.heat.stacks[idx].group.as_mut() {
            g.status = "UPDATE_IN_PROGRESS".into();
            g.reason = "Stack UPDATE started".into();
            g.updated = Some(t);
            g.pending = Some(adj);
            g.polls_left = polls;
        }
    }
    Answer::empty(200)
}
