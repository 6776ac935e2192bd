//! The fake Heat's group mechanics, as real Heat 27 showed them
//! (`docs/openstack-conformance.md`): stack updates, policy signals
//! (accepted with 200, applied at the next look at the group's nested
//! stack, or ignored without an event), the signature pre-signed cfn URLs
//! carry.

use std::collections::BTreeMap;

use chrono::Utc;
use serde_json::{Value, json};

use super::{
    Desired, FakeMember, GroupKind, GroupState, StackState, find_stack, html, resource_not_found,
    stack_not_found,
};
use crate::fake_openstack::{Answer, PROJECT_ID, Req, Signal, State, heat_time, violation};

pub(super) fn expected_signature(stack: &str, policy: &str) -> String {
    format!("c2lnLX{stack}-{policy}%3D")
}

pub(super) fn add_member(s: &mut State, g: &mut GroupState, boot_op: Option<String>) {
    let index = g.next_index;
    g.next_index += 1;
    let server_name = format!("{}{}", g.spec.member_prefix, index);
    let server_id = crate::fake_openstack::compute::spawn_server(s, &server_name);
    let name = match g.spec.kind {
        GroupKind::ResourceGroup => index.to_string(),
        GroupKind::AutoScalingGroup => super::short_id(s),
    };
    let created = heat_time(s);
    g.members.push(FakeMember {
        name,
        server_id,
        server_name,
        status: "CREATE_COMPLETE".into(),
        reason: "state changed".into(),
        boot_op,
        created,
    });
}

/// Replaces member `i` in place: same resource name, a new server.
fn replace_member(s: &mut State, g: &mut GroupState, i: usize, boot_op: Option<String>) {
    let old = g.members[i].server_id.clone();
    crate::fake_openstack::compute::drop_server(s, &old);
    let m = &g.members[i];
    let server_id = crate::fake_openstack::compute::spawn_server(s, &m.server_name.clone());
    let created = heat_time(s);
    let m = &mut g.members[i];
    (m.server_id, m.status, m.reason, m.boot_op, m.created) = (
        server_id,
        "CREATE_COMPLETE".into(),
        "state changed".into(),
        boot_op,
        created,
    );
}

fn remove_member(s: &mut State, g: &mut GroupState, i: usize) {
    let m = g.members.remove(i);
    crate::fake_openstack::compute::drop_server(s, &m.server_id);
}

fn healthy(g: &GroupState) -> u32 {
    g.members
        .iter()
        .filter(|m| !m.status.ends_with("FAILED"))
        .count() as u32
}

pub(super) fn has_resource(st: &StackState, res: &str) -> bool {
    st.policies.contains_key(res)
        || st
            .group
            .as_ref()
            .is_some_and(|g| g.spec.resource_name == res)
}

pub(super) fn number(v: Option<&Value>) -> Option<u32> {
    match v? {
        Value::String(s) => s.trim().parse::<f64>().ok().map(|f| f as u32),
        Value::Number(n) => n.as_u64().map(|n| n as u32),
        _ => None,
    }
}

fn op_of(params: &BTreeMap<String, Value>) -> Option<String> {
    match params.get("gearshift_op") {
        Some(Value::String(op)) if !op.is_empty() => Some(op.clone()),
        _ => None,
    }
}

/// Heat's AutoScalingGroup resize: the kept members are the last
/// `capacity` of "failed first, then oldest"; failed members that are kept
/// are replaced in place; new ones are added.
fn resize(s: &mut State, g: &mut GroupState, capacity: u32, boot_op: Option<String>) {
    let failed = |m: &FakeMember| m.status.ends_with("FAILED");
    let mut order: Vec<usize> = (0..g.members.len())
        .filter(|&i| failed(&g.members[i]))
        .collect();
    order.extend((0..g.members.len()).filter(|&i| !failed(&g.members[i])));
    let excess = g.members.len().saturating_sub(capacity as usize);
    let mut drop: Vec<usize> = order[..excess].to_vec();
    drop.sort_unstable_by(|a, b| b.cmp(a));
    for i in drop {
        remove_member(s, g, i);
    }
    for i in 0..g.members.len() {
        if failed(&g.members[i]) {
            replace_member(s, g, i, boot_op.clone());
        }
    }
    while (g.members.len() as u32) < capacity {
        add_member(s, g, boot_op.clone());
    }
}

fn clamp(g: &GroupState, n: i64) -> u32 {
    n.clamp(g.spec.min_size as i64, g.spec.max_size as i64) as u32
}

/// Applies a finished stack update to its ResourceGroup.
fn update_resource_group(
    s: &mut State,
    g: &mut GroupState,
    p: &BTreeMap<String, Value>,
    op_changed: bool,
) {
    let count = number(p.get(&g.spec.count_param)).unwrap_or(g.members.len() as u32) as usize;
    let policies = match p.get(&g.spec.removal_param) {
        Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(json!([])),
        Some(v) => v.clone(),
        None => json!([]),
    };
    let blacklist: Vec<String> = policies
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|pol| pol["resource_list"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect();
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
    let op = op_of(p);
    for i in 0..g.members.len() {
        // A marked member is replaced by the next update; a changed op under REPLACE replaces all.
        if g.members[i].status.ends_with("FAILED") || (op_changed && g.spec.op_replaces) {
            replace_member(s, g, i, op.clone());
        }
    }
    while g.members.len() < count {
        add_member(s, g, op.clone());
    }
}

/// The size an AutoScalingGroup is resized to by a stack update.
pub(super) fn desired(g: &GroupState, p: &BTreeMap<String, Value>) -> u32 {
    let n = match &g.spec.desired {
        Some(Desired::Param(name)) => number(p.get(name)).unwrap_or(healthy(g)),
        Some(Desired::Literal(n)) => *n,
        None => healthy(g),
    };
    clamp(g, n as i64)
}

/// Advances an in-progress stack update by one poll; applies it at the end.
pub(super) fn advance(s: &mut State, idx: usize) {
    let st = &mut s.heat.stacks[idx];
    if !st.status.ends_with("_IN_PROGRESS") || st.pending.is_none() {
        return;
    }
    if st.polls_left > 0 {
        st.polls_left -= 1;
        return;
    }
    let old = st.pending.take().expect("pending");
    if let Some(reason) = s.heat.fail_next_update.take() {
        let st = &mut s.heat.stacks[idx];
        (st.status, st.reason) = ("UPDATE_FAILED".into(), reason);
        return;
    }
    let params = s.heat.stacks[idx].parameters.clone();
    let op_changed = old.get("gearshift_op") != params.get("gearshift_op");
    if let Some(mut g) = s.heat.stacks[idx].group.take() {
        match g.spec.kind {
            GroupKind::ResourceGroup => update_resource_group(s, &mut g, &params, op_changed),
            GroupKind::AutoScalingGroup => {
                if op_changed && g.spec.op_replaces {
                    for i in 0..g.members.len() {
                        replace_member(s, &mut g, i, op_of(&params));
                    }
                }
                let capacity = desired(&g, &params);
                resize(s, &mut g, capacity, op_of(&params));
            }
        }
        (g.status, g.reason, g.updated) = (
            "UPDATE_COMPLETE".into(),
            "Stack UPDATE completed successfully".into(),
            Some(heat_time(s)),
        );
        s.heat.stacks[idx].group = Some(g);
    }
    let st = &mut s.heat.stacks[idx];
    (st.status, st.reason) = (
        "UPDATE_COMPLETE".into(),
        "Stack UPDATE completed successfully".into(),
    );
}

/// Advances a signal the group accepted: the next look at the nested stack
/// starts it, `update_polls` looks later it is applied, the group's
/// metadata cleared and the policy's `SIGNAL_COMPLETE` event written.
pub(super) fn advance_group(s: &mut State, idx: usize) {
    let polls = s.heat.update_polls;
    let t = heat_time(s);
    let Some(g) = s.heat.stacks[idx].group.as_mut() else {
        return;
    };
    if g.signal.is_none() {
        return;
    }
    if !g.status.ends_with("_IN_PROGRESS") {
        (g.status, g.reason, g.updated, g.polls_left) = (
            "UPDATE_IN_PROGRESS".into(),
            "Stack UPDATE started".into(),
            Some(t),
            polls,
        );
    }
    if g.polls_left > 0 {
        g.polls_left -= 1;
        return;
    }
    let (policy, adj, reason) = g.signal.take().expect("signal");
    g.scaling_in_progress = false;
    if let Some(why) = s.heat.fail_next_update.take() {
        let g = s.heat.stacks[idx].group.as_mut().expect("group");
        (g.status, g.reason) = ("UPDATE_FAILED".into(), why);
        return;
    }
    let mut g = s.heat.stacks[idx].group.take().expect("group");
    let capacity = clamp(&g, healthy(&g) as i64 + adj as i64);
    resize(s, &mut g, capacity, None);
    let cooldown = s.heat.stacks[idx]
        .cooldowns
        .get(&policy)
        .copied()
        .unwrap_or(0);
    g.cooldown_end = Some(Utc::now() + chrono::Duration::seconds(cooldown as i64));
    g.cooldown_reason = format!("change_in_capacity : {adj}");
    (g.status, g.reason) = (
        "UPDATE_COMPLETE".into(),
        "Stack UPDATE completed successfully".into(),
    );
    s.heat.stacks[idx].group = Some(g);
    let event = event_json(s, idx, &policy, &reason);
    s.heat.stacks[idx].events.push((policy, event));
}

fn event_json(s: &mut State, idx: usize, policy: &str, reason: &str) -> Value {
    let id = s.next_id("e7e1");
    let time = heat_time(s);
    let (base, st) = (s.base.clone(), &s.heat.stacks[idx]);
    let res = format!(
        "{base}/heat/v1/{PROJECT_ID}/stacks/{}/{}/resources/{policy}",
        st.name, st.id
    );
    json!({"id": id, "links": [{"href": format!("{res}/events/{id}"), "rel": "self"}, {"href": res, "rel": "resource"}],
        "event_time": time, "logical_resource_id": policy, "resource_name": policy,
        "physical_resource_id": format!("{policy}-phys"), "resource_status": "SIGNAL_COMPLETE",
        "resource_status_reason": reason})
}

/// The event reason Heat writes for a signal body (`_handle_signal`).
fn signal_reason(details: &Option<Value>) -> String {
    match details {
        None | Some(Value::Null) | Some(Value::String(_)) => "No signal details provided".into(),
        Some(d)
            if ["previous", "current", "reason"]
                .iter()
                .all(|k| d.get(k).is_some()) =>
        {
            let f = |k: &str| {
                d[k].as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| d[k].to_string())
            };
            format!(
                "alarm state changed from {} to {} ({})",
                f("previous"),
                f("current"),
                f("reason")
            )
        }
        Some(_) => "Unknown".into(),
    }
}

/// A policy signal: Heat answers 200 whatever happens next, and acts only
/// when the group is settled, not scaling, out of its cooldown and the
/// adjustment changes its size (else `NoActionRequired`: no event).
pub(super) fn signal_policy(
    s: &mut State,
    idx: usize,
    policy: &str,
    via: &'static str,
    details: Option<Value>,
) -> Result<(), Answer> {
    let st = &s.heat.stacks[idx];
    let Some(adj) = st.policies.get(policy).copied() else {
        return Err(resource_not_found(policy, &st.name));
    };
    let acts = st.status.ends_with("_COMPLETE")
        && st.group.as_ref().is_some_and(|g| {
            g.status.ends_with("_COMPLETE")
                && g.signal.is_none()
                && !g.scaling_in_progress
                && g.cooldown_end.is_none_or(|t| t <= Utc::now())
                && clamp(g, healthy(g) as i64 + adj as i64) != healthy(g)
        });
    let reason = signal_reason(&details);
    s.signals.push(Signal {
        stack: st.name.clone(),
        resource: policy.into(),
        via,
        details,
        applied: acts,
    });
    if acts && let Some(g) = s.heat.stacks[idx].group.as_mut() {
        g.scaling_in_progress = true;
        g.signal = Some((policy.to_string(), adj, reason));
    }
    Ok(())
}

/// Checks a stack PATCH body and returns its parameters.
pub(super) fn patch_params(
    s: &mut State,
    req: &Req,
    st: usize,
) -> Result<serde_json::Map<String, Value>, Answer> {
    let Some(body) = req.body.clone().filter(Value::is_object) else {
        return Err(violation(s, req, "stack update needs a JSON object body"));
    };
    // Heat ignores unknown top-level keys (`{"parameters": {}, "bogus": 1}` -> 202).
    let Some(params) = body
        .get("parameters")
        .cloned()
        .unwrap_or(json!({}))
        .as_object()
        .cloned()
    else {
        return Err(violation(s, req, "parameters must be an object"));
    };
    if let Some(g) = &s.heat.stacks[st].group
        && let Some(rp) = params.get(&g.spec.removal_param)
    {
        let parsed = match rp {
            Value::String(t) => serde_json::from_str::<Value>(t).ok(),
            v => Some(v.clone()),
        };
        let ok = parsed.as_ref().and_then(Value::as_array).is_some_and(|l| {
            l.iter().all(|p| {
                p.as_object().is_some_and(|o| {
                    o.keys().all(|k| k == "resource_list")
                        && o["resource_list"]
                            .as_array()
                            .is_some_and(|rl| rl.iter().all(Value::is_string))
                })
            })
        });
        if !ok {
            return Err(violation(
                s,
                req,
                "removal_policies must be [{\"resource_list\": [names]}]",
            ));
        }
    }
    Ok(params)
}

/// `PATCH stacks/{name}/{id}`: 202 (an HTML page) even while an update
/// runs: the new one supersedes it, and for an AutoScalingGroup it also
/// drops a signal being applied.
pub(super) fn patch_stack(s: &mut State, req: &Req, name: &str, id: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return stack_not_found(name);
    };
    let params = match patch_params(s, req, i) {
        Ok(p) => p,
        Err(a) => return a,
    };
    let t = heat_time(s);
    let polls = s.heat.update_polls;
    let st = &mut s.heat.stacks[i];
    let before = st.parameters.clone();
    st.pending.get_or_insert(before);
    st.parameters.extend(params);
    (st.status, st.reason, st.updated, st.polls_left) = (
        "UPDATE_IN_PROGRESS".into(),
        "Stack UPDATE started".into(),
        Some(t),
        polls,
    );
    if let Some(g) = st
        .group
        .as_mut()
        .filter(|g| g.spec.kind == GroupKind::AutoScalingGroup)
    {
        g.signal = None;
        g.scaling_in_progress = false;
    }
    html(202, Vec::new())
}
