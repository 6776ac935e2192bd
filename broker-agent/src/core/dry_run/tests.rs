//! The `log` handler's dry run: decisions published and marked, nothing
//! started, nothing sent, and the explanation says what would have happened.

use crate::core::testkit::*;

fn dry(f: impl FnOnce(&mut BrokerConfig)) -> Arc<BrokerConfig> {
    cfg_with(|c| {
        c.group_defaults.handler = "log".into();
        f(c);
    })
}

use std::sync::Arc;

fn dry_decisions(a: &[Action]) -> Vec<gearshift_proto::msg::Decision> {
    a.iter()
        .filter_map(|x| match x {
            Action::Decide(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dry_run_scale_down_names_the_victim_and_its_moves_and_sends_nothing() {
    let mut h = H::new(dry(short_windows));
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    let d = dry_decisions(&a);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].decision, d[0].node.as_deref(), d[0].dry_run),
        (DecisionKind::ScaleDown, Some("c"), true)
    );
    // The victim, what the planner would move where, and the removal.
    let r = &d[0].reason;
    assert!(r.starts_with("dry run (log handler)"), "{r}");
    assert!(r.contains("would deactivate c"), "{r}");
    assert!(r.contains("move its 10 gears (10 active)"), "{r}");
    assert!(r.contains(" to a") || r.contains(" to b"), "{r}");
    assert!(r.contains("remove it through the handler"), "{r}");
    // Nothing reaches a node or the cloud; no operation exists.
    assert!(sends(&a).is_empty());
    assert!(calls(&a).is_empty());
    assert_eq!(h.core.ops().count(), 0);
    let e = explain(&a, "d1");
    assert!(
        e.summary.starts_with("dry run (log handler), nothing done"),
        "{e:?}"
    );
    assert!(e.summary.contains("would deactivate c"), "{e:?}");
    // The decision paces the next one like a real drain (cooldown).
    refresh(&mut h, 10, QUIET);
    let a = h.eval();
    assert!(dry_decisions(&a).is_empty(), "{:?}", dry_decisions(&a));
    assert!(!rule(explain(&a, "d1"), "cooldown_after_scale_down").ok);
}

#[test]
fn a_dry_run_scale_up_asks_no_cloud() {
    let mut h = H::new(dry(|_| {}));
    h.node("a", "d1", 95, 100);
    let a = h.eval();
    let d = dry_decisions(&a);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].decision, d[0].dry_run), (DecisionKind::ScaleUp, true));
    assert!(
        d[0].reason.contains("would ask the cloud for 1 node(s)"),
        "{d:?}"
    );
    assert!(calls(&a).is_empty());
    assert_eq!(h.core.ops().count(), 0);
    // Real decisions are not marked.
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 95, 100);
    assert!(dry_decisions(&h.eval()).iter().all(|d| !d.dry_run));
}

#[test]
fn an_operator_drain_in_a_dry_run_group_is_refused() {
    let mut h = H::new(dry(|_| {}));
    quiet_fleet(&mut h, QUIET);
    let err = h.core.operator_evacuate("c", "alice", h.now).unwrap_err();
    assert!(err.contains("dry run"), "{err}");
    assert_eq!(h.core.ops().count(), 0);
}

#[test]
fn only_the_log_handler_is_a_dry_run() {
    let mut c = BrokerConfig::defaults();
    let d1 = g("d1", "small");
    assert!(c.dry_run(&d1), "the default handler is log");
    c.group_defaults.handler = "quiet".into();
    assert!(!c.dry_run(&d1));
    c.handlers
        .insert("quiet".into(), gearshift_handlers::HandlerConfig::Log {});
    assert!(c.dry_run(&d1));
}

#[test]
fn the_handler_the_driver_runs_decides_not_the_placeholder() {
    // The demo's configuration names a `log` placeholder that the driver
    // replaces with its simulated cloud.
    let mut h = H::new(dry(short_windows));
    h.core
        .set_handler_kinds([("log".to_string(), "sim-cloud".to_string())].into());
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    assert_eq!(sends(&a).len(), 1, "a real drain: {a:?}");
    assert!(dry_decisions(&a).iter().all(|d| !d.dry_run));
    // And the log handler under another name is a dry run.
    let mut h = H::new(cfg_with(short_windows));
    h.core
        .set_handler_kinds([("cloud".to_string(), "log".to_string())].into());
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    assert!(sends(&a).is_empty());
    assert!(dry_decisions(&a).iter().all(|d| d.dry_run));
}
