//! The nova handler against the fake Keystone + Nova + Cinder + Glance +
//! Neutron: the seeds' naming, shape, user data, volume, quota pre-flight,
//! quota refusals, idempotent lookup and remove.

use gearshift_handlers::config::NovaConfig;
use gearshift_handlers::nova::NovaHandler;
use gearshift_handlers::{
    CreateRequest, GroupKey, Handler, HandlerContext, Lookup, NodeShape, Presence, RemoveRequest,
};
use gearshift_tests::fake_openstack::{FakeOpenStack, Limits};
use serde_json::json;

fn group() -> GroupKey {
    GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    }
}

fn shape(volume: Option<u32>) -> NodeShape {
    NodeShape {
        flavor: Some("m1.medium".into()),
        image: Some("openshift-node-image".into()),
        availability_zone: Some("az2".into()),
        user_data: None,
        volume_gb: volume,
        volume_type: Some("ssd".into()),
        key_name: Some("ops".into()),
        networks: vec!["paas-net".into()],
        security_groups: vec!["node".into()],
        metadata: [("team".to_string(), "paas".to_string())].into(),
    }
}

fn config(max_nodes: u32) -> NovaConfig {
    let mut c: NovaConfig = toml::from_str(&format!(
        "base_name = \"openshift-node\"\ndomain = \"example.com\"\nmax_nodes = {max_nodes}\npoll_interval = \"10ms\"\nvolume_device = \"/dev/vdc\"\n"
    ))
    .unwrap();
    c.boot_timeout = std::time::Duration::from_secs(5);
    c
}

fn handler(os: &FakeOpenStack, max_nodes: u32) -> NovaHandler {
    let mut ctx = HandlerContext::standalone("broker-test");
    ctx.bus_url = "amqps://node:pw@mq.example.com:5671/%2f".into();
    NovaHandler::with_session(config(max_nodes), os.session(), &ctx)
}

fn create(op: &str, volume: Option<u32>) -> CreateRequest {
    CreateRequest {
        op: op.into(),
        group: group(),
        shape: shape(volume),
        attempt: 1,
        epoch: 0,
    }
}

#[tokio::test]
async fn create_names_the_first_free_n_and_sends_the_shape() {
    let os = FakeOpenStack::start().await;
    // openshift-node_1 exists; _2 is free.
    os.add_server("openshift-node_1", &[]);
    os.add_server("other_2", &[]);
    let h = handler(&os, 10);
    let out = h.create_node(&create("op-1", None)).await.unwrap();
    assert_eq!(out.node.as_deref(), Some("openshift-node-2.example.com"));
    let servers = os.servers();
    let s = servers
        .iter()
        .find(|s| s.name == "openshift-node_2")
        .expect("server created");
    assert_eq!(out.cloud_id.as_deref(), Some(s.id.as_str()));
    assert_eq!(s.flavor, "3", "m1.medium resolved to its id");
    assert_eq!(s.availability_zone.as_deref(), Some("az2"));
    assert_eq!(s.key_name.as_deref(), Some("ops"));
    assert_eq!(s.security_groups, vec!["node".to_string()]);
    assert_eq!(s.networks.len(), 1);
    assert_eq!(s.metadata["gearshift_op"], "op-1");
    assert_eq!(s.metadata["gearshift_node"], "openshift-node-2.example.com");
    assert_eq!(s.metadata["gearshift_district"], "d1");
    assert_eq!(s.metadata["gearshift_profile"], "small");
    assert_eq!(s.metadata["team"], "paas");
    let ud = s.user_data.as_deref().expect("user data");
    assert!(ud.starts_with("#cloud-config\n"), "{ud}");
    assert!(ud.contains("fqdn: openshift-node-2.example.com"));
    let boot_line = ud.lines().find(|l| l.contains("content:")).unwrap();
    let boot_json = boot_line
        .trim()
        .trim_start_matches("content: '")
        .trim_end_matches('\'');
    let boot: serde_json::Value = serde_json::from_str(boot_json).unwrap();
    assert_eq!(
        boot,
        json!({"node": "openshift-node-2.example.com", "domain": "example.com", "profile": "small",
               "district": "d1", "bus_url": "amqps://node:pw@mq.example.com:5671/%2f", "op": "op-1"})
    );
    // The quota pre-flight read the limits before the boot was asked.
    let reqs = os.requests();
    let limits_at = reqs
        .iter()
        .position(|r| r.path.ends_with("/limits"))
        .unwrap();
    let post_at = reqs
        .iter()
        .position(|r| r.method == "POST" && r.path.ends_with("/servers"))
        .unwrap();
    assert!(limits_at < post_at);
    assert!(
        reqs.iter().any(|r| r.path == "/image/v2/images"
            && r.query.as_deref() == Some("name=openshift-node-image"))
    );
    os.assert_no_violations();
}

#[tokio::test]
async fn user_data_template_is_filled_in() {
    let os = FakeOpenStack::start().await;
    let h = handler(&os, 10);
    let mut req = create("op-t", None);
    req.shape.user_data = Some(
        "#!/bin/sh\necho {node} {short} {domain} {profile} {district} {op} {bus_url}\n".into(),
    );
    h.create_node(&req).await.unwrap();
    let ud = os.servers()[0].user_data.clone().unwrap();
    assert_eq!(
        ud,
        "#!/bin/sh\necho openshift-node-1.example.com openshift-node-1 example.com small d1 op-t amqps://node:pw@mq.example.com:5671/%2f\n"
    );
}

#[tokio::test]
async fn volume_is_created_waited_for_and_attached() {
    let os = FakeOpenStack::start().await;
    os.set_volume_polls(2);
    os.set_build_polls(2);
    let h = handler(&os, 10);
    let out = h.create_node(&create("op-v", Some(50))).await.unwrap();
    let vols = os.volumes();
    assert_eq!(vols.len(), 1);
    let v = &vols[0];
    assert_eq!(
        v.name, "openshift-node-1.example.com",
        "the seed names the volume after the host"
    );
    assert_eq!(
        (v.size, v.volume_type.as_deref(), v.status.as_str()),
        (50, Some("ssd"), "in-use")
    );
    assert_eq!(v.attached_to, out.cloud_id);
    let attach = &os.requests_matching("POST", "/os-volume_attachments")[0];
    assert_eq!(
        attach.body.as_ref().unwrap(),
        &json!({"volumeAttachment": {"volumeId": v.id, "device": "/dev/vdc"}})
    );
    let create_vol = &os.requests_matching("POST", "/volumes")[0];
    assert_eq!(create_vol.body.as_ref().unwrap()["volume"]["size"], 50);
    os.assert_no_violations();
}

#[tokio::test]
async fn lookup_finds_the_operation_and_create_is_idempotent() {
    let os = FakeOpenStack::start().await;
    let h = handler(&os, 10);
    assert_eq!(h.lookup("op-x", &group()).await.unwrap(), Lookup::NotFound);
    let first = h.create_node(&create("op-x", None)).await.unwrap();
    match h.lookup("op-x", &group()).await.unwrap() {
        Lookup::Found(o) => {
            assert_eq!(o.node, first.node);
            assert_eq!(o.cloud_id, first.cloud_id);
        }
        other => panic!("expected Found, got {other:?}"),
    }
    // A retried saga (or a restarted broker) does not boot a second server.
    let again = h.create_node(&create("op-x", None)).await.unwrap();
    assert_eq!(again.cloud_id, first.cloud_id);
    assert_eq!(os.servers().len(), 1);
    assert_eq!(os.requests_matching("POST", "/servers").len(), 1);
}

#[tokio::test]
async fn quota_preflight_refuses_without_booting() {
    let os = FakeOpenStack::start().await;
    os.set_limits(Limits {
        instances: 10,
        cores: 3,
        ram: 51200,
        volumes: 10,
        gigabytes: 1000,
    });
    os.add_server("openshift-node_1", &[]); // m1.small: 1 core used, 2 left; m1.medium needs 2
    let h = handler(&os, 10);
    let cap = h.capacity(&group(), &shape(None)).await.unwrap();
    assert_eq!(cap.nodes_available, Some(1), "{}", cap.detail);
    h.create_node(&create("op-a", None)).await.unwrap();
    let cap = h.capacity(&group(), &shape(None)).await.unwrap();
    assert_eq!(cap.nodes_available, Some(0));
    assert!(cap.detail.contains("cores"), "{}", cap.detail);
    let err = h.create_node(&create("op-b", None)).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
    assert_eq!(
        os.requests_matching("POST", "/servers").len(),
        1,
        "no second boot was asked"
    );
}

#[tokio::test]
async fn nova_quota_refusal_is_quota() {
    let os = FakeOpenStack::start().await;
    let h = handler(&os, 10);
    // Another client takes the last instance between our pre-flight and our boot.
    os.fail_next(
        "POST",
        "/compute/v2.1/servers",
        403,
        json!({"forbidden": {"code": 403, "message": "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"}}),
    );
    let err = h.create_node(&create("op-q", Some(10))).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
    assert!(
        os.volumes().is_empty(),
        "the volume of a refused boot is deleted"
    );
    // Cinder's 413 overLimit is quota too.
    os.set_limits(Limits {
        instances: 10,
        cores: 20,
        ram: 51200,
        volumes: 0,
        gigabytes: 1000,
    });
    let err = h.create_node(&create("op-q2", Some(10))).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
    assert!(os.servers().is_empty());
}

#[tokio::test]
async fn names_run_out_at_max_nodes() {
    let os = FakeOpenStack::start().await;
    let h = handler(&os, 2);
    h.create_node(&create("op-1", None)).await.unwrap();
    h.create_node(&create("op-2", None)).await.unwrap();
    let cap = h.capacity(&group(), &shape(None)).await.unwrap();
    assert_eq!(cap.nodes_available, Some(0));
    let err = h.create_node(&create("op-3", None)).await.unwrap_err();
    assert!(
        err.is_quota() && err.to_string().contains("max_nodes"),
        "{err}"
    );
}

#[tokio::test]
async fn boot_fault_naming_a_quota_is_quota() {
    let os = FakeOpenStack::start().await;
    os.fail_next_boot("Build of instance aborted: Quota exceeded for ram: Requested 4096, but already used 49152 of 51200 ram");
    let h = handler(&os, 10);
    // The volume makes the handler wait for ACTIVE, where the fault shows.
    let err = h.create_node(&create("op-f", Some(5))).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
}

#[tokio::test]
async fn remove_deletes_server_and_volume_and_is_idempotent() {
    let os = FakeOpenStack::start().await;
    let h = handler(&os, 10);
    let out = h.create_node(&create("op-r", Some(20))).await.unwrap();
    let node = out.node.clone().unwrap();
    assert_eq!(
        h.presence(&node, &group()).await.unwrap(),
        Presence::Present
    );
    let req = RemoveRequest {
        op: "op-down".into(),
        group: group(),
        node: node.clone(),
        cloud_id: None,
        attempt: 1,
        epoch: 0,
    };
    let r = h.remove_node(&req).await.unwrap();
    assert!(r.gone, "{}", r.detail);
    assert!(os.servers().is_empty());
    assert!(os.volumes().is_empty(), "{}", r.detail);
    assert_eq!(h.presence(&node, &group()).await.unwrap(), Presence::Gone);
    let del = &os.requests_matching("DELETE", "/servers/")[0];
    assert!(del.path.ends_with(out.cloud_id.as_deref().unwrap()));
    // Again: nothing left to delete, still success.
    let r = h.remove_node(&req).await.unwrap();
    assert!(r.gone);
    assert_eq!(os.requests_matching("DELETE", "/servers/").len(), 1);
    // A host that does not follow our naming and that no server claims: unknown.
    assert_eq!(
        h.presence("web-1.example.com", &group()).await.unwrap(),
        Presence::Unknown
    );
    os.assert_no_violations();
}

#[tokio::test]
async fn missing_flavor_or_image_is_permanent() {
    let os = FakeOpenStack::start().await;
    let h = handler(&os, 10);
    let mut req = create("op-p", None);
    req.shape.flavor = Some("m9.nope".into());
    let err = h.create_node(&req).await.unwrap_err();
    assert_eq!(err.label(), "permanent", "{err}");
    req.shape.flavor = None;
    assert_eq!(h.create_node(&req).await.unwrap_err().label(), "permanent");
    let mut req = create("op-p2", None);
    req.shape.image = Some("no-such-image".into());
    let err = h.create_node(&req).await.unwrap_err();
    assert_eq!(err.label(), "permanent", "{err}");
    assert!(os.servers().is_empty());
}
