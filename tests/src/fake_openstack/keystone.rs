//! The fake Keystone v3: `POST /v3/auth/tokens` with a password or an
//! application credential, answering a project-scoped token and the
//! catalog.

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::http::unauthorized;
use super::{
    APP_CRED_ID, APP_CRED_NAME, APP_CRED_SECRET, Answer, PASSWORD, PROJECT_ID, PROJECT_NAME,
    REGION, Req, State, USER_ID, USERNAME, violation,
};

fn catalog(base: &str) -> Value {
    let svc = |ty: &str, name: &str, url: String| {
        json!({
            "id": format!("{name}-{ty}"),
            "type": ty,
            "name": name,
            "endpoints": [
                {"id": format!("{name}-pub"), "interface": "public", "region": REGION, "region_id": REGION, "url": url},
                {"id": format!("{name}-int"), "interface": "internal", "region": REGION, "region_id": REGION, "url": url},
            ]
        })
    };
    json!([
        svc("identity", "keystone", format!("{base}/identity")),
        svc("compute", "nova", format!("{base}/compute/v2.1")),
        svc(
            "block-storage",
            "cinder",
            format!("{base}/volume/v3/{PROJECT_ID}")
        ),
        svc(
            "volumev3",
            "cinderv3",
            format!("{base}/volume/v3/{PROJECT_ID}")
        ),
        svc(
            "orchestration",
            "heat",
            format!("{base}/heat/v1/{PROJECT_ID}")
        ),
        svc("cloudformation", "heat-cfn", format!("{base}/heat-cfn/v1")),
        svc("container-infra", "magnum", format!("{base}/magnum/v1")),
        svc("image", "glance", format!("{base}/image")),
        svc("network", "neutron", format!("{base}/network")),
    ])
}

/// Keystone: `POST /v3/auth/tokens` (password or application_credential).
pub(super) fn keystone(s: &mut State, req: &mut Req) -> Answer {
    if req.path != "/identity/v3/auth/tokens" || req.method != Method::POST {
        return violation(s, req, "only POST /v3/auth/tokens is served");
    }
    if !req.json_body_ok() || req.body.is_none() {
        return violation(s, req, "POST /v3/auth/tokens needs a JSON body");
    }
    let body = req.body.clone().unwrap_or(Value::Null);
    let auth = &body["auth"];
    let methods = &auth["identity"]["methods"];
    let method = match methods.as_array().map(|m| m.as_slice()) {
        Some([m]) => m.as_str().unwrap_or("").to_string(),
        _ => return violation(s, req, "auth.identity.methods must be a one-element list"),
    };
    let checked = match method.as_str() {
        "password" => password(auth),
        "application_credential" => application_credential(auth),
        other => Err(Bad::Shape(format!("unsupported method {other:?}"))),
    };
    match checked {
        Ok(()) => issue_token(s, &method),
        Err(Bad::Credentials) => unauthorized(),
        Err(Bad::Answer(answer)) => answer,
        Err(Bad::Shape(why)) => violation(s, req, why),
    }
}

/// Why a token request was refused.
enum Bad {
    /// Wrong credentials: `401`.
    Credentials,
    /// Not what the API documents: a violation.
    Shape(String),
    /// Refused with Keystone's own answer (status and message as measured).
    Answer(Answer),
}

fn shape(why: &str) -> Bad {
    Bad::Shape(why.to_string())
}

/// The password method, with a project scope or none.
fn password(auth: &Value) -> Result<(), Bad> {
    let user = &auth["identity"]["password"]["user"];
    let by_id = user["id"].as_str() == Some(USER_ID);
    let domain_ok = user["domain"]["name"].as_str() == Some("Default")
        || user["domain"]["id"].as_str() == Some("default");
    let by_name = user["name"].as_str() == Some(USERNAME);
    if user["name"].is_string() && !user["domain"].is_object() {
        return Err(shape("a user given by name needs its domain"));
    }
    if !(by_id || (by_name && domain_ok)) || user["password"].as_str() != Some(PASSWORD) {
        return Err(Bad::Credentials);
    }
    let proj = &auth["scope"]["project"];
    // Without a scope Keystone 30 answers 201, scoped to the user's default
    // project (the test user has one): as here.
    if proj["name"].is_string() && !proj["domain"].is_object() {
        return Err(shape("a project given by name needs its domain"));
    }
    let pok = !proj.is_object()
        || proj["id"].as_str() == Some(PROJECT_ID)
        || (proj["name"].as_str() == Some(PROJECT_NAME)
            && (proj["domain"]["name"].as_str() == Some("Default")
                || proj["domain"]["id"].as_str() == Some("default")));
    if !pok {
        return Err(Bad::Credentials);
    }
    Ok(())
}

/// The application credential method as Keystone 30 answers it: by id, or
/// by name with its user; `401` for any scope (even the credential's own
/// project) and `404` for an unknown id.
fn application_credential(auth: &Value) -> Result<(), Bad> {
    let ac = &auth["identity"]["application_credential"];
    if auth.get("scope").is_some() {
        return Err(Bad::Answer(Answer::json(
            401,
            json!({"error": {"code": 401, "identity": {}, "message": "Error authenticating with application credential: Application credentials cannot request a scope.", "title": "Unauthorized"}}),
        )));
    }
    let by_id = ac["id"].as_str();
    let by_name = ac["name"].as_str() == Some(APP_CRED_NAME)
        && (ac["user"]["id"].as_str() == Some(USER_ID)
            || (ac["user"]["name"].as_str() == Some(USERNAME) && ac["user"]["domain"].is_object()));
    if let Some(id) = by_id.filter(|id| *id != APP_CRED_ID) {
        return Err(Bad::Answer(Answer::json(
            404,
            json!({"error": {"code": 404, "message": format!("Could not find Application Credential: {id}."), "title": "Not Found"}}),
        )));
    }
    if !(by_id.is_some() || by_name) || ac["secret"].as_str() != Some(APP_CRED_SECRET) {
        return Err(Bad::Credentials);
    }
    Ok(())
}

/// A new token (`X-Subject-Token`) with the catalog.
fn issue_token(s: &mut State, method: &str) -> Answer {
    s.token_counter += 1;
    let token = format!("gAAAAABfake{:08}", s.token_counter);
    let now = Utc::now();
    let expires = now + chrono::Duration::from_std(s.token_ttl).unwrap_or_default();
    s.tokens.insert(token.clone(), expires);
    let fmt = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let body = json!({
        "token": {
            "methods": [method],
            "expires_at": fmt(expires),
            "issued_at": fmt(now),
            "audit_ids": ["3T2dc1CGQxyJsHdDu1xkcw"],
            "user": {"domain": {"id": "default", "name": "Default"}, "id": USER_ID, "name": USERNAME, "password_expires_at": null},
            "project": {"domain": {"id": "default", "name": "Default"}, "id": PROJECT_ID, "name": PROJECT_NAME},
            "is_domain": false,
            "roles": [{"id": "51cc68287d524c759f47c811e6463340", "name": "member"}],
            "catalog": catalog(&s.base),
        }
    });
    Answer(
        StatusCode::CREATED,
        vec![("x-subject-token".into(), token)],
        Some(body),
    )
}
