//! The node agent's Heat signals (the cfn-push-stats role), driven over the
//! real bus (AMQP and STOMP) with `cmd.heat_signal` and `cmd.remove`, against
//! the in-process fake Keystone + Heat. Each action must send exactly the
//! documented request, and an error answer must come back as `event.failed`
//! with Heat's HTTP status. The binary's `heat-signal` subcommand is checked
//! the same way.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gearshift_node::config::{CredentialSource, HeatSection, RemoveAction};
use gearshift_node::heat::HeatSignaller;
use gearshift_proto::Envelope;
use gearshift_proto::msg::{CommandResult, Deactivate, HeatAction, HeatSignal, Message, Remove};
use gearshift_tests::fake_openstack::{
    FakeOpenStack, FakeStack, PASSWORD, PROJECT_ID, PROJECT_NAME, USERNAME,
};
use gearshift_tests::node_harness::{
    Controller, Keys, Running, Verified, WAIT, agent_config, connect, state_dir, temp_dir, unique,
};
use gearshift_tests::node_process::{node_binary, write_file};
use gearshift_tests::node_scenarios::sim_world;
use gearshift_tests::{amqp_url, init_logging, stomp_url};
use serde_json::json;

/// A `clouds.yaml` with the fake's password user (the node's own credentials).
fn clouds_yaml(dir: &Path, os: &FakeOpenStack) -> std::path::PathBuf {
    write_file(
        dir,
        "clouds.yaml",
        &format!(
            "clouds:\n  fake:\n    auth:\n      auth_url: {}\n      username: {USERNAME}\n      password: {PASSWORD}\n      project_name: {PROJECT_NAME}\n      user_domain_name: Default\n      project_domain_name: Default\n    region_name: RegionOne\n    interface: public\n",
            os.auth_url()
        ),
    )
}

struct Setup {
    os: FakeOpenStack,
    stack: String,
    member: String,
    heat: HeatSection,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("paas-nodes", "node-", 3));
    let dir = temp_dir();
    let group = os.group_stack("paas-nodes");
    let (gname, gid) = group.split_once('/').unwrap();
    let member = os.members("paas-nodes")[1].name.clone();
    let heat = HeatSection {
        scale_up_url: Some(os.alarm_url(&stack, "scale_up")),
        scale_down_url: Some(os.alarm_url(&stack, "scale_down")),
        signal_url: Some(os.signal_url(&stack, "scale_up")),
        stack_name: Some(gname.into()),
        stack_id: Some(gid.into()),
        member: Some(member.clone()),
        credentials: CredentialSource::CloudsYaml,
        cloud: Some("fake".into()),
        clouds_yaml: Some(clouds_yaml(dir.path(), &os)),
        timeout: Duration::from_secs(10),
        ..HeatSection::default()
    };
    Setup {
        os,
        stack,
        member,
        heat,
        _dir: dir,
    }
}

fn token_requests(os: &FakeOpenStack) -> Vec<gearshift_tests::fake_openstack::Recorded> {
    os.requests_matching("POST", "/identity/v3/auth/tokens")
}

fn heat_requests(os: &FakeOpenStack) -> Vec<gearshift_tests::fake_openstack::Recorded> {
    os.requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/heat"))
        .collect()
}

/// A node agent with a Heat signaller for `s`'s stack, and its controller.
struct HeatNode {
    ctl: Controller,
    node: String,
    events: Verified,
    running: Running,
    _dir: tempfile::TempDir,
}

impl HeatNode {
    async fn start(url: &str, s: &Setup, prefix: &str, remove_action: RemoveAction) -> HeatNode {
        let keys = Keys::new();
        let ctl = Controller::connect(url, keys.clone()).await;
        let node = unique(prefix);
        let node_key = gearshift_proto::KeyPair::generate().unwrap();
        let dir = temp_dir();
        let (_w, rt, _) = sim_world(&node, 0);
        let mut cfg = agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node));
        cfg.remove_action = remove_action;
        cfg.signaller = Some(Arc::new(HeatSignaller::new(&s.heat, &node).unwrap()));
        ctl.prepare(&node).await;
        let events = ctl.events(&node, &node_key).await;
        let running = Running::start(cfg, connect(url, &node).await, rt);
        HeatNode {
            ctl,
            node,
            events,
            running,
            _dir: dir,
        }
    }

    /// Sends `cmd.heat_signal` and returns the command's outcome.
    async fn signal(&mut self, action: HeatAction, reason: &str) -> Envelope {
        let signal = HeatSignal {
            action,
            reason: reason.to_string(),
        };
        let id = self.ctl.send(&self.node, signal, Some("op-h")).await;
        self.events.outcome(id, WAIT).await
    }
}

async fn heat_actions(url: &str) {
    init_logging();
    let s = setup().await;
    let mut n = HeatNode::start(url, &s, "n-heat-", RemoveAction::default()).await;
    alarm_urls(&s, &mut n).await;
    native_signal(&s, &mut n).await;
    mark_unhealthy(&s, &mut n).await;
    heat_errors(&s, &mut n).await;
    s.os.assert_no_violations();
    n.running.stop().await;
}

/// scale_up and scale_down: POST the pre-signed alarm_url, no token, no body.
async fn alarm_urls(s: &Setup, n: &mut HeatNode) {
    let (sname, sid) = s.stack.split_once('/').unwrap();
    for (action, policy) in [
        (HeatAction::ScaleUp, "scale_up"),
        (HeatAction::ScaleDown, "scale_down"),
    ] {
        s.os.clear_requests();
        let signal = HeatSignal {
            action,
            reason: "capacity".into(),
        };
        let id = n.ctl.send(&n.node, signal, Some("op-h")).await;
        let ack = n.events.next(WAIT).await;
        assert!(
            matches!(&ack.msg, Message::Ack(a) if a.cmd == id),
            "{ack:?}"
        );
        let out = n.events.outcome(id, WAIT).await;
        match &out.msg {
            Message::Done(d) => match &d.result {
                CommandResult::HeatSignalled {
                    action: a, status, ..
                } => {
                    assert_eq!((*a, *status), (action, 200));
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        let reqs = heat_requests(&s.os);
        assert_eq!(reqs.len(), 1, "exactly one request: {reqs:?}");
        let r = &reqs[0];
        assert_eq!(r.method, "POST");
        let arn =
            format!("arn:openstack:heat::{PROJECT_ID}:stacks/{sname}/{sid}/resources/{policy}");
        let want_path = format!(
            "/heat-cfn/v1/signal/{}",
            url::form_urlencoded::byte_serialize(arn.as_bytes()).collect::<String>()
        );
        assert_eq!(r.path, want_path);
        let q = r.query.clone().unwrap_or_default();
        assert!(
            q.contains("Signature=") && q.contains("SignatureMethod=HmacSHA256"),
            "{q}"
        );
        assert_eq!(
            r.header("x-auth-token"),
            None,
            "pre-signed URLs carry no token"
        );
        assert_eq!(r.body_len, 0, "no body");
        assert!(
            token_requests(&s.os).is_empty(),
            "no Keystone call for alarm URLs"
        );
    }
    let sigs = s.os.signals();
    assert_eq!(sigs.len(), 2);
    assert!(sigs.iter().all(|x| x.via == "alarm_url"));
}

/// signal: a Keystone v3 token, then POST signal_url with it and a JSON body.
async fn native_signal(s: &Setup, n: &mut HeatNode) {
    let (sname, sid) = s.stack.split_once('/').unwrap();
    s.os.clear_requests();
    let out = n.signal(HeatAction::Signal, "node full").await;
    assert!(matches!(&out.msg, Message::Done(_)), "{out:?}");
    let tok = token_requests(&s.os);
    assert_eq!(tok.len(), 1);
    assert_eq!(
        tok[0].body,
        Some(json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": USERNAME, "domain": {"name": "Default"}, "password": PASSWORD}}},
            "scope": {"project": {"name": PROJECT_NAME, "domain": {"name": "Default"}}}}}))
    );
    let reqs = heat_requests(&s.os);
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = &reqs[0];
    assert_eq!(r.method, "POST");
    assert_eq!(
        r.path,
        format!("/heat/v1/{PROJECT_ID}/stacks/{sname}/{sid}/resources/scale_up/signal")
    );
    let token = r.header("x-auth-token").expect("token sent").to_string();
    assert!(s.os.token_is_valid(&token));
    assert!(
        r.header("content-type")
            .unwrap_or_default()
            .starts_with("application/json")
    );
    assert_eq!(r.body, Some(json!({"host": n.node, "reason": "node full"})));
}

/// mark_unhealthy: PATCH the member with the documented body.
async fn mark_unhealthy(s: &Setup, n: &mut HeatNode) {
    s.os.clear_requests();
    let out = n.signal(HeatAction::MarkUnhealthy, "node drained").await;
    assert!(matches!(&out.msg, Message::Done(_)), "{out:?}");
    let reqs = heat_requests(&s.os);
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = &reqs[0];
    let group = s.os.group_stack("paas-nodes");
    assert_eq!(r.method, "PATCH");
    assert_eq!(
        r.path,
        format!(
            "/heat/v1/{PROJECT_ID}/stacks/{group}/resources/{}",
            s.member
        )
    );
    assert!(s.os.token_is_valid(r.header("x-auth-token").unwrap()));
    assert_eq!(
        r.body,
        Some(json!({"mark_unhealthy": true, "resource_status_reason": "node drained"}))
    );
    let m =
        s.os.members("paas-nodes")
            .into_iter()
            .find(|m| m.name == s.member)
            .unwrap();
    assert_eq!(
        (m.status.as_str(), m.reason.as_str()),
        ("CHECK_FAILED", "node drained")
    );
}

/// Errors come back with Heat's status: a busy stack (409, retryable) and
/// a refused pre-signed URL (400, not retryable).
async fn heat_errors(s: &Setup, n: &mut HeatNode) {
    s.os.fail_next(
        "PATCH",
        "/resources/",
        409,
        json!({"explanation": "There was a conflict when trying to complete your request.", "code": 409,
               "error": {"message": "Stack paas-nodes already has an action (UPDATE) in progress.",
                         "traceback": null, "type": "ActionInProgress"}, "title": "Conflict"}),
    );
    match &n.signal(HeatAction::MarkUnhealthy, "again").await.msg {
        Message::Failed(f) => {
            assert_eq!(f.http_status, Some(409));
            assert!(f.retryable, "a busy stack may accept later");
            assert!(f.error.contains("in progress"), "{}", f.error);
        }
        other => panic!("{other:?}"),
    }
    s.os.fail_next(
        "POST",
        "/heat-cfn/v1/signal/",
        400,
        json!({"Error": {"Code": "InvalidParameterValue", "Message": "Signature mismatch", "Type": "Sender"}}),
    );
    match &n.signal(HeatAction::ScaleUp, "more").await.msg {
        Message::Failed(f) => {
            assert_eq!(f.http_status, Some(400));
            assert!(!f.retryable);
        }
        other => panic!("{other:?}"),
    }
}

/// `cmd.remove` with `remove_action = "mark_unhealthy"` marks exactly this
/// node's member, reports it, and the agent stops.
async fn remove_marks_unhealthy(url: &str) {
    init_logging();
    let s = setup().await;
    let mut n = HeatNode::start(url, &s, "n-heatrm-", RemoveAction::MarkUnhealthy).await;
    let id = n
        .ctl
        .send(&n.node, Deactivate::default(), Some("sd-9"))
        .await;
    n.events.outcome(id, WAIT).await;
    s.os.clear_requests();
    let remove = Remove {
        reason: "scale-down sd-9".into(),
    };
    let id = n.ctl.send(&n.node, remove, Some("sd-9")).await;
    let out = n.events.outcome(id, WAIT).await;
    match &out.msg {
        Message::Done(d) => match &d.result {
            CommandResult::Removed { action, detail } => {
                assert_eq!(action, "heat:mark_unhealthy");
                assert!(detail.starts_with("HTTP 200"), "{detail}");
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let reqs = heat_requests(&s.os);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].body,
        Some(json!({"mark_unhealthy": true, "resource_status_reason": "scale-down sd-9"}))
    );
    assert_eq!(n.running.join().await, gearshift_node::RunExit::Removed);
    s.os.assert_no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_heat_actions() {
    heat_actions(&amqp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stomp_heat_actions() {
    heat_actions(&stomp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_remove_marks_unhealthy() {
    remove_marks_unhealthy(&amqp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stomp_remove_marks_unhealthy() {
    remove_marks_unhealthy(&stomp_url()).await;
}

/// Runs `gearshift-node <args> --config <config>` with only `env`.
async fn node_cli(
    config: &Path,
    env: Vec<(String, String)>,
    args: &[&str],
) -> std::process::Output {
    let (bin, cfg) = (node_binary(), config.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(&args)
            .arg("--config")
            .arg(&cfg)
            .env_clear()
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// `gearshift-node heat-signal` by hand, with `OS_*` credentials from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heat_signal_subcommand() {
    init_logging();
    let s = setup().await;
    let dir = temp_dir();
    let (sname, sid) = s.stack.split_once('/').unwrap();
    let config = write_file(
        dir.path(),
        "node.toml",
        &format!(
            "[node]\nname = \"node-7.example.com\"\n[heat]\nsignal_url = \"{}\"\nscale_up_url = \"{}\"\ncredentials = \"env\"\n",
            s.os.signal_url(&s.stack, "scale_up"),
            s.os.alarm_url(&s.stack, "scale_up"),
        ),
    );
    let run = |args: &'static [&'static str]| node_cli(&config, s.os.env_vars(), args);
    // Dry run: prints the request, sends nothing.
    let out = run(&["heat-signal", "signal", "--dry-run", "--reason", "test"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("/stacks/{sname}/{sid}/resources/scale_up/signal")),
        "{text}"
    );
    assert!(text.contains("\"host\":\"node-7.example.com\""), "{text}");
    assert!(s.os.requests().is_empty(), "a dry run sends nothing");

    let out = run(&["heat-signal", "signal", "--reason", "by hand"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("signal: HTTP 200"));
    let reqs = heat_requests(&s.os);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].body,
        Some(json!({"host": "node-7.example.com", "reason": "by hand"}))
    );
    assert_eq!(token_requests(&s.os).len(), 1);
    subcommand_errors(&s, &run).await;
}

/// An error answer: non-zero exit, with the HTTP status in the message;
/// not configured: a usage error before any request.
async fn subcommand_errors<F, Fut>(s: &Setup, run: &F)
where
    F: Fn(&'static [&'static str]) -> Fut,
    Fut: std::future::Future<Output = std::process::Output>,
{
    s.os.fail_next(
        "POST",
        "/heat-cfn/v1/signal/",
        403,
        json!({"Error": {"Code": "AccessDenied", "Message": "User is not authorized to perform action", "Type": "Sender"}}),
    );
    let out = run(&["heat-signal", "scale_up"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HTTP 403"), "{err}");
    s.os.clear_requests();
    let out = run(&["heat-signal", "mark_unhealthy"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stack_name"));
    assert!(s.os.requests().is_empty());
    s.os.assert_no_violations();
}
