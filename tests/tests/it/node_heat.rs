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

/// A node whose member is the middle one of `paas-nodes`' AutoScalingGroup:
/// `[heat]` names the stack declaring the group and the node's server id
/// (the member lives in the group's nested stack and is found there).
/// Signals are not confirmed here (`confirm_timeout = 0s`) so that each
/// action's requests can be checked one by one; see `confirmed_signals`.
async fn setup() -> Setup {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(FakeStack::asg("paas-nodes", "node-", 3));
    let dir = temp_dir();
    let (sname, sid) = stack.split_once('/').unwrap();
    let victim = os.members("paas-nodes")[1].clone();
    let heat = HeatSection {
        scale_up_url: Some(os.alarm_url(&stack, "scale_up")),
        scale_down_url: Some(os.alarm_url(&stack, "scale_down")),
        signal_url: Some(os.signal_url(&stack, "scale_up")),
        stack_name: Some(sname.into()),
        stack_id: Some(sid.into()),
        server_id: Some(victim.server_id.clone()),
        mark_unhealthy_removes: false,
        confirm_timeout: Duration::ZERO,
        credentials: CredentialSource::CloudsYaml,
        cloud: Some("fake".into()),
        clouds_yaml: Some(clouds_yaml(dir.path(), &os)),
        timeout: Duration::from_secs(10),
        ..HeatSection::default()
    };
    let member = victim.name;
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
            epoch: 0,
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
            epoch: 0,
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
        // heat-api-cfn's shape: the ARN's colons encoded, its slashes literal.
        let want_path = format!(
            "/heat-cfn/v1/signal/arn%3Aopenstack%3Aheat%3A%3A{PROJECT_ID}%3Astacks/{sname}/{sid}/resources/{policy}"
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
    // Aodh's shape: Heat records "alarm state changed from ok to alarm (...)".
    let node = &n.node;
    assert_eq!(
        r.body,
        Some(
            json!({"previous": "ok", "current": "alarm", "reason": format!("{node}: node full"), "host": node})
        )
    );
}

/// mark_unhealthy: find the member by the node's server id, then PATCH it
/// in the group's nested stack with the documented body.
async fn mark_unhealthy(s: &Setup, n: &mut HeatNode) {
    s.os.clear_requests();
    let out = n.signal(HeatAction::MarkUnhealthy, "node drained").await;
    assert!(matches!(&out.msg, Message::Done(_)), "{out:?}");
    let reqs = heat_requests(&s.os);
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(
        (
            reqs[0].method.as_str(),
            reqs[0].path.as_str(),
            reqs[0].query.as_deref()
        ),
        (
            "GET",
            format!("/heat/v1/{PROJECT_ID}/stacks/{}/resources", s.stack).as_str(),
            Some("nested_depth=2")
        )
    );
    let r = &reqs[1];
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
/// a refused pre-signed URL (heat-api-cfn's XML, 400, not retryable).
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
    s.os.fail_next_raw(
        "POST",
        "/heat-cfn/v1/signal/",
        400,
        "application/xml; charset=UTF-8",
        "<ErrorResponse><Error><Type>Sender</Type><Code>IncompleteSignature</Code><Message>The request signature does not conform to AWS standards</Message></Error></ErrorResponse>",
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
/// node's member, updates the stack so that Heat removes exactly it (a
/// scale-down signal would take one more), reports it, and the agent stops.
async fn remove_marks_unhealthy(url: &str) {
    init_logging();
    let mut s = setup().await;
    s.heat.mark_unhealthy_removes = true;
    let mut n = HeatNode::start(url, &s, "n-heatrm-", RemoveAction::MarkUnhealthy).await;
    let id = n
        .ctl
        .send(&n.node, Deactivate::default(), Some("sd-9"))
        .await;
    n.events.outcome(id, WAIT).await;
    s.os.clear_requests();
    let remove = Remove {
        reason: "scale-down sd-9".into(),
        epoch: 0,
    };
    let id = n.ctl.send(&n.node, remove, Some("sd-9")).await;
    let out = n.events.outcome(id, WAIT).await;
    match &out.msg {
        Message::Done(d) => match &d.result {
            CommandResult::Removed { action, detail } => {
                assert_eq!(action, "heat:mark_unhealthy");
                assert!(detail.starts_with("HTTP 202"), "{detail}");
                assert!(detail.contains(&s.member), "{detail}");
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let patches: Vec<_> = heat_requests(&s.os)
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert!(
        patches[0]
            .path
            .ends_with(&format!("/resources/{}", s.member))
    );
    assert_eq!(
        patches[0].body,
        Some(json!({"mark_unhealthy": true, "resource_status_reason": "scale-down sd-9"}))
    );
    assert!(patches[1].path.ends_with(&format!("/stacks/{}", s.stack)));
    assert_eq!(patches[1].body, Some(json!({"parameters": {}})));
    assert_eq!(n.running.join().await, gearshift_node::RunExit::Removed);
    let heat = gearshift_cloud::heat::Heat::new(s.os.session());
    let id = gearshift_cloud::heat::StackId::parse(&s.stack).unwrap();
    heat.wait_update(&id, None, Duration::from_secs(5), Duration::from_millis(10))
        .await
        .unwrap();
    let left: Vec<String> =
        s.os.members("paas-nodes")
            .into_iter()
            .map(|m| m.name)
            .collect();
    assert_eq!(left.len(), 2);
    assert!(
        !left.contains(&s.member),
        "exactly the node's own member went: {left:?}"
    );
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
    // Confirmed: Heat started scaling the group the policy names.
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.contains("signal: HTTP 200"), "{stdout}");
    assert!(
        stdout.contains("Heat started scaling group asg"),
        "{stdout}"
    );
    let posts: Vec<_> = heat_requests(&s.os)
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1, "one signal");
    assert_eq!(
        posts[0].body,
        Some(
            json!({"previous": "ok", "current": "alarm", "reason": "node-7.example.com: by hand", "host": "node-7.example.com"})
        )
    );
    assert_eq!(token_requests(&s.os).len(), 1);
    assert_eq!(
        s.os.policy_events("paas-nodes", "scale_up"),
        ["alarm state changed from ok to alarm (node-7.example.com: by hand)"]
    );
    subcommand_errors(&s, &run).await;
}

/// An error answer (heat-api-cfn's XML): non-zero exit, with the HTTP
/// status; not configured: a usage error before any request.
async fn subcommand_errors<F, Fut>(s: &Setup, run: &F)
where
    F: Fn(&'static [&'static str]) -> Fut,
    Fut: std::future::Future<Output = std::process::Output>,
{
    s.os.fail_next_raw(
        "POST",
        "/heat-cfn/v1/signal/",
        403,
        "application/xml; charset=UTF-8",
        "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>User is not authorized to perform action</Message></Error></ErrorResponse>",
    );
    let out = run(&["heat-signal", "scale_up"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("HTTP 403") && err.contains("AccessDenied"),
        "{err}"
    );
    s.os.clear_requests();
    let out = run(&["heat-signal", "mark_unhealthy"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stack_name"));
    assert!(s.os.requests().is_empty());
    s.os.assert_no_violations();
}

/// Signals confirmed by watching the group (the fake follows Heat 27: 200
/// first, then the group scales, or nothing happens and no event is
/// written): a scale-up is confirmed; at `max_size` and in a cooldown the
/// signal is refused before it is sent, as Heat would ignore it.
#[tokio::test]
async fn confirmed_signals() {
    let os = FakeOpenStack::start().await;
    let stack = os.add_stack(
        FakeStack::asg("paas-nodes", "node-", 1)
            .with_limits(1, 2)
            .with_cooldown("scale_down", 600),
    );
    let dir = temp_dir();
    let (sname, sid) = stack.split_once('/').unwrap();
    let heat = HeatSection {
        scale_up_url: Some(os.alarm_url(&stack, "scale_up")),
        scale_down_url: Some(os.alarm_url(&stack, "scale_down")),
        stack_name: Some(sname.into()),
        stack_id: Some(sid.into()),
        credentials: CredentialSource::CloudsYaml,
        cloud: Some("fake".into()),
        clouds_yaml: Some(clouds_yaml(dir.path(), &os)),
        ..HeatSection::default()
    };
    let sig = HeatSignaller::new(&heat, "n1").unwrap();
    use gearshift_node::heat::Signaller;
    let out = sig.signal(HeatAction::ScaleUp, "more").await.unwrap();
    assert!(
        out.detail.contains("Heat started scaling"),
        "{}",
        out.detail
    );
    assert_eq!(os.members("paas-nodes").len(), 2);
    let e = sig.signal(HeatAction::ScaleUp, "more").await.unwrap_err();
    assert!(e.message.contains("max_size 2") && e.retryable, "{e:?}");
    sig.signal(HeatAction::ScaleDown, "less").await.unwrap();
    assert_eq!(os.members("paas-nodes").len(), 1);
    let e = sig.signal(HeatAction::ScaleUp, "again").await.unwrap_err();
    assert!(e.message.contains("cooldown") && e.retryable, "{e:?}");
    assert_eq!(os.signals().len(), 2, "refused signals are not sent");
    os.assert_no_violations();
}
