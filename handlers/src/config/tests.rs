use std::time::Duration;

use super::*;

fn parse(toml_text: &str) -> Result<HandlerConfig, String> {
    toml::from_str::<HandlerConfig>(toml_text).map_err(|e| e.to_string())
}

#[test]
fn every_type_parses_with_defaults() {
    let c = parse("type = \"exec\"\ndir = \"/opt/h\"\n").unwrap();
    let HandlerConfig::Exec(e) = &c else { panic!() };
    assert_eq!(
        (e.program.as_str(), e.quota_exit_code, e.timeout),
        ("event", 3, Duration::from_secs(600))
    );
    c.validate().unwrap();
    parse("type = \"log\"\n").unwrap().validate().unwrap();
    parse("type = \"spool\"\ndir = \"/var/spool/gearshift\"\n")
        .unwrap()
        .validate()
        .unwrap();
    parse("type = \"email\"\nfrom = \"gearshift@example.com\"\nto = [\"ops@example.com\"]\n")
        .unwrap()
        .validate()
        .unwrap();
    let n = parse("type = \"nova\"\n[auth]\nenv_file = \"/etc/gearshift/auth.env\"\n").unwrap();
    let HandlerConfig::Nova(nc) = &n else {
        panic!()
    };
    assert_eq!(
        (nc.base_name.as_str(), nc.max_nodes),
        ("openshift-node", 100)
    );
    n.validate().unwrap();
    parse("type = \"heat\"\nstack = \"paas\"\nremove = \"mark-unhealthy\"\nupdate_timeout = \"20m\"\n")
        .unwrap()
        .validate()
        .unwrap();
    parse("type = \"magnum\"\ncluster = \"c1\"\nnodegroup = \"default-worker\"\n")
        .unwrap()
        .validate()
        .unwrap();
    let h = parse("type = \"heat-via-node\"\n").unwrap();
    assert_eq!(h.kind(), "heat-via-node");
    h.validate().unwrap();
}

#[test]
fn unknown_keys_and_types_are_refused() {
    assert!(
        parse("type = \"spool\"\ndir = \"/x\"\ndri = \"/y\"\n")
            .unwrap_err()
            .contains("dri")
    );
    assert!(
        parse("type = \"nova\"\n[auth]\nenvfile = \"/x\"\n")
            .unwrap_err()
            .contains("envfile")
    );
    assert!(parse("type = \"ftp\"\n").is_err());
}

#[test]
fn validation_names_the_key() {
    let bad = |t: &str, key: &str| {
        let e = parse(t).unwrap().validate().unwrap_err();
        assert_eq!(e.key, key, "{e}");
    };
    bad("type = \"exec\"\ndir = \"relative\"\n", "dir");
    bad(
        "type = \"exec\"\ndir = \"/x\"\nquota_exit_code = 4\n",
        "busy_exit_code",
    );
    bad(
        "type = \"exec\"\ndir = \"/x\"\n[env]\nGEARSHIFT_OP = \"x\"\n",
        "env.GEARSHIFT_OP",
    );
    bad(
        "type = \"email\"\nfrom = \"not an address\"\nto = [\"a@b.c\"]\n",
        "from",
    );
    bad("type = \"email\"\nfrom = \"a@b.c\"\nto = []\n", "to");
    bad(
        "type = \"email\"\nsmtp_host = \"mail.example.com\"\nfrom = \"a@b.c\"\nto = [\"a@b.c\"]\nusername = \"u\"\npassword_file = \"/p\"\n",
        "security",
    );
    bad("type = \"nova\"\nbase_name = \"node_x\"\n", "base_name");
    bad("type = \"nova\"\nmax_nodes = 0\n", "max_nodes");
    bad(
        "type = \"nova\"\n[auth]\ncloud = \"c\"\nenv_file = \"/e\"\n",
        "auth.cloud",
    );
    bad(
        "type = \"nova\"\n[auth]\ninterface = \"private\"\n",
        "auth.interface",
    );
    bad("type = \"heat\"\nstack = \"a/b/c\"\n", "stack");
    bad(
        "type = \"heat\"\nstack = \"s\"\nscale_up_alarm_url = \"ftp://x\"\n",
        "scale_up_alarm_url",
    );
    bad(
        "type = \"heat\"\nstack = \"s\"\npoll_interval = \"0s\"\n",
        "poll_interval",
    );
    bad("type = \"magnum\"\ncluster = \"\"\n", "cluster");
    bad(
        "type = \"heat-via-node\"\nscale_up_action = \"mark_unhealthy\"\n",
        "scale_up_action",
    );
}

fn parse_ok(t: &str) -> HandlerConfig {
    toml::from_str(t).unwrap()
}

#[test]
fn longest_call_follows_the_handler_waits() {
    assert_eq!(parse_ok("type = \"log\"").longest_call(), None);
    let nova = parse_ok(
        "type = \"nova\"\nbase_name = \"openshift-node\"\ndomain = \"example.com\"\nboot_timeout = \"10m\"\nvolume_timeout = \"5m\"\ndelete_timeout = \"3m\"\n",
    );
    assert_eq!(nova.longest_call(), Some(Duration::from_secs(15 * 60)));
    let heat = parse_ok("type = \"heat\"\nstack = \"paas\"\nupdate_timeout = \"20m\"\n");
    assert_eq!(heat.longest_call(), Some(Duration::from_secs(20 * 60)));
}
