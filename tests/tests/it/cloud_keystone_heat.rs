//! gearshift-cloud's Keystone session and Heat client against the fake
//! OpenStack, which checks every request's documented shape.

use std::collections::BTreeMap;
use std::time::Duration;

use gearshift_cloud::heat::{Heat, StackId, ensure_settled, post_alarm_url, post_signal_url};
use gearshift_cloud::{CloudError, Credentials, Service, Session, SessionOptions};
use gearshift_tests::fake_openstack::{self as fake, FakeOpenStack, FakeStack};
use serde_json::json;

fn creds_from(vars: Vec<(String, String)>) -> Credentials {
    let m: BTreeMap<String, String> = vars.into_iter().collect();
    Credentials::from_vars(|k| m.get(k).cloned()).expect("credentials")
}

#[tokio::test]
async fn password_auth_sends_the_documented_body_and_reads_the_catalog() {
    let os = FakeOpenStack::start().await;
    let session = Session::new(creds_from(os.env_vars()), SessionOptions::default()).unwrap();
    let heat = session.endpoint(Service::Orchestration).await.unwrap();
    assert_eq!(
        heat,
        format!("{}/heat/v1/{}", os.base_url(), fake::PROJECT_ID)
    );
    assert_eq!(
        session.endpoint(Service::BlockStorage).await.unwrap(),
        format!("{}/volume/v3/{}", os.base_url(), fake::PROJECT_ID)
    );
    assert_eq!(session.project_id().await.unwrap(), fake::PROJECT_ID);
    let reqs = os.requests_matching("POST", "/identity/v3/auth/tokens");
    assert_eq!(reqs.len(), 1, "one token for both look-ups");
    assert_eq!(
        reqs[0].body.as_ref().unwrap(),
        &json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": fake::USERNAME, "domain": {"name": "Default"}, "password": fake::PASSWORD}}},
            "scope": {"project": {"name": fake::PROJECT_NAME, "domain": {"name": "Default"}}}}})
    );
    assert!(
        reqs[0]
            .header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    os.assert_no_violations();
}

#[tokio::test]
async fn application_credential_auth() {
    let os = FakeOpenStack::start().await;
    let session = Session::new(
        creds_from(os.app_credential_env_vars()),
        SessionOptions::default(),
    )
    .unwrap();
    let stack = os.add_stack(FakeStack::asg("nodes", "node-", 1));
    let s = Heat::new(session).get_stack(&stack).await.unwrap();
    assert_eq!(s.stack_status, "CREATE_COMPLETE");
    let auth = &os.requests_matching("POST", "auth/tokens")[0];
    assert_eq!(
        auth.body.as_ref().unwrap(),
        &json!({"auth": {"identity": {"methods": ["application_credential"],
            "application_credential": {"id": fake::APP_CRED_ID, "secret": fake::APP_CRED_SECRET}}}})
    );
    os.assert_no_violations();
}

/// Keystone 30: an application credential never takes a scope (401 if it
/// did; gearshift drops a project left beside it), and an unknown one is a
/// 404 that must not read as "not found".
#[tokio::test]
async fn application_credentials_unscoped_and_unknown() {
    let os = FakeOpenStack::start().await;
    let mut vars = os.app_credential_env_vars();
    vars.push(("OS_PROJECT_NAME".into(), fake::PROJECT_NAME.into()));
    let mut creds = creds_from(vars.clone());
    creds.project = Some(gearshift_cloud::auth::ProjectRef::Id(
        fake::PROJECT_ID.into(),
    ));
    let s = Session::new(creds, SessionOptions::default()).unwrap();
    assert_eq!(s.project_id().await.unwrap(), fake::PROJECT_ID);
    for (k, v) in vars.iter_mut() {
        if k == "OS_APPLICATION_CREDENTIAL_ID" {
            *v = "0000000000000000000000000000dead".into();
        }
    }
    let e = Session::new(creds_from(vars), SessionOptions::default())
        .unwrap()
        .token()
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    assert!(!e.is_not_found() && !e.is_retryable());
    assert!(
        e.to_string()
            .contains("Could not find Application Credential"),
        "{e}"
    );
    os.assert_no_violations();
}

#[tokio::test]
async fn wrong_password_is_a_permanent_401() {
    let os = FakeOpenStack::start().await;
    let mut vars = os.env_vars();
    for (k, v) in vars.iter_mut() {
        if k == "OS_PASSWORD" {
            *v = "wrong".into();
        }
    }
    let session = Session::new(creds_from(vars), SessionOptions::default()).unwrap();
    let err = session.token().await.unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(!err.is_retryable());
    assert!(!err.is_quota());
}

#[tokio::test]
async fn token_is_refreshed_before_expiry_and_after_a_401() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("nodes", "node-", 1));
    os.set_token_ttl(Duration::from_secs(2));
    let session = os.session();
    let heat = Heat::new(session.clone());
    heat.get_stack(&stack).await.unwrap();
    assert_eq!(os.tokens_issued(), 1);
    // Within the first half of the lifetime the token is reused.
    heat.get_stack(&stack).await.unwrap();
    assert_eq!(os.tokens_issued(), 1);
    // Past half of its lifetime, a new one is fetched before use.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    heat.get_stack(&stack).await.unwrap();
    assert_eq!(os.tokens_issued(), 2);
    // Keystone forgets the token: one 401, one new token, the call succeeds.
    os.set_token_ttl(Duration::from_secs(3600));
    os.revoke_tokens();
    heat.get_stack(&stack).await.unwrap();
    assert_eq!(os.tokens_issued(), 3);
    let unauthorized = os.requests().iter().filter(|r| r.status == 401).count();
    assert_eq!(unauthorized, 1);
    os.assert_no_violations();
}

#[tokio::test]
async fn stack_by_name_follows_the_redirect_with_the_token() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::resource_group("paas-nodes", "node-", 3));
    let heat = Heat::new(os.session());
    let s = heat.get_stack("paas-nodes").await.unwrap();
    assert_eq!(s.stack_id().to_string(), stack);
    assert_eq!(s.int_param("count"), Some(3));
    let gets = os.requests_matching("GET", "/stacks/paas-nodes");
    assert_eq!(gets.len(), 2, "302 then the full path");
    assert_eq!(gets[0].status, 302);
    assert!(gets.iter().all(|r| r.header("x-auth-token").is_some()));
    os.assert_no_violations();
}

#[tokio::test]
async fn patch_update_and_wait_for_update_complete() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::resource_group("rg", "node-", 3));
    os.set_update_polls(2);
    let heat = Heat::new(os.session());
    let id = StackId::parse(&stack).unwrap();
    let before = heat.get_stack(&stack).await.unwrap();
    ensure_settled(&before).unwrap();
    let member = os.members("rg")[1].name.clone();
    let body =
        json!({"parameters": {"count": 2, "removal_policies": [{"resource_list": [member]}]}});
    heat.patch_stack(&id, &body).await.unwrap();
    let during = heat.get_stack(&stack).await.unwrap();
    assert!(ensure_settled(&during).unwrap_err().is_busy());
    assert_eq!(
        during.int_param("count"),
        Some(2),
        "a GET shows the in-flight value"
    );
    // A second update while the first runs is accepted too (Heat 27: 202, no
    // 409): it supersedes the first, so callers must check before patching.
    heat.patch_stack(&id, &json!({"parameters": {"count": 1}}))
        .await
        .unwrap();
    let done = heat
        .wait_update(
            &id,
            before.updated_time.as_deref(),
            Duration::from_secs(10),
            Duration::from_millis(20),
        )
        .await
        .unwrap();
    assert_eq!(done.stack_status, "UPDATE_COMPLETE");
    let names: Vec<String> = os.members("rg").into_iter().map(|m| m.name).collect();
    assert_eq!(
        names,
        vec!["0".to_string()],
        "member 1 removed by removal_policies, then the last PATCH's count"
    );
    let patch = &os.requests_matching("PATCH", "/stacks/rg/")[0];
    assert_eq!(patch.body.as_ref().unwrap(), &body);
    os.assert_no_violations();
}

#[tokio::test]
async fn failed_update_with_a_quota_reason_is_quota() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::resource_group("rg", "node-", 1));
    os.fail_next_stack_update(
        "Resource CREATE failed: Forbidden: resources.group.resources[1]: Quota exceeded for instances: Requested 1, but already used 10 of 10 instances (HTTP 403)",
    );
    let heat = Heat::new(os.session());
    let id = StackId::parse(&stack).unwrap();
    heat.patch_stack(&id, &json!({"parameters": {"count": 2}}))
        .await
        .unwrap();
    let err = heat
        .wait_update(&id, None, Duration::from_secs(5), Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Failed { .. }), "{err}");
    assert!(err.is_quota());
    // And a stack left *_FAILED is refused before acting.
    let s = heat.get_stack(&stack).await.unwrap();
    let refused = ensure_settled(&s).unwrap_err();
    assert!(refused.is_quota(), "{refused}");
    assert!(refused.to_string().contains("UPDATE_FAILED"));
}

/// Heat 27 (docs/openstack-conformance.md, point 1): after a mark, a
/// scale-down signal removes the marked member *and* the oldest healthy one
/// (it sizes from the healthy members, then drops failed first); a stack
/// update with unchanged parameters removes exactly the marked one.
#[tokio::test]
async fn mark_unhealthy_then_signal_removes_that_member_and_the_oldest() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("asg-stack", "node-", 3));
    let heat = Heat::new(os.session());
    let id = StackId::parse(&stack).unwrap();
    let resources = heat.list_resources(&id, 1).await.unwrap();
    let victim = os.members("asg-stack")[1].clone();
    let member = resources
        .iter()
        .find(|r| r.physical_resource_id == victim.server_id)
        .expect("member listed with nested_depth=1");
    assert_eq!(member.parent_resource.as_deref(), Some("asg"));
    let nested = member.owning_stack().expect("stack link");
    assert_eq!(nested.to_string(), os.group_stack("asg-stack"));
    heat.mark_unhealthy(&nested, &member.resource_name, "gearshift: drained node-1")
        .await
        .unwrap();
    heat.signal_resource(&id, "scale_down", None).await.unwrap();
    // A policy signal updates the group's nested stack, not the parent.
    let group = StackId::parse(&os.group_stack("asg-stack")).unwrap();
    heat.wait_update(
        &group,
        None,
        Duration::from_secs(5),
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    assert_eq!(os.stack_status("asg-stack").0, "CREATE_COMPLETE");
    let left: Vec<String> = os
        .members("asg-stack")
        .into_iter()
        .map(|m| m.server_name)
        .collect();
    assert_eq!(
        left,
        vec!["node-2".to_string()],
        "the victim and the oldest went"
    );
    assert_eq!(
        os.policy_events("asg-stack", "scale_down"),
        ["No signal details provided"]
    );
    let patch = &os.requests_matching("PATCH", "/resources/")[0];
    assert_eq!(
        patch.body.as_ref().unwrap(),
        &json!({"mark_unhealthy": true, "resource_status_reason": "gearshift: drained node-1"})
    );
    assert!(patch.path.contains(&format!(
        "/stacks/{}/resources/{}",
        os.group_stack("asg-stack"),
        member.resource_name
    )));
    os.assert_no_violations();
}

#[tokio::test]
async fn mark_unhealthy_then_a_stack_update_removes_exactly_that_member() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("asg-stack", "node-", 3));
    let heat = Heat::new(os.session());
    let id = StackId::parse(&stack).unwrap();
    let victim = os.members("asg-stack")[1].clone();
    let nested = StackId::parse(&os.group_stack("asg-stack")).unwrap();
    heat.mark_unhealthy(&nested, &victim.name, "gearshift: drained node-1")
        .await
        .unwrap();
    heat.patch_stack(&id, &json!({"parameters": {}}))
        .await
        .unwrap();
    heat.wait_update(&id, None, Duration::from_secs(5), Duration::from_millis(10))
        .await
        .unwrap();
    let left: Vec<String> = os
        .members("asg-stack")
        .into_iter()
        .map(|m| m.server_name)
        .collect();
    assert_eq!(left, vec!["node-0".to_string(), "node-2".to_string()]);
    // With a desired_capacity equal to the size, the same update replaces it instead.
    let fixed = os.add_stack(FakeStack::asg("asg-fixed", "fix-", 2).with_desired(2));
    let first = os.members("asg-fixed")[0].clone();
    let nested = StackId::parse(&os.group_stack("asg-fixed")).unwrap();
    heat.mark_unhealthy(&nested, &first.name, "x")
        .await
        .unwrap();
    let fid = StackId::parse(&fixed).unwrap();
    heat.patch_stack(&fid, &json!({"parameters": {}}))
        .await
        .unwrap();
    heat.wait_update(
        &fid,
        None,
        Duration::from_secs(5),
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    let after = os.members("asg-fixed");
    assert_eq!(after.len(), 2);
    assert_eq!(after[0].name, first.name, "same resource name");
    assert_ne!(after[0].server_id, first.server_id, "a new server");
    os.assert_no_violations();
}

#[tokio::test]
async fn alarm_url_is_posted_without_a_token_and_signal_url_with_one() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("asg", "node-", 1));
    let session = os.session();
    post_alarm_url(session.http(), &os.alarm_url(&stack, "scale_up"), None)
        .await
        .unwrap();
    let s = Heat::new(session.clone())
        .get_stack(&os.group_stack("asg"))
        .await
        .unwrap();
    assert_eq!(s.stack_status, "UPDATE_COMPLETE");
    assert_eq!(os.members("asg").len(), 2);
    post_signal_url(
        &session,
        &os.signal_url(&stack, "scale_down"),
        Some(&json!({"reason": "empty"})),
    )
    .await
    .unwrap();
    let sig = os.signals();
    assert_eq!(sig.len(), 2);
    assert_eq!(
        (sig[0].resource.as_str(), sig[0].via),
        ("scale_up", "alarm_url")
    );
    assert_eq!(
        (sig[1].resource.as_str(), sig[1].via),
        ("scale_down", "signal")
    );
    assert_eq!(sig[1].details, Some(json!({"reason": "empty"})));
    assert!(sig[0].applied && sig[1].applied);
    // The pre-signed URL reached the fake with its signature intact and no token.
    let cfn = &os.requests_matching("POST", "/heat-cfn/")[0];
    assert!(cfn.header("x-auth-token").is_none());
    assert_eq!(cfn.status, 200);
    os.assert_no_violations();

    // A tampered signature is refused with 403, not retried.
    let bad = os
        .alarm_url(&stack, "scale_up")
        .replace("Signature=", "Signature=x");
    let err = post_alarm_url(session.http(), &bad, None)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert!(!err.is_retryable());
    // heat-api-cfn's XML AccessDenied, typed.
    assert!(
        matches!(&err, CloudError::PresignedRefused { code, .. } if code == "AccessDenied"),
        "{err}"
    );
}

#[tokio::test]
async fn server_errors_are_retryable_and_connection_failures_are_transport() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("asg", "node-", 1));
    let heat = Heat::new(os.session());
    os.fail_next(
        "GET",
        "/stacks/asg",
        503,
        json!({"explanation": "unavailable", "code": 503, "error": {"message": "Service Unavailable", "type": "HTTPServiceUnavailable", "traceback": null}, "title": "Service Unavailable"}),
    );
    let err = heat.get_stack(&stack).await.unwrap_err();
    assert_eq!(err.status(), Some(503));
    assert!(err.is_retryable() && !err.is_quota());
    heat.get_stack(&stack).await.unwrap();

    // Nothing listens on a port we just closed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let session = os.session();
    let err = post_alarm_url(
        session.http(),
        &format!("http://{addr}/v1/signal/x?Signature=s"),
        None,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CloudError::Transport { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(
        !err.to_string().contains("Signature=s"),
        "signatures are redacted: {err}"
    );
}
