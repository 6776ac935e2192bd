//! The policy's rules through whole evaluations with fake time: every
//! scale-up and scale-down rule, and the explanation of each.

use crate::core::testkit::*;

mod arithmetic;
mod openshift;

#[test]
fn profile_threshold_scales_up_the_district_with_most_free_uids() {
    let mut h = H::new(cfg_with(|_| {}));
    // d1: 2 nodes at 90 active of 100 (180 gears in the district); d2: 1 node at 70.
    h.node("a", "d1", 89, 100);
    h.node("b", "d1", 89, 100);
    h.node("c", "d2", 70, 100);
    // profile: 248 active, 52 available -> 82.7 % >= 80.
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleUp, "d2".into(), None)]
    );
    let e = explain(&a, "d2");
    assert_eq!(e.outcome, Outcome::ScaleUp);
    assert!(rule(e, "profile_threshold").ok);
    assert!(
        rule(e, "profile_threshold").detail.contains("82.7 %"),
        "{e:?}"
    );
    // The pre-flight capacity check is the first handler call.
    assert!(matches!(calls(&a)[0].1, HandlerCall::Capacity { .. }));
    // Booting nodes count: the next evaluation asks for nothing more.
    h.advance(11);
    h.node("a", "d1", 89, 100);
    h.node("b", "d1", 89, 100);
    h.node("c", "d2", 70, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", kinds(&a));
    assert!(!rule(explain(&a, "d1"), "profile_threshold").ok);
}

#[test]
fn below_profile_threshold_nothing_happens_and_is_explained() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 60, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::None);
    assert!(rule(e, "profile_threshold").detail.contains("60.0 %"));
    assert!(
        rule(e, "compact_threshold")
            .detail
            .contains(">= COMPACT_THRESHOLD 50")
    );
}

#[test]
fn district_threshold_scales_up_that_district() {
    let mut h = H::new(cfg_with(|c| c.policy.profile_threshold = PerKey::off()));
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 10, 100);
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleUp, "d1".into(), None)]
    );
    assert!(rule(explain(&a, "d1"), "district_threshold").ok);
    // Per-district override: d1 at 95 % is fine when its threshold is 96.
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.policy.district_threshold = PerKey::parse("90, d1: 96").unwrap();
    }));
    h.node("a", "d1", 95, 100);
    assert!(kinds(&h.eval()).is_empty());
}

#[test]
fn gear_up_threshold_asks_for_gear_up_size_worth_of_nodes() {
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.policy.gear_up_threshold = PerKey::parse("50, large: none").unwrap();
        c.policy.gear_up_size = PerKey::all(150);
    }));
    // 40 available < 50; 150 gears / 100 per node = 2 nodes.
    h.node("a", "d1", 60, 100);
    let a = h.eval();
    assert_eq!(
        kinds(&a),
        vec![DecisionKind::ScaleUp, DecisionKind::ScaleUp]
    );
    assert!(rule(explain(&a, "d1"), "gear_up_threshold").ok);
    // `large: none` disables the rule for that profile.
    h.report(rep("z", "d9", "large", 100, 60, 0));
    let a = h.eval();
    let e = explain(&a, "d9");
    assert!(e.reasons.iter().all(|r| r.rule != "gear_up_threshold"));
}

#[test]
fn expected_active_percent_needs_room_in_the_district() {
    let mut h = H::new(cfg_with(|_| {}));
    // capacity 6000 UIDs; 5 % expected active: a 100-gear node holds 2000 gears.
    let mut r = rep("a", "d1", "small", 100, 90, 4000);
    r.gears.stopped = 100;
    h.report(r);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held, "{e:?}");
    assert!(e.summary.contains("district_room"), "{}", e.summary);
    // With 50 % expected active, 200 UIDs are enough.
    let mut h = H::new(cfg_with(|c| {
        c.policy.gear_expected_active_percent = PerKey::parse("5, small: 50").unwrap()
    }));
    let mut r = rep("a", "d1", "small", 100, 90, 4000);
    r.gears.stopped = 100;
    h.report(r);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleUp]);
}

#[test]
fn missing_nodes_hold_scaling() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 90, 100);
    h.node("b", "d1", 90, 100);
    h.node("c", "d1", 90, 100);
    h.advance(25);
    h.node("a", "d1", 90, 100);
    h.node("b", "d1", 90, 100);
    h.advance(10); // c last reported 35 s ago: missing (3 x 10 s)
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", kinds(&a));
    let e = explain(&a, "d1");
    assert!(!rule(e, "missing_nodes").ok);
    assert_eq!(e.stats.nodes_missing, 1);
}

#[test]
fn min_and_max_nodes() {
    let mut h = H::new(cfg_with(|c| {
        c.groups.push(crate::config::GroupConfig {
            district: "d1".into(),
            profile: "small".into(),
            handler: None,
            min_nodes: Some(2),
            max_nodes: Some(3),
            victim_strategy: None,
            shape: None,
        });
    }));
    // A configured group with no node at all: min_nodes asks for 2.
    let a = h.eval();
    assert_eq!(
        kinds(&a),
        vec![DecisionKind::ScaleUp, DecisionKind::ScaleUp]
    );
    // max_nodes: 3 full nodes; the group cannot grow.
    let mut h = H::new(cfg_with(|c| c.group_defaults.max_nodes = 3));
    for n in ["a", "b", "c"] {
        h.node(n, "d1", 95, 100);
    }
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(
        e.summary.contains("max_nodes") || rule(e, "target_district").detail.contains("max_nodes"),
        "{e:?}"
    );
}

#[test]
fn breaker_stops_all_scaling_while_too_many_nodes_are_stale() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 95, 100);
    h.node("c", "d3", 10, 100);
    h.advance(31);
    h.node("a", "d1", 95, 100); // b and c missing: 2 of 3 > 45 %
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::BreakerOpen]);
    assert!(!rule(explain(&a, "d1"), "breaker").ok);
    h.advance(1);
    h.node("b", "d2", 95, 100);
    h.node("c", "d3", 10, 100);
    let a = h.eval();
    assert_eq!(kinds(&a)[0], DecisionKind::BreakerClosed);
}

#[test]
fn startup_grace_holds_decisions() {
    let mut h = H::new(cfg_with(|c| {
        c.policy.startup_grace = std::time::Duration::from_secs(30)
    }));
    h.node("a", "d1", 95, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "startup_grace").ok);
    h.advance(30);
    h.node("a", "d1", 95, 100);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleUp]);
}

#[test]
fn compact_threshold_waits_for_the_stabilization_window_then_drains_the_least_busy() {
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(rule(e, "compact_threshold").ok);
    assert!(!rule(e, "stabilization").ok);
    for _ in 0..59 {
        refresh(&mut h, 10, QUIET);
        assert!(kinds(&h.eval()).is_empty());
    }
    refresh(&mut h, 10, QUIET);
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleDown, "d1".into(), Some("c".into()))]
    );
    let s = sends(&a);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].0, "c");
    assert!(matches!(s[0].3, Message::Deactivate(_)));
    // Usage back above the threshold resets the window.
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    h.eval();
    refresh(&mut h, 300, &[("a", 95), ("b", 60), ("c", 40)]);
    h.eval();
    assert_eq!(
        h.core.group_state(&g("d1", "small")).memory.underused_since,
        None
    );
}

#[test]
fn cooldowns_hold_scale_down() {
    // After a scale-up.
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).memory.last_scale_up = Some(h.now - Duration::minutes(9));
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "cooldown_after_scale_up").ok);
    refresh(&mut h, 60, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
    // After a scale-down.
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).memory.last_scale_down = Some(h.now - Duration::minutes(4));
    assert!(!rule(explain(&h.eval(), "d1"), "cooldown_after_scale_down").ok);
    refresh(&mut h, 60, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
    // After a failure.
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).memory.last_failure = Some(h.now - Duration::minutes(2));
    assert!(!rule(explain(&h.eval(), "d1"), "cooldown_after_failure").ok);
    refresh(&mut h, 60, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
}

#[test]
fn decisions_wait_for_reports_newer_than_the_last_decision() {
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).memory.last_decision = Some(h.now + Duration::seconds(1));
    h.advance(2);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "fresh_reports").ok);
    refresh(&mut h, 1, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
}

#[test]
fn gear_down_threshold_triggers_scale_down() {
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.compact_threshold = PerKey::off();
        c.policy.gear_down_threshold = PerKey::all(150);
    }));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 60)]);
    let a = h.eval();
    assert!(!rule(explain(&a, "d1"), "gear_down_threshold").ok);
    refresh(&mut h, 10, &[("a", 40), ("b", 40), ("c", 40)]);
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleDown]);
    assert!(rule(explain(&a, "d1"), "gear_down_threshold").ok);
}

#[test]
fn victim_choice_strategies_and_opt_outs() {
    let pick = |strategy: VictimStrategy, prep: &dyn Fn(&mut H)| -> Option<String> {
        let mut h = H::new(cfg_with(|c| {
            short_windows(c);
            c.policy.victim_strategy = strategy;
        }));
        prep(&mut h);
        decisions(&h.eval()).into_iter().find_map(|d| d.2)
    };
    let base = |h: &mut H| {
        let mut a = rep("a", "d1", "small", 100, 5, 10);
        a.started_at = t0() - Duration::hours(3);
        let mut b = rep("b", "d1", "small", 100, 3, 0);
        b.started_at = t0() - Duration::hours(1);
        let mut c = rep("c", "d1", "small", 100, 0, 0);
        c.started_at = t0() - Duration::hours(2);
        h.report(a);
        h.report(b);
        h.report(c);
    };
    assert_eq!(pick(VictimStrategy::LeastBusy, &base).as_deref(), Some("c"));
    assert_eq!(pick(VictimStrategy::Oldest, &base).as_deref(), Some("a"));
    assert_eq!(pick(VictimStrategy::Newest, &base).as_deref(), Some("b"));
    assert_eq!(pick(VictimStrategy::EmptyOnly, &base).as_deref(), Some("c"));
    // Inactive nodes come first, whatever the strategy.
    let inactive_b = |h: &mut H| {
        base(h);
        let mut b = rep("b", "d1", "small", 100, 3, 0);
        b.active = false;
        h.report(b);
    };
    assert_eq!(
        pick(VictimStrategy::LeastBusy, &inactive_b).as_deref(),
        Some("b")
    );
    // empty_only with no empty node: nothing.
    let no_empty = |h: &mut H| quiet_fleet(h, QUIET);
    assert_eq!(pick(VictimStrategy::EmptyOnly, &no_empty), None);
    // Do-not-disrupt (report or operator mark) and pinned gears are never victims.
    let opted_out = |h: &mut H| {
        quiet_fleet(h, QUIET);
        let mut c = rep("c", "d1", "small", 100, 10, 0);
        c.do_not_disrupt = true;
        h.report(c);
        let mut b = rep("b", "d1", "small", 100, 20, 0);
        b.pinned_gears = 1;
        h.report(b);
        h.core.set_do_not_disrupt("a", true);
    };
    assert_eq!(pick(VictimStrategy::LeastBusy, &opted_out), None);
}

#[test]
fn absorb_and_no_flap_checks() {
    // c has 45 active gears; a and b have 10 + 10 free slots: cannot absorb.
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.compact_threshold = PerKey::all(79);
    }));
    quiet_fleet(&mut h, &[("a", 90), ("b", 90), ("c", 45)]);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert!(kinds(&a).is_empty(), "{e:?}");
    assert!(!rule(e, "absorb").ok || !rule(e, "no_flap").ok);
    // Room enough, but removing c would push usage over 80 %: no_flap holds.
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.compact_threshold = PerKey::all(79);
    }));
    quiet_fleet(&mut h, &[("a", 78), ("b", 78), ("c", 30)]);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert!(rule(e, "absorb").ok);
    assert!(!rule(e, "no_flap").ok, "{e:?}");
}

#[test]
fn disruption_budget_and_min_nodes() {
    let mut h = H::new(cfg_with(short_windows));
    let loads: Vec<(String, u32)> = (0..5).map(|i| (format!("n{i}"), 5)).collect();
    let l: Vec<(&str, u32)> = loads.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    quiet_fleet(&mut h, &l);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
    refresh(&mut h, 10, &l);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    let e = explain(&a, "d1");
    assert!(!rule(e, "disruption_budget").ok);
    assert!(rule(e, "disruption_budget").detail.contains("budget 1"));
    // min_nodes: a group at its minimum is not drained.
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.group_defaults.min_nodes = 3;
    }));
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    assert!(!rule(explain(&a, "d1"), "min_nodes").ok || kinds(&a).is_empty());
    assert!(kinds(&a).is_empty());
}

// ------------------------------------------------ the evaluation alone

use crate::policy::{Memory, evaluate};

#[test]
fn evaluation_reads_and_changes_nothing() {
    let mut h = H::new(cfg_with(short_windows));
    h.node("a", "d1", 95, 100);
    quiet_fleet_in(&mut h, "d2");
    let before = journaled(&h);
    let memory = Memory {
        groups: h.core.group_states(),
        breaker_open: false,
        fleet_pause: None,
    };
    let cfg = h.core.config().clone();
    let v = evaluate(&h.core.facts(), &cfg, &memory, h.now);
    let again = evaluate(&h.core.facts(), &cfg, &memory, h.now);
    assert_eq!(v, again, "the same inputs give the same verdicts");
    assert!(!v.breaker.open);
    let d1 = v.groups.iter().find(|x| x.key == g("d1", "small")).unwrap();
    assert_eq!((d1.creates, d1.drain.as_ref()), (1, None));
    assert!(
        d1.up_reason.contains("DISTRICT_THRESHOLD"),
        "{}",
        d1.up_reason
    );
    assert_eq!(d1.explanation.outcome, Outcome::ScaleUp);
    let d2 = v.groups.iter().find(|x| x.key == g("d2", "small")).unwrap();
    assert_eq!(d2.explanation.outcome, Outcome::ScaleDown);
    assert_eq!(d2.drain.as_ref().map(|d| d.node.as_str()), Some("d2-c"));
    // Nothing was started or remembered.
    assert_eq!(h.core.ops().count(), 0);
    assert_eq!(h.core.group_states(), &before.groups.into_iter().collect());
    assert!(h.core.take_changes().is_empty());
}

#[test]
fn verdicts_carry_the_stabilization_memory_and_the_drain() {
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    let memory = Memory {
        groups: h.core.group_states(),
        breaker_open: false,
        fleet_pause: None,
    };
    let cfg = h.core.config().clone();
    let v = evaluate(&h.core.facts(), &cfg, &memory, h.now);
    let d1 = &v.groups[0];
    assert_eq!(d1.underused_since, Some(h.now), "the window starts now");
    assert!(d1.drain.is_none());
    // Ten minutes later, with the window remembered: drain the least busy.
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).memory.underused_since = Some(h.now);
    refresh(&mut h, 600, QUIET);
    let memory = Memory {
        groups: h.core.group_states(),
        breaker_open: false,
        fleet_pause: None,
    };
    let v = evaluate(&h.core.facts(), &cfg, &memory, h.now);
    let drain = v.groups[0].drain.as_ref().unwrap();
    assert_eq!(drain.node, "c");
    assert_eq!(v.groups[0].underused_since, None);
}

/// Three quiet nodes in `district`.
fn quiet_fleet_in(h: &mut H, district: &str) {
    for (n, l) in QUIET {
        h.node(&format!("{district}-{n}"), district, *l, 100);
    }
}
