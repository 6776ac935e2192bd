//! The Heat templates in `docs/heat/` parse, hold together (every
//! parameter, resource and condition they refer to exists, no dependency
//! loop), and agree with the code: their alarms watch metric names this
//! crate pushes, and the `[push_stats]` sections their user data writes
//! load with `PushStatsConfig`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use gearshift_pushstats::config::PushStatsConfig;
use gearshift_pushstats::sets::{EVENT_METRICS, FLEET_METRICS, NODE_METRICS};
use gearshift_pushstats::{Sample, Unit};
use serde_yaml::{Mapping, Value};

fn docs(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/heat")
        .join(name)
}

fn load(name: &str) -> Mapping {
    let text = std::fs::read_to_string(docs(name)).expect("template exists");
    match serde_yaml::from_str::<Value>(&text).expect("valid YAML") {
        Value::Mapping(m) => m,
        other => panic!("{name}: top level is not a mapping: {other:?}"),
    }
}

fn map<'a>(m: &'a Mapping, key: &str) -> &'a Mapping {
    m.get(key)
        .and_then(Value::as_mapping)
        .unwrap_or_else(|| panic!("no mapping {key}"))
}

fn keys(m: &Mapping) -> BTreeSet<String> {
    m.keys()
        .filter_map(|k| k.as_str().map(str::to_string))
        .collect()
}

/// References found in a value: (function, target).
fn refs(v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Mapping(m) => {
            for (k, val) in m {
                let k = k.as_str().unwrap_or_default();
                let first = match val {
                    Value::String(s) => Some(s.clone()),
                    Value::Sequence(s) => s.first().and_then(Value::as_str).map(str::to_string),
                    _ => None,
                };
                match k {
                    "get_param" | "get_resource" | "get_attr" | "Ref" | "Fn::GetAtt" | "if" => {
                        if let Some(f) = first {
                            out.push((k.to_string(), f));
                        }
                    }
                    _ => {}
                }
                refs(val, out);
            }
        }
        Value::Sequence(s) => s.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

fn assert_acyclic(deps: &BTreeMap<String, BTreeSet<String>>) {
    fn visit(
        n: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) {
        match state.get(n) {
            Some(2) => return,
            Some(1) => panic!("dependency loop: {} -> {n}", path.join(" -> ")),
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for d in deps.get(n).into_iter().flatten() {
            visit(d, deps, state, path);
        }
        path.pop();
        state.insert(n.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for n in deps.keys() {
        visit(n, deps, &mut state, &mut Vec::new());
    }
}

fn gnocchi_name(cloudwatch: &str) -> String {
    Sample::new(cloudwatch, 0.0, Unit::NONE).gnocchi_name("gearshift.")
}

/// The text between the line ending in `<<start` (or `<<'start'`) and the line `end`.
fn heredoc(script: &str, start: &str, end: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in script.lines() {
        if inside {
            if line.trim() == end {
                return out;
            }
            out.push_str(line);
            out.push('\n');
        } else if line.ends_with(&format!("<<{start}")) || line.ends_with(&format!("<<'{start}'")) {
            inside = true;
        }
    }
    panic!("no heredoc {start}..{end} in:\n{script}");
}

/// A HOT template's resources by name: (type, definition).
type Resources = BTreeMap<String, (String, Value)>;

#[test]
fn hot_template_holds_together_and_matches_the_code() {
    let t = load("gearshift-autoscaling.yaml");
    assert_eq!(
        t.get("heat_template_version").and_then(Value::as_str),
        Some("2018-08-31")
    );
    let types = hot_references_resolve(&t);
    hot_alarms_watch_pushed_metrics(&types);
    hot_user_data_loads(&types);
}

/// Every reference resolves (parameters, conditions, resources, outputs),
/// only the expected resource types are used, and nothing depends on
/// itself. Returns the resources.
fn hot_references_resolve(t: &Mapping) -> Resources {
    let params = keys(map(t, "parameters"));
    let conditions = keys(map(t, "conditions"));
    let resources = map(t, "resources");
    let names = keys(resources);
    let pseudo = ["OS::stack_id", "OS::stack_name", "OS::project_id"];
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut types = BTreeMap::new();
    for (name, def) in resources {
        let name = name.as_str().unwrap().to_string();
        let ty = def
            .get("type")
            .and_then(Value::as_str)
            .expect("type")
            .to_string();
        assert!(
            [
                "OS::Heat::AutoScalingGroup",
                "OS::Heat::ScalingPolicy",
                "OS::Aodh::GnocchiAggregationByResourcesAlarm",
            ]
            .contains(&ty.as_str()),
            "{name}: unexpected type {ty}"
        );
        if let Some(c) = def.get("condition").and_then(Value::as_str) {
            assert!(conditions.contains(c), "{name}: unknown condition {c}");
        }
        let mut r = Vec::new();
        refs(def, &mut r);
        for (f, target) in r {
            match f.as_str() {
                "get_param" => assert!(
                    params.contains(&target) || pseudo.contains(&target.as_str()),
                    "{name}: unknown parameter {target}"
                ),
                "get_resource" | "get_attr" => {
                    assert!(names.contains(&target), "{name}: unknown resource {target}");
                    deps.entry(name.clone()).or_default().insert(target);
                }
                "if" => assert!(
                    conditions.contains(&target),
                    "{name}: unknown condition {target}"
                ),
                _ => {}
            }
        }
        types.insert(name, (ty, def.clone()));
    }
    assert_acyclic(&deps);
    hot_conditions_and_outputs_resolve(t, &params, &conditions, &names);
    types
}

/// Conditions refer to conditions and parameters that exist; outputs to
/// resources that exist.
fn hot_conditions_and_outputs_resolve(
    t: &Mapping,
    params: &BTreeSet<String>,
    conditions: &BTreeSet<String>,
    names: &BTreeSet<String>,
) {
    let mut r = Vec::new();
    refs(&Value::Mapping(map(t, "conditions").clone()), &mut r);
    for (f, target) in r {
        if f == "get_param" {
            assert!(
                params.contains(&target),
                "conditions: unknown parameter {target}"
            );
        }
    }
    for (cname, def) in map(t, "conditions") {
        if let Some(list) = def.get("and").and_then(Value::as_sequence) {
            for item in list {
                if let Some(s) = item.as_str() {
                    assert!(conditions.contains(s), "{cname:?}: unknown condition {s}");
                }
            }
        }
    }
    let mut r = Vec::new();
    refs(t.get("outputs").expect("outputs"), &mut r);
    for (f, target) in r {
        if f == "get_resource" || f == "get_attr" {
            assert!(
                names.contains(&target),
                "outputs: unknown resource {target}"
            );
        }
    }
}

/// Every alarm watches a metric gearshift pushes, and acts on a policy.
fn hot_alarms_watch_pushed_metrics(types: &Resources) {
    let pushed: BTreeSet<String> = NODE_METRICS
        .iter()
        .chain(FLEET_METRICS)
        .map(|m| gnocchi_name(m))
        .collect();
    let mut alarms = 0;
    for (name, (ty, def)) in types {
        if ty != "OS::Aodh::GnocchiAggregationByResourcesAlarm" {
            continue;
        }
        alarms += 1;
        let p = def.get("properties").expect("properties");
        let metric = p.get("metric").and_then(Value::as_str).expect("metric");
        assert!(
            pushed.contains(metric),
            "{name}: gearshift pushes no {metric}"
        );
        for k in [
            "aggregation_method",
            "granularity",
            "evaluation_periods",
            "threshold",
            "comparison_operator",
            "resource_type",
            "query",
            "alarm_actions",
        ] {
            assert!(p.get(k).is_some(), "{name}: no {k}");
        }
        let mut r = Vec::new();
        refs(p.get("alarm_actions").unwrap(), &mut r);
        assert!(
            r.iter().any(|(f, t)| f == "get_attr"
                && types
                    .get(t)
                    .is_some_and(|(ty, _)| ty == "OS::Heat::ScalingPolicy")),
            "{name}: alarm_actions do not signal a scaling policy"
        );
    }
    assert_eq!(alarms, 4);
    assert_eq!(
        gnocchi_name("CapacityUtilization"),
        "gearshift.capacity_utilization"
    );
}

/// The node's user data writes a [push_stats] section our config loads.
fn hot_user_data_loads(types: &Resources) {
    let server =
        types["node_group"].1["properties"]["resource"]["properties"]["user_data"]["str_replace"]
            .clone();
    let mut script = server["template"].as_str().expect("template").to_string();
    let sample_values = [
        ("__BUS_URL__", "amqp://gearshift:pw@mq.example.com:5672/%2f"),
        ("__PROFILE__", "small"),
        ("__AUTH_URL__", "https://keystone.example.com/v3"),
        ("__APP_CRED_ID__", "id"),
        ("__APP_CRED_SECRET__", "secret"),
        ("__ARCHIVE_POLICY__", "low"),
        ("__PUSH_NODES__", "true"),
        ("__ENROLL_TOKEN__", ""),
    ];
    let declared = keys(server["params"].as_mapping().expect("params"));
    for (k, v) in sample_values {
        assert!(
            declared.contains(k),
            "user data placeholder {k} is not a str_replace param"
        );
        script = script.replace(k, v);
    }
    assert_eq!(declared.len(), sample_values.len());
    let toml = heredoc(&script, "EOF_NODE", "EOF_NODE")
        .replace("${server_id}", "7b1c3c2e-5d2a-4a38-9d55-0c3f0b6f2a11")
        // An empty enroll_token: the script leaves the [enroll] section out.
        .replace("${enroll}", "");
    let cfg = PushStatsConfig::from_agent_toml(&toml).expect("the user data's [push_stats] loads");
    assert!(cfg.enabled);
    let g = cfg.gnocchi.expect("gnocchi target");
    assert_eq!(g.archive_policy.as_deref(), Some("low"));
    assert_eq!(
        g.resource_id.as_deref(),
        Some("7b1c3c2e-5d2a-4a38-9d55-0c3f0b6f2a11")
    );
    for m in &cfg.metrics {
        assert!(NODE_METRICS.contains(&m.as_str()), "{m}");
    }
}

/// Joins a `Fn::Join ['', [...]]` list: the URL parameters get sample
/// values, other `Ref`s become `REF-<name>`, `Fn::GetAtt`s `GETATT`.
fn join_user_data(v: &Value) -> String {
    let join = &v["Fn::Base64"]["Fn::Join"];
    let parts = join[1].as_sequence().expect("join list");
    parts
        .iter()
        .map(|p| match p {
            Value::String(s) => s.clone(),
            other => {
                if let Some(r) = other.get("Ref").and_then(Value::as_str) {
                    match r {
                        "CloudWatchUrl" => "http://heat.example.com:8003/v1".to_string(),
                        "BusUrl" => "amqp://gearshift:pw@mq.example.com:5672/%2f".to_string(),
                        _ => format!("REF-{r}"),
                    }
                } else {
                    "GETATT".to_string()
                }
            }
        })
        .collect()
}

#[test]
fn cloudwatch_era_template_holds_together_and_matches_the_code() {
    let t = load("gearshift-autoscaling-cfn.yaml");
    assert_eq!(
        t.get("AWSTemplateFormatVersion").and_then(Value::as_str),
        Some("2010-09-09")
    );
    let params = keys(map(&t, "Parameters"));
    let resources = map(&t, "Resources");
    let names = keys(resources);
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut alarms = 0;
    for (name, def) in resources {
        let name = name.as_str().unwrap().to_string();
        let mut r = Vec::new();
        refs(def, &mut r);
        for (f, target) in r {
            match f.as_str() {
                "Ref" => {
                    if names.contains(&target) {
                        deps.entry(name.clone()).or_default().insert(target);
                    } else {
                        assert!(
                            params.contains(&target) || target.starts_with("AWS::"),
                            "{name}: unknown Ref {target}"
                        );
                    }
                }
                "Fn::GetAtt" => {
                    assert!(names.contains(&target), "{name}: unknown resource {target}");
                    deps.entry(name.clone()).or_default().insert(target);
                }
                _ => {}
            }
        }
        if def["Type"] == "AWS::CloudWatch::Alarm" {
            alarms += 1;
            let p = &def["Properties"];
            assert_eq!(
                p["Namespace"], "system/linux",
                "{name}: cfn-push-stats' namespace"
            );
            let metric = p["MetricName"].as_str().unwrap();
            assert!(
                NODE_METRICS.contains(&metric) || EVENT_METRICS.contains(&metric),
                "{name}: gearshift pushes no {metric}"
            );
        }
    }
    assert_eq!(alarms, 4);
    assert_acyclic(&deps);

    cfn_user_data(resources);
}

/// The nodes' user data: cfn-credentials, then a [push_stats] that loads;
/// the broker's notify scripts fire the heartbeat alarms with our CLI.
fn cfn_user_data(resources: &Mapping) {
    let lc = &resources[&Value::from("NodeLaunchConfig")]["Properties"]["UserData"];
    let script = join_user_data(lc);
    assert!(
        script.contains("AWSAccessKeyId=%s\\nAWSSecretKey=%s"),
        "{script}"
    );
    let toml = heredoc(&script, "EOF", "EOF").replace("${asg}", "paas-NodeGroup-x1");
    let cfg = PushStatsConfig::from_agent_toml(&toml).expect("the user data's [push_stats] loads");
    let cw = cfg.cloudwatch.as_ref().expect("cloudwatch target");
    assert_eq!(cw.endpoint, "http://heat.example.com:8003/v1");
    assert_eq!(
        cw.credential_file,
        PathBuf::from("/etc/cfn/cfn-credentials")
    );
    assert_eq!(cfg.dimensions["AutoScalingGroupName"], "paas-NodeGroup-x1");
    assert_eq!(cfg.metrics, vec!["NodeUtilization"]);

    // The broker's notify scripts fire the heartbeat alarms with our CLI.
    let broker = &resources[&Value::from("BrokerInstance")]["Properties"]["UserData"];
    let script = join_user_data(broker);
    for alarm in ["NodeScaleUp", "NodeScaleDown"] {
        let line = script
            .lines()
            .find(|l| l.contains("push-stats") && l.contains(&format!("REF-{alarm}")))
            .unwrap_or_else(|| panic!("no push-stats line for {alarm}:\n{script}"));
        let argv: Vec<&str> = line
            .trim_start_matches("exec ")
            .split_whitespace()
            .skip(1)
            .collect();
        let args = gearshift_pushstats::PushStatsArgs::try_parse_from(argv.clone())
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(args.heartbeat);
        assert_eq!(args.watch, vec![format!("REF-{alarm}")]);
    }
}

#[test]
#[should_panic(expected = "dependency loop")]
fn the_loop_check_finds_loops() {
    let deps = BTreeMap::from([
        ("group".to_string(), BTreeSet::from(["launch".to_string()])),
        ("launch".to_string(), BTreeSet::from(["alarm".to_string()])),
        ("alarm".to_string(), BTreeSet::from(["group".to_string()])),
    ]);
    assert_acyclic(&deps);
}
