//! The heat and magnum handlers against the fake Keystone + Heat + Nova +
//! Magnum: scale-up, targeted removal, refusals while busy or failed,
//! quota reasons.

use std::time::Duration;

use gearshift_handlers::config::{HeatConfig, MagnumConfig};
use gearshift_handlers::heat::HeatHandler;
use gearshift_handlers::magnum::MagnumHandler;
use gearshift_handlers::{CreateRequest, GroupKey, Handler, NodeShape, Presence, RemoveRequest};
use gearshift_tests::fake_openstack::{FakeCluster, FakeOpenStack, FakeStack};
use serde_json::json;

fn group() -> GroupKey {
    GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    }
}

fn create(op: &str) -> CreateRequest {
    CreateRequest {
        op: op.into(),
        group: group(),
        shape: NodeShape::default(),
        attempt: 1,
        epoch: 0,
    }
}

fn remove(op: &str, node: &str) -> RemoveRequest {
    RemoveRequest {
        op: op.into(),
        group: group(),
        node: node.into(),
        cloud_id: None,
        attempt: 1,
        epoch: 0,
    }
}

fn heat(os: &FakeOpenStack, extra: &str) -> HeatHandler {
    let mut c: HeatConfig = toml::from_str(&format!("poll_interval = \"10ms\"\n{extra}")).unwrap();
    c.update_timeout = Duration::from_secs(5);
    HeatHandler::with_session(c, os.session())
}

#[tokio::test]
async fn resource_group_count_up_and_removal_policies_down() {
    let os = FakeOpenStack::start().await;
    os.add_stack(FakeStack::resource_group("paas", "node-", 3));
    os.set_update_polls(2);
    let h = heat(&os, "stack = \"paas\"\nscale_up = \"count\"\n");
    let out = h.create_node(&create("op-up")).await.unwrap();
    assert!(out.detail.contains("3 -> 4"), "{}", out.detail);
    assert_eq!(os.members("paas").len(), 4);
    let patch = &os.requests_matching("PATCH", "/stacks/paas/")[0];
    assert_eq!(
        patch.body.as_ref().unwrap(),
        &json!({"parameters": {"count": 4}})
    );

    // Remove node-1 exactly (not the newest, which a plain count - 1 would remove).
    let r = h
        .remove_node(&remove("op-down", "node-1.example.com"))
        .await
        .unwrap();
    assert!(r.gone, "{}", r.detail);
    let names: Vec<String> = os
        .members("paas")
        .into_iter()
        .map(|m| m.server_name)
        .collect();
    assert_eq!(names, vec!["node-0", "node-2", "node-3"]);
    let patch = &os.requests_matching("PATCH", "/stacks/paas/")[1];
    assert_eq!(
        patch.body.as_ref().unwrap(),
        &json!({"parameters": {"count": 3, "removal_policies": [{"resource_list": ["1"]}]}})
    );
    assert_eq!(
        h.presence("node-1.example.com", &group()).await.unwrap(),
        Presence::Gone
    );
    assert_eq!(
        h.presence("node-2.example.com", &group()).await.unwrap(),
        Presence::Present
    );
    // Removing it again finds no server: already gone.
    assert!(
        h.remove_node(&remove("op-down", "node-1.example.com"))
            .await
            .unwrap()
            .gone
    );
    os.assert_no_violations();
}

#[tokio::test]
async fn asg_signal_up_and_mark_unhealthy_down() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("asg-paas", "node-", 2));
    os.set_update_polls(1);
    let h = heat(
        &os,
        &format!(
            "stack = \"asg-paas\"\ngroup_resource = \"asg\"\nremove = \"mark-unhealthy\"\nscale_up_alarm_url = \"{}\"\n",
            os.alarm_url(&stack, "scale_up")
        ),
    );
    h.create_node(&create("op-up")).await.unwrap();
    assert_eq!(os.members("asg-paas").len(), 3);
    let sig = os.signals();
    assert_eq!(
        (sig[0].resource.as_str(), sig[0].via, sig[0].applied),
        ("scale_up", "alarm_url", true)
    );

    // The oldest (node-0) would go first on a plain scale-down; we want node-1.
    let r = h
        .remove_node(&remove("op-down", "node-1.example.com"))
        .await
        .unwrap();
    assert!(r.gone, "{}", r.detail);
    let names: Vec<String> = os
        .members("asg-paas")
        .into_iter()
        .map(|m| m.server_name)
        .collect();
    assert_eq!(names, vec!["node-0", "node-2"]);
    let mark = &os.requests_matching("PATCH", "/resources/")[0];
    assert_eq!(mark.body.as_ref().unwrap()["mark_unhealthy"], true);
    assert!(
        mark.path.contains(&os.group_stack("asg-paas")),
        "{}",
        mark.path
    );
    // Then a stack update, not the scale-down signal: after a mark, Heat 27
    // removes the marked member *and* the oldest healthy one on a signal.
    assert_eq!(os.signals().len(), 1, "no scale-down signal");
    let update = &os.requests_matching("PATCH", "/stacks/asg-paas/")[0];
    assert_eq!(update.body.as_ref().unwrap(), &json!({"parameters": {}}));
    os.assert_no_violations();
}

#[tokio::test]
async fn op_param_replacing_members_is_refused_and_signals_heat_ignores_are_typed() {
    let os = FakeOpenStack::start().await;
    os.add_stack(FakeStack::resource_group("paas", "node-", 2).with_op_replacing());
    let h = heat(
        &os,
        "stack = \"paas\"\nscale_up = \"count\"\nop_param = \"gearshift_op\"\n",
    );
    let err = h.create_node(&create("op-1")).await.unwrap_err();
    assert_eq!(err.label(), "permanent", "{err}");
    assert!(
        err.to_string().contains("replace existing members"),
        "{err}"
    );
    assert!(
        os.requests_matching("PATCH", "/stacks/paas/")
            .iter()
            .all(|r| r.path.ends_with("/preview"))
    );

    // An AutoScalingGroup at max_size: quota, before any signal.
    os.add_stack(FakeStack::asg("full", "full-", 2).with_limits(1, 2));
    let h = heat(&os, "stack = \"full\"\ngroup_resource = \"asg\"\n");
    assert!(h.create_node(&create("op-2")).await.unwrap_err().is_quota());
    // In its cooldown: busy, before any signal.
    os.add_stack(FakeStack::asg("cool", "cool-", 1).with_cooldown("scale_up", 600));
    let h = heat(&os, "stack = \"cool\"\ngroup_resource = \"asg\"\n");
    h.create_node(&create("op-3")).await.unwrap();
    assert_eq!(os.members("cool").len(), 2);
    let err = h.create_node(&create("op-4")).await.unwrap_err();
    assert_eq!(err.label(), "busy", "{err}");
    assert!(err.to_string().contains("cooldown"), "{err}");
    assert_eq!(os.signals().len(), 1, "the refused signals were never sent");
    os.assert_no_violations();
}

#[tokio::test]
async fn busy_and_failed_stacks_are_refused_before_acting() {
    let os = FakeOpenStack::start().await;
    os.add_stack(FakeStack::resource_group("paas", "node-", 2));
    let h = heat(&os, "stack = \"paas\"\nscale_up = \"count\"\n");
    os.set_stack_status("paas", "UPDATE_IN_PROGRESS", "Stack UPDATE started");
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert_eq!(err.label(), "busy", "{err}");
    assert!(err.to_string().contains("UPDATE_IN_PROGRESS"));
    os.set_stack_status(
        "paas",
        "UPDATE_FAILED",
        "Resource UPDATE failed: image not found",
    );
    let err = h
        .remove_node(&remove("op", "node-0.example.com"))
        .await
        .unwrap_err();
    assert_eq!(err.label(), "permanent", "{err}");
    assert!(err.to_string().contains("image not found"));
    os.set_stack_status(
        "paas",
        "CREATE_FAILED",
        "Resource CREATE failed: Forbidden: resources.group.resources[2]: Quota exceeded for instances: Requested 1, but already used 10 of 10 instances (HTTP 403)",
    );
    assert!(h.create_node(&create("op")).await.unwrap_err().is_quota());
    assert!(
        os.requests_matching("PATCH", "/stacks/").is_empty(),
        "nothing was changed"
    );
}

#[tokio::test]
async fn an_update_failing_on_quota_is_quota() {
    let os = FakeOpenStack::start().await;
    os.add_stack(FakeStack::asg("asg-paas", "node-", 1));
    let h = heat(&os, "stack = \"asg-paas\"\ngroup_resource = \"asg\"\n");
    os.fail_next_stack_update(
        "Resource CREATE failed: Forbidden: resources.asg.resources.m001ab: Quota exceeded for cores: Requested 2, but already used 20 of 20 cores (HTTP 403)",
    );
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
}

#[tokio::test]
async fn heat_capacity_uses_nova_limits() {
    let os = FakeOpenStack::start().await;
    os.add_stack(FakeStack::resource_group("paas", "node-", 2));
    let h = heat(&os, "stack = \"paas\"\nflavor = \"m1.small\"\n");
    let cap = h.capacity(&group(), &NodeShape::default()).await.unwrap();
    assert_eq!(cap.nodes_available, Some(8), "{}", cap.detail); // 10 instances, 2 used
}

fn magnum(os: &FakeOpenStack, ng: Option<&str>) -> MagnumHandler {
    let mut c: MagnumConfig =
        toml::from_str("cluster = \"k8s\"\npoll_interval = \"10ms\"\nserver_name = \"fqdn\"\n")
            .unwrap();
    c.nodegroup = ng.map(str::to_string);
    c.resize_timeout = Duration::from_secs(5);
    MagnumHandler::with_session(c, os.session())
}

#[tokio::test]
async fn magnum_resize_up_and_remove_a_chosen_node() {
    let os = FakeOpenStack::start().await;
    let uuid = os.add_cluster(FakeCluster::new("k8s", 3));
    os.set_cluster_update_polls(2);
    let h = magnum(&os, Some("default-worker"));
    let out = h.create_node(&create("op-up")).await.unwrap();
    assert!(out.detail.contains("3 -> 4"), "{}", out.detail);
    let nodes = os.nodegroup_nodes(&uuid, "default-worker");
    assert_eq!(nodes.len(), 4);
    let resize = &os.requests_matching("POST", "/actions/resize")[0];
    assert_eq!(
        resize.body.as_ref().unwrap(),
        &json!({"node_count": 4, "nodegroup": "default-worker"})
    );
    assert_eq!(
        resize.header("openstack-api-version"),
        Some("container-infra 1.9")
    );
    assert!(
        resize
            .path
            .ends_with("/magnum/v1/clusters/k8s/actions/resize")
    );

    let (victim_id, victim_name) = nodes[1].clone();
    let r = h
        .remove_node(&remove("op-down", &victim_name))
        .await
        .unwrap();
    assert!(r.gone, "{}", r.detail);
    let resize = &os.requests_matching("POST", "/actions/resize")[1];
    assert_eq!(
        resize.body.as_ref().unwrap(),
        &json!({"node_count": 3, "nodes_to_remove": [victim_id], "nodegroup": "default-worker"})
    );
    let left: Vec<String> = os
        .nodegroup_nodes(&uuid, "default-worker")
        .into_iter()
        .map(|n| n.1)
        .collect();
    assert!(!left.contains(&victim_name));
    assert_eq!(left.len(), 3);
    os.assert_no_violations();
}

#[tokio::test]
async fn magnum_busy_failed_and_quota() {
    let os = FakeOpenStack::start().await;
    os.add_cluster(FakeCluster::new("k8s", 2));
    let h = magnum(&os, Some("default-worker"));
    os.set_cluster_status("k8s", "UPDATE_IN_PROGRESS", "");
    assert_eq!(
        h.create_node(&create("op")).await.unwrap_err().label(),
        "busy"
    );
    os.set_cluster_status("k8s", "UPDATE_COMPLETE", "");
    // The resize runs into Nova's instance quota: UPDATE_FAILED naming it.
    os.set_limits(gearshift_tests::fake_openstack::Limits {
        instances: 3,
        cores: 100,
        ram: 1 << 20,
        volumes: 10,
        gigabytes: 1000,
    });
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
    let (status, _) = os.cluster_status("k8s");
    assert_eq!(status, "UPDATE_FAILED");
    // A failed cluster is refused before acting, still as quota.
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
    assert_eq!(os.requests_matching("POST", "/actions/resize").len(), 1);
}
