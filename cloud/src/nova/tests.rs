use super::*;

fn limits(inst: (i64, i64), cores: (i64, i64), ram: (i64, i64)) -> AbsoluteLimits {
    AbsoluteLimits {
        max_total_instances: inst.0,
        total_instances_used: inst.1,
        max_total_cores: cores.0,
        total_cores_used: cores.1,
        max_total_ram_size: ram.0,
        total_ram_used: ram.1,
    }
}

#[test]
fn quota_preflight_picks_the_binding_limit() {
    let f = Flavor {
        id: "3".into(),
        name: "m1.medium".into(),
        vcpus: 2,
        ram: 4096,
        disk: 40,
    };
    let (n, why) = limits((10, 2), (20, 15), (51200, 8192)).servers_that_fit(&f);
    assert_eq!(n, Some(2));
    assert!(why.contains("cores binds"), "{why}");
    let (n, _) = limits((10, 10), (-1, 0), (-1, 0)).servers_that_fit(&f);
    assert_eq!(n, Some(0));
    let (n, _) = limits((-1, 3), (-1, 0), (-1, 0)).servers_that_fit(&f);
    assert_eq!(n, None);
    // Over-used (quota lowered below usage) means zero, not a wrap.
    let (n, _) = limits((5, 7), (-1, 0), (-1, 0)).servers_that_fit(&f);
    assert_eq!(n, Some(0));
}

#[test]
fn create_body() {
    let b = ServerCreate {
        name: "openshift-node_3".into(),
        flavor_id: "3".into(),
        image_id: "img".into(),
        user_data: Some("#cloud-config\n".into()),
        network_ids: vec!["n1".into()],
        security_groups: vec!["node".into()],
        metadata: [("gearshift_op".to_string(), "op-1".to_string())].into(),
        ..Default::default()
    }
    .to_body()
    .unwrap();
    assert_eq!(b["server"]["user_data"], "I2Nsb3VkLWNvbmZpZwo=");
    assert_eq!(b["server"]["networks"], json!([{"uuid": "n1"}]));
    assert_eq!(b["server"]["security_groups"], json!([{"name": "node"}]));
    assert!(b["server"].get("availability_zone").is_none());
    let too_big = ServerCreate {
        user_data: Some("x".repeat(60_000)),
        ..Default::default()
    };
    assert!(too_big.to_body().is_err());
}

#[test]
fn uuids() {
    assert!(looks_like_uuid("70a599e0-31e7-49b7-b260-868f441e862b"));
    assert!(looks_like_uuid("70a599e031e749b7b260868f441e862b"));
    assert!(!looks_like_uuid("openshift-node-image"));
}
