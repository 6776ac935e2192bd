//! Conformance against real Keystone 30 and Heat 27 (PyPI `keystone`,
//! `openstack-heat`), as `scripts/setup-openstack start` runs them on
//! loopback: Keystone auth and catalog, every handler mode that talks to
//! Heat, and the node agent's Heat actions, on real stacks of
//! `OS::Heat::TestResource` members. Each step checks the members that
//! exist afterwards: a scale-up adds exactly one, a scale-down removes
//! exactly the victim.
//!
//! Every test name contains `disruptive_openstack`: they run in the serial
//! pass of `scripts/test` (`-E 'test(/disruptive/)'`), and fail, naming
//! `scripts/setup-openstack`, when the services are not running.
//! `docs/openstack-conformance.md` says what each step relies on.

mod groups;
mod nodes;
mod real;

use gearshift_cloud::auth::ProjectRef;
use gearshift_cloud::heat::Heat;
use gearshift_cloud::{Credentials, CredentialsFrom, Service, Session, SessionOptions};

/// Password and application-credential tokens, the catalog, and the two
/// Keystone answers the fakes had wrong (a scoped application credential,
/// an unknown one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruptive_openstack_keystone_auth_and_catalog() {
    let r = real::Real::connect().await;
    let info = &r.info;
    let project = info["project"]["id"].as_str().unwrap();
    assert_eq!(r.session.project_id().await.unwrap(), project);
    assert_eq!(
        r.session.endpoint(Service::Orchestration).await.unwrap(),
        info["heat_url"].as_str().unwrap()
    );
    assert_eq!(
        r.session.endpoint(Service::Identity).await.unwrap(),
        info["auth_url"].as_str().unwrap()
    );

    // The restricted application credential: a token for its project, and Heat takes it.
    let app = r.app_session();
    assert_eq!(app.project_id().await.unwrap(), project);
    Heat::new(app)
        .session()
        .request(
            Service::Orchestration,
            gearshift_cloud::http::Method::GET,
            "stacks",
            &[],
            None,
        )
        .await
        .expect("an application credential token lists stacks");

    // A project left beside an application credential is not sent as a scope
    // (Keystone would answer 401 "Application credentials cannot request a scope").
    let mut scoped = Credentials::load(CredentialsFrom::EnvFile(&r.appcred_env())).unwrap();
    scoped.project = Some(ProjectRef::Id(project.to_string()));
    let s = Session::new(scoped, SessionOptions::default()).unwrap();
    assert_eq!(s.project_id().await.unwrap(), project);

    // An unknown application credential: Keystone 404, which is no "not found" of a resource.
    let mut unknown = Credentials::load(CredentialsFrom::EnvFile(&r.appcred_env())).unwrap();
    if let gearshift_cloud::auth::AuthMethod::ApplicationCredential { id, .. } = &mut unknown.method
    {
        *id = Some("0000000000000000000000000000dead".into());
    }
    let e = Session::new(unknown, SessionOptions::default())
        .unwrap()
        .token()
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    assert!(!e.is_not_found() && !e.is_retryable(), "{e}");

    // A wrong password: 401, not retried.
    let mut wrong =
        Credentials::load(CredentialsFrom::EnvFile(&r.dir.join("password.env"))).unwrap();
    if let gearshift_cloud::auth::AuthMethod::Password { password, .. } = &mut wrong.method {
        *password = gearshift_cloud::auth::Secret::new("wrong");
    }
    let e = Session::new(wrong, SessionOptions::default())
        .unwrap()
        .token()
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    assert!(!e.is_retryable());
}

/// The `heat` handler on a ResourceGroup: `scale_up = "count"` with an
/// `op_param` (accepted while members update in place, refused when they
/// would be replaced), removal by `removal_policies` and by mark-unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruptive_openstack_resource_group_count_and_removal() {
    real::with_stacks(groups::resource_group).await;
}

/// The `heat` handler on AutoScalingGroups: signals through the policy and
/// through push mode's alarm URL, each confirmed; signals Heat ignores
/// (cooldown, max_size) as typed failures; mark-unhealthy removal with and
/// without `desired_capacity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruptive_openstack_autoscaling_group_signals_and_removal() {
    real::with_stacks(groups::autoscaling_group).await;
}

/// The node agent's Heat actions (`scale_up`, `signal`, `scale_down` by
/// `gearshift-node heat-signal`, `mark_unhealthy` on its own member) and the
/// `heat-via-node` handler driving a real node agent over RabbitMQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disruptive_openstack_node_signals_and_heat_via_node() {
    real::with_stacks(nodes::node_actions).await;
}
