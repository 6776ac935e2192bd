//! The shipped Heat templates' node user data (`docs/heat/`), run for real:
//! each script runs under bash against the packaged `conf/node.toml` in a
//! temporary root (its `/etc/` paths moved there, `curl` answering with the
//! instance metadata, `systemctl` recording its calls), and the real
//! `gearshift-node check-config` must accept the result. The packaged file
//! already has `[bus]` and `[push_stats]`, so appending those tables (what
//! the templates once did) gives a file the agent refuses; that is checked
//! too, so that the test cannot pass by accident.

use std::path::Path;
use std::process::Command;

use gearshift_tests::bins::{node_binary, shipped_config_with_keys};
use gearshift_tests::repo_root;
use serde_yaml::Value;

const BUS_URL: &str = "stomp://gearshift:pw@mq.example.com:61613?flavor=activemq";
const SERVER_ID: &str = "7b1c3c2e-5d2a-4a38-9d55-0c3f0b6f2a11";
const ASG: &str = "paas-NodeGroup-x1";

fn template(name: &str) -> Value {
    let path = repo_root().join("docs/heat").join(name);
    let text = std::fs::read_to_string(&path).expect("read the template");
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A sample enrollment token (base64url characters, as minted).
const TOKEN: &str = "eyJib2R5Ijp7ImRpc3RyaWN0IjoiZDEifX0-sample_token";

/// The HOT template's node user data, its placeholders given sample values
/// and `token` as its enrollment token (empty: none).
fn hot_script(token: &str) -> String {
    let t = template("gearshift-autoscaling.yaml");
    let sr = &t["resources"]["node_group"]["properties"]["resource"]["properties"]["user_data"]["str_replace"];
    let mut script = sr["template"].as_str().expect("user data").to_string();
    let params = sr["params"].as_mapping().expect("params");
    for k in params.keys() {
        let k = k.as_str().unwrap();
        let v = match k {
            "__BUS_URL__" => BUS_URL,
            "__PUSH_NODES__" => "true",
            "__AUTH_URL__" => "https://keystone.example.com/v3",
            "__ENROLL_TOKEN__" => token,
            other => other.trim_matches('_'),
        };
        script = script.replace(k, v);
    }
    script
}

/// The CloudFormation-era template's node user data (`Fn::Join` of strings
/// and references), with sample values for the references.
fn cfn_script() -> String {
    let t = template("gearshift-autoscaling-cfn.yaml");
    let join =
        &t["Resources"]["NodeLaunchConfig"]["Properties"]["UserData"]["Fn::Base64"]["Fn::Join"];
    let parts = join[1].as_sequence().expect("join list");
    parts
        .iter()
        .map(
            |p| match (p.as_str(), p.get("Ref").and_then(Value::as_str)) {
                (Some(s), _) => s.to_string(),
                (None, Some("BusUrl")) => BUS_URL.to_string(),
                (None, Some("CloudWatchUrl")) => "http://heat.example.com:8003/v1".to_string(),
                (None, Some(r)) => format!("REF-{r}"),
                (None, None) => "GETATT".to_string(),
            },
        )
        .collect()
}

/// Writes an executable `name` into `bin`.
fn stub(bin: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = bin.join(name);
    std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs `script` in a temporary root holding the packaged node.toml;
/// returns the root and the resulting node.toml's path.
fn run_in_root(script: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let etc = r.join("etc/gearshift");
    std::fs::create_dir_all(&etc).unwrap();
    // The packaged file with its key paths under the root and the keys it
    // names written there: the user data's check-config loads them.
    let conf = shipped_config_with_keys("node", &etc);
    let bin = r.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let meta = serde_json::json!({
        "uuid": SERVER_ID,
        "meta": {"metering.AutoScalingGroupName": ASG},
    });
    stub(&bin, "curl", &format!("echo '{meta}'"));
    let log = r.join("systemctl.log");
    stub(
        &bin,
        "systemctl",
        &format!("echo \"$@\" >> {}", log.display()),
    );
    std::os::unix::fs::symlink(node_binary(), bin.join("gearshift-node")).unwrap();
    let script = script.replace("/etc/", &format!("{}/etc/", r.display()));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "the user data failed: {}\n{}\nscript:\n{script}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = std::fs::read_to_string(&log).expect("systemctl was called");
    assert_eq!(calls.trim(), "enable --now gearshift-node");
    (root, conf)
}

/// `gearshift-node check-config FILE`: (exit code, stdout and stderr).
fn check_config(conf: &Path) -> (Option<i32>, String) {
    let out = Command::new(node_binary())
        .arg("check-config")
        .arg(conf)
        .output()
        .expect("run gearshift-node check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The resulting file is accepted, has one `[bus]` and one `[push_stats]`
/// table, and carries the template's values.
fn check_result(conf: &Path) -> toml::Table {
    let (code, text) = check_config(conf);
    assert_eq!(code, Some(0), "check-config refused the result: {text}");
    let body = std::fs::read_to_string(conf).unwrap();
    for table in ["[bus]", "[push_stats]"] {
        let n = body.lines().filter(|l| l.trim() == table).count();
        assert_eq!(n, 1, "{table} appears {n} times:\n{body}");
    }
    let t: toml::Table = body.parse().expect("valid TOML");
    assert_eq!(t["bus"]["url"].as_str(), Some(BUS_URL));
    assert_eq!(t["push_stats"]["enabled"].as_bool(), Some(true));
    // The packaged keys the user data does not set are still there.
    assert_eq!(t["bus"]["heartbeat"].as_str(), Some("10s"));
    t
}

#[test]
fn hot_user_data_gives_a_node_toml_that_check_config_accepts() {
    let (_root, conf) = run_in_root(&hot_script(""));
    let t = check_result(&conf);
    // No token: [enroll] keeps the packaged token file (the nova handler's).
    let file = t["enroll"]["token_file"].as_str().unwrap();
    assert!(file.ends_with("/boot.json"), "{file}");
    let g = &t["push_stats"]["gnocchi"];
    assert_eq!(g["resource_id"].as_str(), Some(SERVER_ID));
    assert!(
        g["auth_env_file"]
            .as_str()
            .unwrap()
            .ends_with("/etc/gearshift/auth.env"),
        "{g}"
    );
    assert!(
        std::path::Path::new(g["auth_env_file"].as_str().unwrap()).exists(),
        "the user data wrote the credentials file it names"
    );
}

#[test]
fn hot_user_data_with_a_token_enrolls_a_node_without_a_key() {
    let (_root, conf) = run_in_root(&hot_script(TOKEN));
    let t = check_result(&conf);
    let file = t["enroll"]["token_file"]
        .as_str()
        .expect("[enroll] token_file");
    assert!(file.ends_with("/etc/gearshift/enroll.token"), "{file}");
    assert_eq!(std::fs::read_to_string(file).unwrap().trim(), TOKEN);
    // A node booted by a scale-up has no key of its own yet: the agent makes
    // it at start, so check-config accepts its absence (and says so).
    let key = t["keys"]["signing_key"].as_str().expect("keys.signing_key");
    std::fs::remove_file(key).unwrap();
    let (code, text) = check_config(&conf);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("does not exist yet"), "{text}");
    // Without the token, a missing key is an error as before.
    std::fs::remove_file(file).unwrap();
    let (code, text) = check_config(&conf);
    assert_ne!(code, Some(0), "{text}");
}

#[test]
fn cfn_user_data_gives_a_node_toml_that_check_config_accepts() {
    let (_root, conf) = run_in_root(&cfn_script());
    let t = check_result(&conf);
    assert_eq!(
        t["push_stats"]["dimensions"]["AutoScalingGroupName"].as_str(),
        Some(ASG)
    );
    let cw = &t["push_stats"]["cloudwatch"];
    assert_eq!(
        cw["endpoint"].as_str(),
        Some("http://heat.example.com:8003/v1")
    );
}

#[test]
fn appending_a_bus_table_to_the_packaged_node_toml_is_refused() {
    // What the templates did before: the agent must refuse it, or the two
    // tests above would prove nothing.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("node.toml");
    let mut body = std::fs::read_to_string(repo_root().join("conf/node.toml")).unwrap();
    body.push_str(&format!("\n[bus]\nurl = \"{BUS_URL}\"\n"));
    std::fs::write(&conf, body).unwrap();
    let (code, text) = check_config(&conf);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("bus"), "{text}");
}
