//! The fake Heat's HTTP API: the native API (`/heat/v1/{tenant}`) and the
//! pre-signed cfn alarm URLs.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{
    GroupKind, Pending, advance, advance_group, expected_signature, find_group, find_stack,
    in_progress, nested_json, not_found, signal_policy, stack_json, start_change,
};
use crate::fake_openstack::{Answer, PROJECT_ID, Req, State, violation};

pub(crate) fn cfn_signal(s: &mut State, req: &mut Req) -> Answer {
    if req.method != Method::POST {
        return violation(s, req, "alarm URLs take POST");
    }
    if req.header("x-auth-token").is_some() {
        return violation(s, req, "a token was sent to a pre-signed alarm URL");
    }
    let segs = req.segments("/heat-cfn/v1/signal/");
    let [arn] = segs.as_slice() else {
        return violation(s, req, "expected /v1/signal/<arn>");
    };
    for p in [
        "Timestamp",
        "SignatureMethod",
        "AWSAccessKeyId",
        "SignatureVersion",
        "Signature",
    ] {
        if req.param(p).is_none() {
            return violation(
                s,
                req,
                format!("pre-signed URL lost its {p} query parameter"),
            );
        }
    }
    // arn:openstack:heat::<tenant>:stacks/<name>/<id>/resources/<policy>
    let tail = arn.split_once(":stacks/").map(|(_, t)| t).unwrap_or("");
    let parts: Vec<&str> = tail.split('/').collect();
    let [name, id, "resources", policy] = parts.as_slice() else {
        return violation(s, req, format!("unexpected ARN {arn}"));
    };
    let sig = req.param("Signature").unwrap_or_default();
    let expected = percent_encoding::percent_decode_str(&expected_signature(name, policy))
        .decode_utf8_lossy()
        .into_owned();
    if sig != expected {
        return Answer::json(
            403,
            json!({"Error": {"Code": "SignatureError", "Message": "The request signature we calculated does not match the signature you provided.", "Type": "Sender"}}),
        );
    }
    let Some(idx) = find_stack(s, name, Some(id)) else {
        return not_found(&format!("The Stack ({name}) could not be found."));
    };
    let details = req.body.clone();
    signal_policy(s, idx, policy, "alarm_url", details)
}

pub(crate) fn route(s: &mut State, req: &mut Req) -> Answer {
    let prefix = format!("/heat/v1/{PROJECT_ID}/");
    if !req.path.starts_with(&prefix) {
        return violation(s, req, "the tenant id in the Heat URL is not the project's");
    }
    let segs = req.segments(&prefix);
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (req.method.clone(), segs.as_slice()) {
        (Method::GET, ["stacks", name]) => lookup_stack(s, name),
        (Method::GET, ["stacks", name, id]) => get_stack(s, name, id),
        (Method::PATCH, ["stacks", name, id]) => update_stack(s, req, name, id),
        (Method::GET, ["stacks", name, id, "resources"]) => list_resources(s, req, name, id),
        (Method::PATCH, ["stacks", name, id, "resources", res]) => {
            mark_resource(s, req, name, id, res)
        }
        (Method::POST, ["stacks", name, id, "resources", res, "signal"]) => {
            let Some(i) = find_stack(s, name, Some(id)) else {
                return no_stack(name);
            };
            let details = req.body.clone();
            signal_policy(s, i, res, "signal", details)
        }
        _ => violation(s, req, "no such Heat API call"),
    }
}

fn no_stack(name: &str) -> Answer {
    not_found(&format!("The Stack ({name}) could not be found."))
}

/// `GET /stacks/{name}`: a redirect to the stack (or nested group stack).
fn lookup_stack(s: &State, name: &str) -> Answer {
    let target = if let Some(i) = find_stack(s, name, None) {
        Some((s.heat.stacks[i].name.clone(), s.heat.stacks[i].id.clone()))
    } else {
        find_group(s, name, None).map(|i| {
            let g = s.heat.stacks[i].group.as_ref().expect("group");
            (g.nested_name.clone(), g.nested_id.clone())
        })
    };
    match target {
        Some((n, id)) => {
            let loc = format!("{}/heat/v1/{PROJECT_ID}/stacks/{n}/{id}", s.base);
            Answer(
                StatusCode::FOUND,
                vec![("location".into(), loc)],
                Some(json!({})),
            )
        }
        None => no_stack(name),
    }
}

/// `GET /stacks/{name}/{id}` of a stack or of a nested group stack.
fn get_stack(s: &mut State, name: &str, id: &str) -> Answer {
    let base = s.base.clone();
    if let Some(i) = find_stack(s, name, Some(id)) {
        advance(s, i);
        return Answer::json(200, json!({"stack": stack_json(&s.heat.stacks[i], &base)}));
    }
    match find_group(s, name, Some(id)) {
        Some(i) => {
            advance_group(s, i);
            let st = &s.heat.stacks[i];
            let g = st.group.as_ref().expect("group");
            Answer::json(200, json!({"stack": nested_json(st, g, &base)}))
        }
        None => no_stack(name),
    }
}

/// Fields of a stack update (`PATCH`) body.
const UPDATE_FIELDS: [&str; 11] = [
    "parameters",
    "template",
    "template_url",
    "files",
    "environment",
    "timeout_mins",
    "disable_rollback",
    "clear_parameters",
    "tags",
    "converge",
    "parameter_defaults",
];

/// `PATCH /stacks/{name}/{id}`: a parameter update.
fn update_stack(s: &mut State, req: &Req, name: &str, id: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return no_stack(name);
    };
    let Some(body) = req.body.clone().filter(Value::is_object) else {
        return violation(s, req, "stack update needs a JSON object body");
    };
    for k in body.as_object().expect("object").keys() {
        if !UPDATE_FIELDS.contains(&k.as_str()) {
            return violation(s, req, format!("unknown stack update field {k:?}"));
        }
    }
    let params = body.get("parameters").cloned().unwrap_or(json!({}));
    let Some(params) = params.as_object().cloned() else {
        return violation(s, req, "parameters must be an object");
    };
    if let Some(g) = &s.heat.stacks[i].group
        && let Some(rp) = params.get(&g.spec.removal_param)
        && !removal_policies_ok(rp)
    {
        return violation(
            s,
            req,
            "removal_policies must be [{\"resource_list\": [names]}]",
        );
    }
    let status = s.heat.stacks[i].status.clone();
    if status.ends_with("_IN_PROGRESS") {
        return in_progress(name, &status);
    }
    start_change(s, i, Pending::Update(params));
    Answer::empty(202)
}

/// `[{"resource_list": [names]}]`, as a list or as its JSON text.
fn removal_policies_ok(rp: &Value) -> bool {
    let parsed = match rp {
        Value::String(t) => serde_json::from_str::<Value>(t).ok(),
        v => Some(v.clone()),
    };
    parsed.as_ref().and_then(Value::as_array).is_some_and(|l| {
        l.iter().all(|p| {
            p.as_object().is_some_and(|o| {
                o.keys().all(|k| k == "resource_list")
                    && o["resource_list"]
                        .as_array()
                        .is_some_and(|rl| rl.iter().all(Value::is_string))
            })
        })
    })
}

/// `GET /stacks/{name}/{id}/resources[?nested_depth=N]`.
fn list_resources(s: &mut State, req: &Req, name: &str, id: &str) -> Answer {
    let Some(i) = find_stack(s, name, Some(id)) else {
        return no_stack(name);
    };
    let depth: u32 = match req.param("nested_depth") {
        Some(d) => match d.parse() {
            Ok(d) => d,
            Err(_) => return violation(s, req, "nested_depth must be an integer"),
        },
        None => 0,
    };
    let base = s.base.clone();
    let st = &s.heat.stacks[i];
    let link = |stack: &str, sid: &str, res: &str| {
        json!([
            {"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{stack}/{sid}/resources/{res}"), "rel": "self"},
            {"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{stack}/{sid}"), "rel": "stack"},
        ])
    };
    let mut out = Vec::new();
    if let Some(g) = &st.group {
        let ty = match g.spec.kind {
            GroupKind::ResourceGroup => "OS::Heat::ResourceGroup",
            GroupKind::AutoScalingGroup => "OS::Heat::AutoScalingGroup",
        };
        let mut group_links = link(&st.name, &st.id, &g.spec.resource_name);
        if let Some(l) = group_links.as_array_mut() {
            l.push(json!({"href": format!("{base}/heat/v1/{PROJECT_ID}/stacks/{}/{}", g.nested_name, g.nested_id), "rel": "nested"}));
        }
        out.push(json!({
            "resource_name": g.spec.resource_name, "resource_type": ty,
            "physical_resource_id": g.nested_id, "resource_status": "UPDATE_COMPLETE",
            "resource_status_reason": "state changed", "required_by": [],
            "updated_time": st.created, "creation_time": st.created,
            "logical_resource_id": g.spec.resource_name,
            "links": group_links,
        }));
        if depth >= 1 {
            for m in &g.members {
                out.push(json!({
                    "resource_name": m.name, "resource_type": "OS::Nova::Server",
                    "physical_resource_id": m.server_id, "resource_status": m.status,
                    "resource_status_reason": m.reason, "required_by": [],
                    "parent_resource": g.spec.resource_name,
                    "updated_time": st.created, "creation_time": st.created,
                    "logical_resource_id": m.name,
                    "links": link(&g.nested_name, &g.nested_id, &m.name),
                }));
            }
        }
    }
    for p in st.policies.keys() {
        out.push(json!({
            "resource_name": p, "resource_type": "OS::Heat::ScalingPolicy",
            "physical_resource_id": format!("{p}-phys"), "resource_status": "CREATE_COMPLETE",
            "resource_status_reason": "state changed", "required_by": [],
            "updated_time": st.created, "creation_time": st.created,
            "logical_resource_id": p, "links": link(&st.name, &st.id, p),
        }));
    }
    Answer::json(200, json!({ "resources": out }))
}

/// `PATCH /stacks/{name}/{id}/resources/{res}`: mark (un)healthy.
fn mark_resource(s: &mut State, req: &Req, name: &str, id: &str, res: &str) -> Answer {
    let body = req.body.clone().unwrap_or(Value::Null);
    let ok_shape = body.as_object().is_some_and(|o| {
        o.get("mark_unhealthy").is_some_and(Value::is_boolean)
            && o.keys()
                .all(|k| k == "mark_unhealthy" || k == "resource_status_reason")
            && o.get("resource_status_reason").is_none_or(Value::is_string)
    });
    if !ok_shape {
        return violation(
            s,
            req,
            "resource PATCH body must be {\"mark_unhealthy\": bool, \"resource_status_reason\": str}",
        );
    }
    let mark = body["mark_unhealthy"].as_bool().unwrap_or(false);
    let reason = body["resource_status_reason"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let no_resource = || {
        not_found(&format!(
            "The Resource ({res}) could not be found in Stack {name}."
        ))
    };
    // The resource may be a top-level one or a group member in a nested stack.
    for st in s.heat.stacks.iter_mut() {
        if let Some(g) = st.group.as_mut()
            && g.nested_name == name
            && g.nested_id == id
        {
            let Some(m) = g.members.iter_mut().find(|m| m.name == res) else {
                return no_resource();
            };
            m.status = if mark {
                "CHECK_FAILED"
            } else {
                "CHECK_COMPLETE"
            }
            .into();
            m.reason = reason;
            return Answer::empty(200);
        }
    }
    match find_stack(s, name, Some(id)) {
        Some(i)
            if s.heat.stacks[i].policies.contains_key(res)
                || s.heat.stacks[i]
                    .group
                    .as_ref()
                    .is_some_and(|g| g.spec.resource_name == res) =>
        {
            Answer::empty(200)
        }
        Some(_) => no_resource(),
        None => no_stack(name),
    }
}
