//! The loopback Keystone + Heat that `scripts/setup-openstack` runs, and
//! stacks of `OS::Heat::TestResource` members created (and deleted) for
//! one test.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gearshift_cloud::heat::scaling::SignalTarget;
use gearshift_cloud::heat::{Heat, Stack, StackId};
use gearshift_cloud::http::Method;
use gearshift_cloud::{Credentials, CredentialsFrom, Service, Session, SessionOptions};
use serde_json::{Value, json};

/// Bound on one stack create, update or scaling in these tests.
pub const STACK_WAIT: Duration = Duration::from_secs(180);

/// The running services and the credentials `scripts/setup-openstack` wrote.
pub struct Real {
    /// The state directory (`target/openstack`).
    pub dir: PathBuf,
    /// `openstack.json`: URLs, project, users, application credentials.
    pub info: Value,
    /// A session of the password user (stacks are created with it:
    /// application credentials cannot create stacks on Heat 27).
    pub session: Session,
    /// Heat on that session.
    pub heat: Heat,
}

impl Real {
    /// Connects, or fails loudly naming the script that starts the services.
    pub async fn connect() -> Real {
        let dir = std::env::var_os("GEARSHIFT_OPENSTACK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| gearshift_tests::repo_root().join("target/openstack"));
        let start = format!(
            "real Keystone and Heat are not running (state {}): run `scripts/setup-openstack start` first",
            dir.display()
        );
        let text = std::fs::read_to_string(dir.join("openstack.json"))
            .unwrap_or_else(|e| panic!("{start}: openstack.json: {e}"));
        let info: Value = serde_json::from_str(&text).expect("openstack.json is JSON");
        let session = Session::new(
            Credentials::load(CredentialsFrom::EnvFile(&dir.join("password.env")))
                .unwrap_or_else(|e| panic!("{start}: password.env: {e}")),
            SessionOptions::default(),
        )
        .expect("session");
        let heat = Heat::new(session.clone());
        if let Err(e) = heat
            .session()
            .request(
                Service::Orchestration,
                Method::GET,
                "stacks?limit=1",
                &[],
                None,
            )
            .await
        {
            panic!("{start}: {e}");
        }
        Real {
            dir,
            info,
            session,
            heat,
        }
    }

    /// The application credential `auth.env` (restricted credential).
    pub fn appcred_env(&self) -> PathBuf {
        self.dir.join("appcred.env")
    }

    /// A session of the (restricted) application credential.
    pub fn app_session(&self) -> Session {
        let c =
            Credentials::load(CredentialsFrom::EnvFile(&self.appcred_env())).expect("appcred.env");
        Session::new(c, SessionOptions::default()).expect("session")
    }
}

/// Stacks created by one test, deleted at its end (also when it fails).
pub struct Stacks {
    heat: Heat,
    created: Mutex<Vec<StackId>>,
}

impl Stacks {
    /// Creates a stack and waits for `CREATE_COMPLETE`. Heat 27 answers 500
    /// to about 1 in 12 creates (a trust made with the wrong scope, right
    /// after another stack's delete); a retry 2 s later works.
    pub async fn create(&self, prefix: &str, template: Value, parameters: Value) -> Stack {
        let name = gearshift_tests::unique(prefix);
        let body = json!({"stack_name": name, "template": template, "parameters": parameters, "timeout_mins": 10});
        let mut attempt = 0;
        let resp = loop {
            attempt += 1;
            match self
                .heat
                .session()
                .request(
                    Service::Orchestration,
                    Method::POST,
                    "stacks",
                    &[],
                    Some(&body),
                )
                .await
            {
                Err(e) if e.status() == Some(500) && attempt < 4 => {
                    eprintln!("stack create answered 500 (known Heat 27 flake), retrying: {e}");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                other => break other.unwrap_or_else(|e| panic!("create stack {name}: {e}")),
            }
        };
        let v: Value = serde_json::from_slice(&resp.body).expect("create answer");
        let id = StackId {
            name: name.clone(),
            id: v["stack"]["id"].as_str().expect("stack id").to_string(),
        };
        self.created.lock().unwrap().push(id.clone());
        let t0 = tokio::time::Instant::now();
        loop {
            let s = self
                .heat
                .get_stack(&id.to_string())
                .await
                .expect("get stack");
            match s.stack_status.as_str() {
                "CREATE_COMPLETE" => return s,
                "CREATE_IN_PROGRESS" if t0.elapsed() < STACK_WAIT => {}
                other => panic!("stack {id}: {other}: {:?}", s.stack_status_reason),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn delete_all(&self) {
        let ids: Vec<StackId> = self.created.lock().unwrap().drain(..).collect();
        for id in ids {
            let path = id.path();
            if let Err(e) = self
                .heat
                .session()
                .request(Service::Orchestration, Method::DELETE, &path, &[], None)
                .await
            {
                eprintln!("could not delete stack {id}: {e}");
            }
        }
    }
}

/// Runs `test` with a stack tracker; deletes the stacks afterwards, also
/// when `test` panics (then the panic goes on).
pub async fn with_stacks<F, Fut>(test: F)
where
    F: FnOnce(Arc<Real>, Arc<Stacks>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    gearshift_tests::init_logging();
    let real = Arc::new(Real::connect().await);
    let stacks = Arc::new(Stacks {
        heat: real.heat.clone(),
        created: Mutex::new(Vec::new()),
    });
    let t0 = std::time::Instant::now();
    let run = tokio::spawn(test(real.clone(), stacks.clone())).await;
    stacks.delete_all().await;
    eprintln!("real OpenStack test took {:?}", t0.elapsed());
    if let Err(e) = run {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A group's members (name, physical id), oldest first.
pub async fn members(heat: &Heat, top: &StackId, group: &str) -> Vec<(String, String)> {
    let nested = heat.group_stack(top, group).await.expect("group stack");
    heat.members(&nested)
        .await
        .expect("members")
        .into_iter()
        .map(|m| (m.resource_name, m.physical_resource_id))
        .collect()
}

/// Names only.
pub fn names(m: &[(String, String)]) -> Vec<String> {
    m.iter().map(|(n, _)| n.clone()).collect()
}

/// Waits until the group has `want` members, its nested stack is
/// `*_COMPLETE` and its metadata no longer says `scaling_in_progress` (a
/// signal sent earlier would be ignored).
pub async fn settle(heat: &Heat, target: &SignalTarget, want: usize) -> Vec<(String, String)> {
    let nested = heat
        .group_stack(&target.stack, &target.group)
        .await
        .expect("group stack");
    let t0 = tokio::time::Instant::now();
    loop {
        let s = heat
            .group_state(target, &nested)
            .await
            .expect("group state");
        let top = heat
            .get_stack(&target.stack.to_string())
            .await
            .expect("stack");
        if s.members.len() == want
            && s.nested.state() == "COMPLETE"
            && !s.scaling_in_progress
            && top.state() == "COMPLETE"
        {
            return s
                .members
                .into_iter()
                .map(|m| (m.resource_name, m.physical_resource_id))
                .collect();
        }
        assert!(
            t0.elapsed() < STACK_WAIT,
            "{target}: want {want} settled members, have {:?} ({}, scaling {})",
            s.names(),
            s.nested.stack_status,
            s.scaling_in_progress
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The names in `after` not in `before`.
pub fn added(before: &[(String, String)], after: &[(String, String)]) -> Vec<String> {
    names(after)
        .into_iter()
        .filter(|n| !before.iter().any(|(b, _)| b == n))
        .collect()
}

/// The names in `before` not in `after`.
pub fn removed(before: &[(String, String)], after: &[(String, String)]) -> Vec<String> {
    names(before)
        .into_iter()
        .filter(|n| !after.iter().any(|(a, _)| a == n))
        .collect()
}

/// `test_resource` member properties: `value` from parameter `op`,
/// replaced on a change of it when `update_replace` is true.
fn member(value_prefix: &str, update_replace: Value) -> Value {
    json!({"type": "OS::Heat::TestResource", "properties": {
        "value": {"list_join": ["", [value_prefix, {"get_param": "op"}]]},
        "update_replace": update_replace}})
}

/// A ResourceGroup `group` sized by `count`, exact removal through
/// `removal_policies`, members' `value` fed by `op` (replaced on change
/// when `op_replaces`, as a Nova server's `user_data` under REPLACE).
pub fn resource_group_template() -> Value {
    json!({"heat_template_version": "2018-08-31",
        "parameters": {"count": {"type": "number", "default": 2}, "removal_policies": {"type": "json", "default": []},
                       "op": {"type": "string", "default": ""}, "op_replaces": {"type": "boolean", "default": false}},
        "resources": {"group": {"type": "OS::Heat::ResourceGroup", "properties": {
            "count": {"get_param": "count"}, "removal_policies": {"get_param": "removal_policies"},
            "resource_def": member("node-%index% op=", json!({"get_param": "op_replaces"}))}}}})
}

fn policy(group: &str, adjustment: i64, cooldown: i64) -> Value {
    json!({"type": "OS::Heat::ScalingPolicy", "properties": {"adjustment_type": "change_in_capacity",
        "auto_scaling_group_id": {"get_resource": group}, "scaling_adjustment": adjustment, "cooldown": cooldown}})
}

/// An AutoScalingGroup `asg` without `desired_capacity` (as
/// `docs/heat/gearshift-autoscaling.yaml`), min 1, max `asg_max`, with
/// policies `scale_up`, `scale_down` (cooldown 0) and `scale_up_slow`
/// (cooldown 600 s), their URLs as outputs (push mode's).
pub fn autoscaling_template() -> Value {
    json!({"heat_template_version": "2018-08-31",
        "parameters": {"asg_max": {"type": "number", "default": 4}, "op": {"type": "string", "default": ""}},
        "resources": {
            "asg": {"type": "OS::Heat::AutoScalingGroup", "properties": {"min_size": 1, "max_size": {"get_param": "asg_max"},
                "resource": member("asg op=", json!(false))}},
            "scale_up": policy("asg", 1, 0), "scale_down": policy("asg", -1, 0), "scale_up_slow": policy("asg", 1, 600)},
        "outputs": {
            "scale_up_url": {"value": {"get_attr": ["scale_up", "alarm_url"]}},
            "scale_down_url": {"value": {"get_attr": ["scale_down", "alarm_url"]}},
            "scale_up_slow_url": {"value": {"get_attr": ["scale_up_slow", "alarm_url"]}},
            "scale_up_signal_url": {"value": {"get_attr": ["scale_up", "signal_url"]}}}})
}

/// Two AutoScalingGroups with `desired_capacity`: `asg_d` from parameter
/// `desired` (max `asg_max`, policy `up_d`) and `asg_lit` fixed at 2.
pub fn desired_capacity_template() -> Value {
    json!({"heat_template_version": "2018-08-31",
        "parameters": {"desired": {"type": "number", "default": 3}, "asg_max": {"type": "number", "default": 4},
                       "op": {"type": "string", "default": ""}},
        "resources": {
            "asg_d": {"type": "OS::Heat::AutoScalingGroup", "properties": {"min_size": 1, "max_size": {"get_param": "asg_max"},
                "desired_capacity": {"get_param": "desired"}, "resource": member("d op=", json!(false))}},
            "asg_lit": {"type": "OS::Heat::AutoScalingGroup", "properties": {"min_size": 1, "max_size": 3,
                "desired_capacity": 2, "resource": member("lit op=", json!(false))}},
            "up_d": policy("asg_d", 1, 0)}})
}

/// A stack output's value.
pub async fn output(heat: &Heat, stack: &StackId, key: &str) -> String {
    let s = heat.get_stack(&stack.to_string()).await.expect("stack");
    s.outputs
        .iter()
        .find(|o| o["output_key"] == key)
        .and_then(|o| o["output_value"].as_str())
        .unwrap_or_else(|| panic!("stack {stack} has no output {key}: {:?}", s.outputs))
        .to_string()
}
