use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::Service;
use chrono::Utc;

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn v2_openrc_gets_v3_and_default_domain() {
    let c = Credentials::from_vars(vars(&[
        ("OS_AUTH_URL", "http://keystone:5000/v2.0/"),
        ("OS_USERNAME", "admin"),
        ("OS_PASSWORD", "pw"),
        ("OS_TENANT_NAME", "demo"),
        ("OS_REGION_NAME", "RegionOne"),
    ]))
    .unwrap();
    assert_eq!(c.auth_url, "http://keystone:5000/v3");
    let body = token_request_body(&c);
    assert_eq!(
        body,
        json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": "admin", "domain": {"id": "default"}, "password": "pw"}}},
            "scope": {"project": {"name": "demo", "domain": {"id": "default"}}}}})
    );
    assert!(!format!("{c:?}").contains("pw\""));
}

#[test]
fn application_credential() {
    let c = Credentials::from_vars(vars(&[
        ("OS_AUTH_URL", "https://k/identity"),
        ("OS_AUTH_TYPE", "v3applicationcredential"),
        ("OS_APPLICATION_CREDENTIAL_ID", "ac1"),
        ("OS_APPLICATION_CREDENTIAL_SECRET", "s3"),
    ]))
    .unwrap();
    assert_eq!(c.auth_url, "https://k/identity/v3");
    assert_eq!(
        token_request_body(&c),
        json!({"auth": {"identity": {"methods": ["application_credential"],
            "application_credential": {"id": "ac1", "secret": "s3"}}}})
    );
    // A project set by hand (or left in OS_PROJECT_NAME) is not sent:
    // Keystone refuses any scope on an application credential with 401.
    let mut scoped = c.clone();
    scoped.project = Some(ProjectRef::Id("p1".into()));
    assert!(token_request_body(&scoped)["auth"].get("scope").is_none());
}

#[test]
fn missing_pieces_are_named() {
    let e = Credentials::from_vars(vars(&[("OS_AUTH_URL", "http://k:5000/v3")])).unwrap_err();
    assert!(e.to_string().contains("no user"), "{e}");
    let e = Credentials::from_vars(vars(&[
        ("OS_AUTH_URL", "http://k:5000/v3"),
        ("OS_USERNAME", "u"),
        ("OS_PASSWORD", "p"),
    ]))
    .unwrap_err();
    assert!(e.to_string().contains("project"), "{e}");
    let e = Credentials::from_vars(vars(&[])).unwrap_err();
    assert!(e.to_string().contains("OS_AUTH_URL"));
}

#[test]
fn env_file() {
    let text = "# openrc\nexport OS_AUTH_URL=http://k:5000/v2.0\nexport OS_USERNAME='bob'\nexport OS_PASSWORD=\"p w\"\nOS_TENANT_NAME=demo\nunset OS_X\n";
    let m = parse_env_file(text).unwrap();
    assert_eq!(m["OS_PASSWORD"], "p w");
    assert_eq!(m["OS_USERNAME"], "bob");
    assert!(parse_env_file("export OS_PASSWORD=$OS_PASSWORD_INPUT").is_err());
}

#[test]
fn clouds_doc() {
    let doc: serde_yaml::Value = serde_yaml::from_str(
        "clouds:\n  c1:\n    auth:\n      auth_url: http://k:5000\n      username: u\n      password: p\n      project_name: pr\n      user_domain_name: Users\n      project_domain_id: pd\n    region_name: R2\n    interface: internal\n",
    )
    .unwrap();
    let c = Credentials::from_clouds_doc("c1", &doc, "t").unwrap();
    assert_eq!(c.region.as_deref(), Some("R2"));
    assert_eq!(c.interface, Interface::Internal);
    assert_eq!(
        c.project,
        Some(ProjectRef::Name {
            name: "pr".into(),
            domain: DomainRef::Id("pd".into())
        })
    );
    assert!(Credentials::from_clouds_doc("nope", &doc, "t").is_err());
}

#[test]
fn identity_api_version_as_written_in_openstack_examples() {
    let base = "clouds:\n  c1:\n    auth:\n      auth_url: http://k:5000\n      username: u\n      password: p\n      project_name: pr\n";
    for v in ["3", "'3'", "3.0"] {
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&format!("{base}    identity_api_version: {v}\n")).unwrap();
        Credentials::from_clouds_doc("c1", &doc, "t").unwrap_or_else(|e| panic!("{v}: {e}"));
    }
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&format!("{base}    identity_api_version: 2\n")).unwrap();
    let e = Credentials::from_clouds_doc("c1", &doc, "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("identity_api_version") && e.contains("only 3"),
        "{e}"
    );
}

#[test]
fn endpoint_selection() {
    let t = Token {
        value: Secret::new("t"),
        expires_at: Utc::now(),
        issued_at: None,
        project_id: Some("p".into()),
        user_id: None,
        catalog: vec![CatalogEntry {
            service_type: "volumev3".into(),
            name: None,
            endpoints: vec![
                Endpoint {
                    interface: "public".into(),
                    region_id: Some("R1".into()),
                    region: None,
                    url: "http://c1/v3/p/".into(),
                },
                Endpoint {
                    interface: "public".into(),
                    region_id: Some("R2".into()),
                    region: None,
                    url: "http://c2/v3/p".into(),
                },
            ],
        }],
    };
    assert_eq!(
        t.endpoint(Service::BlockStorage, Interface::Public, Some("R2"))
            .unwrap(),
        "http://c2/v3/p"
    );
    assert_eq!(
        t.endpoint(Service::BlockStorage, Interface::Public, None)
            .unwrap(),
        "http://c1/v3/p"
    );
    assert!(
        t.endpoint(Service::Compute, Interface::Public, None)
            .is_err()
    );
    assert!(
        t.endpoint(Service::BlockStorage, Interface::Admin, None)
            .is_err()
    );
}
