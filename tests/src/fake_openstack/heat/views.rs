//! What the fake Heat shows: stacks, nested stacks and resources as JSON,
//! the template a stack stands for, update previews, a group's metadata and
//! a policy's events, shaped as Heat 27 answers them
//! (`docs/openstack-conformance.md`).

use serde_json::{Value, json};

use super::scaling::{desired, has_resource, number, patch_params};
use super::{
    Desired, FakeMember, GroupKind, GroupState, StackState, find_stack, resource_not_found,
    stack_not_found,
};
use crate::fake_openstack::{Answer, PROJECT_ID, Req, State};

fn change(g: &GroupState, name: &str) -> Value {
    json!({"resource_name": name, "resource_type": "OS::Nova::Server", "parent_resource": g.spec.resource_name,
        "physical_resource_id": "", "resource_action": "INIT", "resource_status": "COMPLETE"})
}

/// `PATCH stacks/{name}/{id}/preview?show_nested=true`: what the update would do.
pub(super) fn preview(s: &mut State, req: &Req, name: &str, id: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return stack_not_found(name);
    };
    let params = match patch_params(s, req, i) {
        Ok(p) => p,
        Err(a) => return a,
    };
    let st = &s.heat.stacks[i];
    let mut next = st.parameters.clone();
    next.extend(params);
    let op_changed = st.parameters.get("gearshift_op") != next.get("gearshift_op");
    let (mut replaced, mut unchanged, mut added, mut updated) = (vec![], vec![], vec![], vec![]);
    if let Some(g) = &st.group {
        updated.push(json!({"resource_name": g.spec.resource_name, "resource_type": "OS::Heat::ResourceGroup"}));
        let keep = match g.spec.kind {
            GroupKind::ResourceGroup => number(next.get(&g.spec.count_param)).unwrap_or(0) as usize,
            GroupKind::AutoScalingGroup => desired(g, &next) as usize,
        };
        for m in g.members.iter().take(keep) {
            let c = change(g, &m.name);
            if op_changed && g.spec.op_replaces {
                replaced.push(c)
            } else {
                unchanged.push(c)
            }
        }
        for k in g.members.len()..keep {
            added.push(change(
                g,
                &(g.next_index as usize + k - g.members.len()).to_string(),
            ));
        }
    }
    Answer::json(
        200,
        json!({"resource_changes": {"added": added, "deleted": [], "replaced": replaced, "unchanged": unchanged, "updated": updated}}),
    )
}

/// `GET stacks/{name}/{id}/template`: the template the fake stack stands for.
pub(super) fn template(s: &mut State, name: &str, id: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return stack_not_found(name);
    };
    let st = &s.heat.stacks[i];
    let mut resources = serde_json::Map::new();
    let mut parameters = serde_json::Map::new();
    parameters.insert(
        "gearshift_op".into(),
        json!({"type": "string", "default": ""}),
    );
    if let Some(g) = &st.group {
        let policy = if g.spec.op_replaces {
            "REPLACE"
        } else {
            "IGNORE"
        };
        let server = json!({"type": "OS::Nova::Server", "properties": {"user_data": {"get_param": "gearshift_op"}, "user_data_update_policy": policy}});
        let group = match g.spec.kind {
            GroupKind::ResourceGroup => {
                parameters.insert(g.spec.count_param.clone(), json!({"type": "number"}));
                parameters.insert(
                    g.spec.removal_param.clone(),
                    json!({"type": "json", "default": []}),
                );
                json!({"type": "OS::Heat::ResourceGroup", "properties": {"count": {"get_param": g.spec.count_param},
                    "removal_policies": {"get_param": g.spec.removal_param}, "resource_def": server}})
            }
            GroupKind::AutoScalingGroup => {
                let mut p = json!({"min_size": g.spec.min_size, "max_size": g.spec.max_size, "resource": server});
                match &g.spec.desired {
                    Some(Desired::Param(d)) => {
                        parameters.insert(d.clone(), json!({"type": "number"}));
                        p["desired_capacity"] = json!({"get_param": d});
                    }
                    Some(Desired::Literal(n)) => p["desired_capacity"] = json!(n),
                    None => {}
                }
                json!({"type": "OS::Heat::AutoScalingGroup", "properties": p})
            }
        };
        resources.insert(g.spec.resource_name.clone(), group);
        for (p, adj) in &st.policies {
            let cooldown = st.cooldowns.get(p).copied().unwrap_or(0);
            resources.insert(p.clone(), json!({"type": "OS::Heat::ScalingPolicy", "properties": {"adjustment_type": "change_in_capacity",
                "auto_scaling_group_id": {"get_resource": g.spec.resource_name}, "scaling_adjustment": adj, "cooldown": cooldown}}));
        }
    }
    Answer::json(
        200,
        json!({"heat_template_version": "2018-08-31", "parameters": parameters, "resources": resources}),
    )
}

/// `GET .../resources/{r}/metadata`: an AutoScalingGroup's
/// `cooldown_end` and `scaling_in_progress`; `{}` for other resources.
pub(super) fn metadata(s: &mut State, name: &str, id: &str, res: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return stack_not_found(name);
    };
    let st = &s.heat.stacks[i];
    if !has_resource(st, res) {
        return resource_not_found(res, name);
    }
    let meta = match &st.group {
        Some(g) if g.spec.resource_name == res && g.spec.kind == GroupKind::AutoScalingGroup => {
            let mut m = json!({"scaling_in_progress": g.scaling_in_progress});
            if let Some(t) = g.cooldown_end {
                m["cooldown_end"] = json!({t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string(): g.cooldown_reason});
            }
            m
        }
        _ => json!({}),
    };
    Answer::json(200, json!({"metadata": meta}))
}

/// `GET .../resources/{r}/events`: the policy's `SIGNAL` events (the fake
/// keeps no others); a filter matching none is Heat's 404 `HTTPNotFound`.
pub(super) fn events(s: &mut State, req: &Req, name: &str, id: &str, res: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return stack_not_found(name);
    };
    let st = &s.heat.stacks[i];
    if !has_resource(st, res) {
        return resource_not_found(res, name);
    }
    let action = req.param("resource_action");
    let mut out: Vec<Value> = st
        .events
        .iter()
        .filter(|(p, _)| p == res && action.as_deref().is_none_or(|a| a == "SIGNAL"))
        .map(|(_, e)| e.clone())
        .collect();
    if req.param("sort_dir").as_deref() == Some("desc") {
        out.reverse();
    }
    if let Some(n) = req.param("limit").and_then(|l| l.parse::<usize>().ok()) {
        out.truncate(n);
    }
    if out.is_empty() && action.is_some() {
        return Answer::json(
            404,
            json!({"explanation": "The resource could not be found.", "code": 404,
            "error": {"message": format!("No events found for resource {res}"), "traceback": null, "type": "HTTPNotFound"}, "title": "Not Found"}),
        );
    }
    Answer::json(200, json!({ "events": out }))
}

pub(super) fn stack_json(st: &StackState, base: &str) -> Value {
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
        "capabilities": [], "creation_time": st.created, "deletion_time": null,
        "description": "gearshift test stack", "disable_rollback": true, "id": st.id,
        "links": [{"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{}/{}", st.name, st.id), "rel": "self"}],
        "notification_topics": [], "outputs": [], "parameters": params, "parent": null,
        "stack_name": st.name, "stack_owner": null, "stack_status": st.status,
        "stack_status_reason": st.reason, "stack_user_project_id": "8f3c9ee6f1a9446d9f0f0e0d8c5a3b2d",
        "tags": null, "template_description": "gearshift test stack", "timeout_mins": null,
        "updated_time": st.updated,
    })
}

pub(super) fn nested_json(st: &StackState, g: &GroupState, base: &str) -> Value {
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

/// `self` and `stack` links of a resource.
fn links(base: &str, stack: &str, sid: &str, res: &str) -> Value {
    json!([
        {"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{stack}/{sid}/resources/{res}"), "rel": "self"},
        {"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{stack}/{sid}"), "rel": "stack"},
    ])
}

pub(super) fn member_json(g: &GroupState, m: &FakeMember, base: &str) -> Value {
    json!({
        "resource_name": m.name, "resource_type": "OS::Nova::Server",
        "physical_resource_id": m.server_id, "resource_status": m.status,
        "resource_status_reason": m.reason, "required_by": [],
        "parent_resource": g.spec.resource_name,
        "updated_time": m.created, "creation_time": m.created,
        "logical_resource_id": m.name,
        "links": links(base, &g.nested_name, &g.nested_id, &m.name),
    })
}

pub(super) fn resources_json(st: &StackState, depth: u32, base: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(g) = &st.group {
        let ty = match g.spec.kind {
            GroupKind::ResourceGroup => "OS::Heat::ResourceGroup",
            GroupKind::AutoScalingGroup => "OS::Heat::AutoScalingGroup",
        };
        let mut group_links = links(base, &st.name, &st.id, &g.spec.resource_name);
        if let Some(l) = group_links.as_array_mut() {
            l.push(json!({"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{}/{}", g.nested_name, g.nested_id), "rel": "nested"}));
        }
        out.push(json!({
            "resource_name": g.spec.resource_name, "resource_type": ty,
            "physical_resource_id": g.nested_id, "resource_status": "UPDATE_COMPLETE",
            "resource_status_reason": "state changed", "required_by": [],
            "updated_time": st.created, "creation_time": st.created,
            "logical_resource_id": g.spec.resource_name, "links": group_links,
        }));
        if depth >= 1 {
            out.extend(g.members.iter().map(|m| member_json(g, m, base)));
        }
    }
    for p in st.policies.keys() {
        out.push(json!({
            "resource_name": p, "resource_type": "OS::Heat::ScalingPolicy",
            "physical_resource_id": format!("{p}-phys"), "resource_status": "CREATE_COMPLETE",
            "resource_status_reason": "state changed", "required_by": [],
            "updated_time": st.created, "creation_time": st.created,
            "logical_resource_id": p, "links": links(base, &st.name, &st.id, p),
        }));
    }
    out
}
