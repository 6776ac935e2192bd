//! The fake Heat's HTTP API: the native API (`/heat/v1/{tenant}`) and the
//! pre-signed cfn alarm URLs (refusals in XML, as heat-api-cfn sends them).

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{find_group, find_stack, html, resource_not_found, scaling, stack_not_found, views};
use crate::fake_openstack::{Answer, PROJECT_ID, Req, State, violation};

fn get_stack_redirect(s: &mut State, name: &str) -> Answer {
    let base = s.base.clone();
    let target = if let Some(i) = find_stack(s, name, None) {
        Some((s.heat.stacks[i].name.clone(), s.heat.stacks[i].id.clone()))
    } else {
        find_group(s, name, None).map(|i| {
            let g = s.heat.stacks[i].group.as_ref().expect("group");
            (g.nested_name.clone(), g.nested_id.clone())
        })
    };
    match target {
        Some((n, id)) => html(
            302,
            vec![(
                "location".into(),
                format!("{base}/heat/v1/{PROJECT_ID}/stacks/{n}/{id}"),
            )],
        ),
        None => stack_not_found(name),
    }
}

fn get_stack(s: &mut State, name: &str, id: &str) -> Answer {
    let base = s.base.clone();
    if let Some(i) = find_stack(s, name, Some(id)) {
        scaling::advance(s, i);
        return Answer::json(
            200,
            json!({"stack": views::stack_json(&s.heat.stacks[i], &base)}),
        );
    }
    match find_group(s, name, Some(id)) {
        Some(i) => {
            scaling::advance_group(s, i);
            let st = &s.heat.stacks[i];
            let g = st.group.as_ref().expect("group");
            Answer::json(200, json!({"stack": views::nested_json(st, g, &base)}))
        }
        None => stack_not_found(name),
    }
}

fn list_resources(s: &mut State, req: &Req, name: &str, id: &str) -> Answer {
    let base = s.base.clone();
    let depth: u32 = match req.param("nested_depth") {
        Some(d) => match d.parse() {
            Ok(d) => d,
            Err(_) => return violation(s, req, "nested_depth must be an integer"),
        },
        None => 0,
    };
    if let Some(i) = find_stack(s, name, Some(id)) {
        return Answer::json(
            200,
            json!({ "resources": views::resources_json(&s.heat.stacks[i], depth, &base) }),
        );
    }
    match find_group(s, name, Some(id)) {
        Some(i) => {
            let g = s.heat.stacks[i].group.as_ref().expect("group");
            let out: Vec<Value> = g
                .members
                .iter()
                .map(|m| views::member_json(g, m, &base))
                .collect();
            Answer::json(200, json!({ "resources": out }))
        }
        None => stack_not_found(name),
    }
}

/// `PATCH stacks/{name}/{id}/resources/{res}`: mark (or unmark) unhealthy.
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
    if let Some(i) = find_group(s, name, Some(id)) {
        let g = s.heat.stacks[i].group.as_mut().expect("group");
        let Some(m) = g.members.iter_mut().find(|m| m.name == res) else {
            return resource_not_found(res, name);
        };
        m.status = if mark {
            "CHECK_FAILED"
        } else {
            "CHECK_COMPLETE"
        }
        .into();
        m.reason = reason;
        return Answer::json(200, Value::Null);
    }
    match find_stack(s, name, Some(id)) {
        Some(i) if scaling::has_resource(&s.heat.stacks[i], res) => Answer::json(200, Value::Null),
        Some(_) => resource_not_found(res, name),
        None => stack_not_found(name),
    }
}

pub(crate) fn route(s: &mut State, req: &mut Req) -> Answer {
    let prefix = format!("/heat/v1/{PROJECT_ID}/");
    if !req.path.starts_with(&prefix) {
        return violation(s, req, "the tenant id in the Heat URL is not the project's");
    }
    let segs = req.segments(&prefix);
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (req.method.clone(), segs.as_slice()) {
        (Method::GET, ["stacks", name]) => get_stack_redirect(s, name),
        (Method::GET, ["stacks", name, id]) => get_stack(s, name, id),
        (Method::PATCH, ["stacks", name, id]) => scaling::patch_stack(s, req, name, id),
        (Method::PATCH, ["stacks", name, id, "preview"]) => views::preview(s, req, name, id),
        (Method::GET, ["stacks", name, id, "template"]) => views::template(s, name, id),
        (Method::GET, ["stacks", name, id, "resources"]) => list_resources(s, req, name, id),
        (Method::PATCH, ["stacks", name, id, "resources", res]) => {
            mark_resource(s, req, name, id, res)
        }
        (Method::GET, ["stacks", name, id, "resources", res, "metadata"]) => {
            views::metadata(s, name, id, res)
        }
        (Method::GET, ["stacks", name, id, "resources", res, "events"]) => {
            views::events(s, req, name, id, res)
        }
        (Method::POST, ["stacks", name, id, "resources", res, "signal"]) => {
            let Some(i) = find_stack(s, name, Some(id)) else {
                return stack_not_found(name);
            };
            let details = req.body.clone();
            match scaling::signal_policy(s, i, res, "signal", details) {
                Ok(()) => Answer::json(200, Value::Null),
                Err(a) => a,
            }
        }
        _ => violation(s, req, "no such Heat API call"),
    }
}

fn xml_error(status: u16, code: &str, message: &str) -> Answer {
    let body = format!(
        "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error></ErrorResponse>"
    );
    let status = StatusCode::from_u16(status).expect("status");
    Answer(
        status,
        vec![(
            "content-type".into(),
            "application/xml; charset=UTF-8".into(),
        )],
        Some(Value::String(body)),
    )
}

/// heat-api-cfn: `POST /v1/signal/<ARN>?SignatureMethod=...&Signature=...`.
pub(crate) fn cfn_signal(s: &mut State, req: &mut Req) -> Answer {
    let denied = || {
        xml_error(
            403,
            "AccessDenied",
            "User is not authorized to perform action",
        )
    };
    let segs = req.segments("/heat-cfn/v1/signal/");
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let [arn, name, id, "resources", policy] = segs.as_slice() else {
        return violation(
            s,
            req,
            "expected /v1/signal/arn:openstack:heat::<project>:stacks/<name>/<id>/resources/<policy>",
        );
    };
    if !arn.starts_with("arn:openstack:heat::") || !arn.ends_with(":stacks") {
        return violation(s, req, format!("unexpected ARN {arn}"));
    }
    let Some(sig) = req.param("Signature") else {
        s.violations.push(format!(
            "{} {}: the pre-signed URL lost its Signature",
            req.method, req.path
        ));
        return xml_error(
            400,
            "IncompleteSignature",
            "The request signature does not conform to AWS standards",
        );
    };
    let expected = percent_encoding::percent_decode_str(&scaling::expected_signature(name, policy))
        .decode_utf8_lossy()
        .into_owned();
    if req.method != Method::POST || sig != expected {
        return denied(); // the signature covers the verb
    }
    let Some(idx) = find_stack(s, name, Some(id)) else {
        return stack_not_found(name);
    };
    let details = req.body.clone();
    if let Err(a) = scaling::signal_policy(s, idx, policy, "alarm_url", details) {
        return a;
    }
    Answer(
        StatusCode::OK,
        vec![("content-type".into(), "text/html; charset=UTF-8".into())],
        Some(Value::String(String::new())),
    )
}
