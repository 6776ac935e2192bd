//! Operator requests: through the coordinator, then the decisions alone.

use crate::core::testkit::*;

#[test]
fn operator_evacuate_and_abort() {
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 30)]);
    // Thresholds do not apply to an operator's request; room does.
    let (op, a) = h.core.operator_evacuate("c", "alice", h.now).unwrap();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleDown]);
    assert!(
        h.core
            .operator_evacuate("c", "alice", h.now)
            .unwrap_err()
            .contains("already")
    );
    assert!(h.core.operator_evacuate("zz", "alice", h.now).is_err());
    h.core.set_do_not_disrupt("b", true);
    assert!(
        h.core
            .operator_evacuate("b", "alice", h.now)
            .unwrap_err()
            .contains("do-not-disrupt")
    );
    let a = h.core.operator_abort(op.as_str(), "alice", h.now).unwrap();
    assert!(matches!(sends(&a).pop().unwrap().3, Message::Activate(_)));
    // No room: a (60 active) cannot go onto b (40 free) alone.
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60)]);
    assert!(
        h.core
            .operator_evacuate("a", "bob", h.now)
            .unwrap_err()
            .contains("room")
    );
}

// ------------------------------------------------- the decisions alone

use gearshift_proto::msg::AdminRequest;

use crate::core::operator::{Abort, Marks, Order, decide};
use crate::ops::Origin;

#[test]
fn decisions_name_what_to_do_or_why_not() {
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 30)]);
    let mut pinned = rep("p", "d1", "small", 100, 0, 0);
    pinned.pinned_gears = 2;
    h.report(pinned);
    let facts = h.core.facts();
    let ask = |req| decide(&facts, "alice", req, h.now);
    assert_eq!(ask(AdminRequest::Status), Ok(Order::Status));
    assert_eq!(
        ask(AdminRequest::DoNotDisrupt {
            node: "a".into(),
            on: true
        }),
        Ok(Order::Mark {
            node: "a".into(),
            on: true
        })
    );
    let Ok(Order::Evacuate(ev)) = ask(AdminRequest::Evacuate { node: "c".into() }) else {
        panic!()
    };
    assert_eq!((ev.group, ev.node.as_str()), (g("d1", "small"), "c"));
    assert_eq!(ev.origin, Origin::Operator { by: "alice".into() });
    let refused = |req| ask(req).unwrap_err();
    assert!(refused(AdminRequest::Evacuate { node: "zz".into() }).contains("no node"));
    assert!(refused(AdminRequest::Evacuate { node: "p".into() }).contains("opted out"));
    assert!(refused(AdminRequest::Abort { op: "op-x".into() }).contains("no operation"));
    // Missing: no report within the stale window.
    let later = h.now + Duration::minutes(5);
    let missing = decide(
        &facts,
        "alice",
        AdminRequest::Evacuate { node: "c".into() },
        later,
    );
    assert!(missing.unwrap_err().contains("missing"));
}

#[test]
fn aborts_depend_on_the_operation_and_marks_report_changes() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, _) = start_drain(&mut h);
    let a = crate::core::operator::abort(&h.core.facts(), op.as_str(), "bob").unwrap();
    assert!(matches!(a, Abort::Drain { ref why, .. } if why.contains("bob")));
    assert_eq!(a.op(), &op);
    let mut m = Marks::default();
    assert!(m.set("n1", true));
    assert!(!m.set("n1", true));
    assert!(m.nodes().contains("n1"));
    assert!(m.set("n1", false));
    assert!(!m.set("n1", false));
}

// ------------------------------------------------- standing controls

use crate::ops::{Cordon, Pause};

fn pause_req(group: Option<(&str, &str)>, until: Option<DateTime<Utc>>) -> AdminRequest {
    AdminRequest::Pause {
        district: group.map(|g| g.0.to_string()),
        profile: group.map(|g| g.1.to_string()),
        reason: "kernel upgrade".into(),
        until,
    }
}

fn ask(h: &mut H, req: AdminRequest) -> (gearshift_proto::msg::AdminReply, Vec<Action>) {
    let none = std::collections::BTreeMap::new();
    h.core.on_operator("alice", req, "broker-1", &none, h.now)
}

#[test]
fn a_paused_group_decides_nothing_but_is_explained_until_resumed() {
    let mut h = H::new(cfg_with(short_windows));
    h.node("a", "d1", 95, 100);
    quiet_fleet_in(&mut h, "d2");
    let until = h.now + Duration::hours(2);
    let (r, _) = ask(&mut h, pause_req(Some(("d1", "small")), Some(until)));
    assert!(
        r.ok && r.message.starts_with("d1/small paused by alice until"),
        "{}",
        r.message
    );
    assert!(h.core.take_changes().groups.contains(&g("d1", "small")));
    let a = h.eval();
    // d1 wanted a node: held, and says why; d2 (not paused) still drains.
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleDown, "d2".into(), Some("d2-c".into()))]
    );
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(!rule(e, "paused").ok);
    assert!(
        e.summary.starts_with("paused by alice until") && e.summary.contains("kernel upgrade"),
        "{}",
        e.summary
    );
    assert!(
        e.summary.contains("otherwise: asking for 1 node"),
        "{}",
        e.summary
    );
    let s = crate::status::Status::of(&h.core, "b", h.now, &Default::default());
    assert!(
        s.groups[0]
            .paused
            .as_deref()
            .unwrap()
            .contains("kernel upgrade")
    );
    assert!(s.render().contains("PAUSED (paused by alice"));
    // Resume: the next evaluation scales up; resuming again is refused.
    let (r, _) = ask(
        &mut h,
        AdminRequest::Resume {
            district: Some("d1".into()),
            profile: Some("small".into()),
        },
    );
    assert!(r.ok, "{}", r.message);
    let (r, _) = ask(
        &mut h,
        AdminRequest::Resume {
            district: Some("d1".into()),
            profile: Some("small".into()),
        },
    );
    assert_eq!(
        (r.ok, r.message.as_str()),
        (false, "d1/small is not paused")
    );
    h.advance(1);
    h.node("a", "d1", 95, 100);
    assert!(kinds(&h.eval()).contains(&DecisionKind::ScaleUp));
}

#[test]
fn a_fleet_pause_holds_every_group_and_expires() {
    let mut h = H::new(cfg_with(short_windows));
    h.node("a", "d1", 95, 100);
    let until = h.now + Duration::minutes(5);
    let (r, _) = ask(&mut h, pause_req(None, Some(until)));
    assert!(
        r.message.starts_with("the fleet paused by alice"),
        "{}",
        r.message
    );
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(
        explain(&a, "d1")
            .summary
            .starts_with("fleet paused by alice")
    );
    let s = crate::status::Status::of(&h.core, "b", h.now, &Default::default());
    assert!(s.render().contains("PAUSED: fleet paused by alice"));
    // A pause in the past is refused; an expired one lifts by itself.
    let now = h.now;
    let (r, _) = ask(&mut h, pause_req(None, Some(now)));
    assert!(!r.ok && r.message.contains("already be over"));
    h.advance(301);
    h.node("a", "d1", 95, 100);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleUp]);
    assert_eq!(h.core.meta().fleet_pause, None);
    // Every request but status went to the history.
    let ops: Vec<_> = h
        .core
        .take_history()
        .into_iter()
        .filter_map(|r| match r.event {
            crate::history::Event::Operator(o) => Some(o.ok),
            _ => None,
        })
        .collect();
    assert_eq!(ops, vec![true, false]);
}

#[test]
fn a_cordoned_node_is_no_target_no_victim_and_not_capacity() {
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    let before = h
        .core
        .group_stats(&g("d1", "small"), h.now)
        .available_active_gears;
    let (r, _) = ask(
        &mut h,
        AdminRequest::Cordon {
            node: "c".into(),
            on: true,
            reason: "disk swap".into(),
        },
    );
    assert!(r.ok, "{}", r.message);
    assert!(h.core.take_changes().cordons);
    // Its 90 free slots are no longer capacity; it is no candidate.
    let after = h
        .core
        .group_stats(&g("d1", "small"), h.now)
        .available_active_gears;
    assert_eq!(before - after, 90);
    assert!(
        h.core
            .candidates(&g("d1", "small"), "", h.now)
            .iter()
            .all(|c| c.name != "c")
    );
    // The least busy node is c, but it is cordoned: b goes instead.
    let a = h.eval();
    assert_eq!(decisions(&a)[0].2.as_deref(), Some("b"));
    assert!(
        rule(explain(&a, "d1"), "victim")
            .detail
            .contains("c cordoned")
            || rule(explain(&a, "d1"), "victim").ok
    );
    let s = crate::status::Status::of(&h.core, "b", h.now, &Default::default());
    assert!(
        s.render().contains("c cordoned by alice: disk swap"),
        "{}",
        s.render()
    );
    // Uncordon; uncordoning again is refused; an unknown node cannot be cordoned.
    assert!(
        ask(
            &mut h,
            AdminRequest::Cordon {
                node: "c".into(),
                on: false,
                reason: String::new()
            }
        )
        .0
        .ok
    );
    assert!(
        !ask(
            &mut h,
            AdminRequest::Cordon {
                node: "c".into(),
                on: false,
                reason: String::new()
            }
        )
        .0
        .ok
    );
    assert!(
        !ask(
            &mut h,
            AdminRequest::Cordon {
                node: "zz".into(),
                on: true,
                reason: String::new()
            }
        )
        .0
        .ok
    );
    // Journaled, and restored into the fleet's figures.
    ask(
        &mut h,
        AdminRequest::Cordon {
            node: "a".into(),
            on: true,
            reason: String::new(),
        },
    );
    let mut h2 = H::new(cfg_with(short_windows));
    h2.core.restore(journaled(&h));
    quiet_fleet(&mut h2, QUIET);
    assert!(h2.core.cordons().contains("a"));
    assert!(
        h2.core
            .candidates(&g("d1", "small"), "", h2.now)
            .iter()
            .all(|c| c.name != "a")
    );
    let _ = Cordon::describe;
    let _ = Pause::describe;
}

#[test]
fn a_maintenance_drain_empties_the_node_and_keeps_it_cordoned() {
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 30)]);
    let (r, acts) = ask(
        &mut h,
        AdminRequest::Drain {
            node: "c".into(),
            keep: true,
        },
    );
    assert!(
        r.ok && r.message.contains("for maintenance"),
        "{}",
        r.message
    );
    let op = OpId::from(r.data["op"].as_str().unwrap());
    let (_, _, cmd, _) = sends(&acts).pop().unwrap();
    let a = done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: vec![] },
    );
    assert!(calls(&a).is_empty(), "no removal: {a:?}");
    h.advance(1);
    let mut empty = rep("c", "d1", "small", 100, 0, 0);
    empty.active = false;
    h.report(empty);
    let d = down(&h, &op);
    assert_eq!((d.step, d.end), (DownStep::Done, Some(DownEnd::Kept)));
    assert!(
        h.out
            .iter()
            .any(|x| matches!(x, Action::Decide(d) if d.decision == DecisionKind::Drained))
    );
    assert!(
        calls(&h.out)
            .iter()
            .all(|c| !matches!(c.1, HandlerCall::Remove(_)))
    );
    let c = h.core.cordons().get("c").unwrap();
    assert_eq!(
        (c.by.as_str(), c.op.as_deref()),
        ("alice", Some(op.as_str()))
    );
    assert!(
        h.core
            .group_state(&g("d1", "small"))
            .memory
            .last_scale_down
            .is_some()
    );
    // The policy never picks it (inactive would come first otherwise).
    let a = h.eval();
    assert!(decisions(&a).iter().all(|d| d.2.as_deref() != Some("c")));
    // activate: cmd.activate and the cordon lifted.
    let (r, acts) = ask(&mut h, AdminRequest::Activate { node: "c".into() });
    assert!(
        r.ok && r.message.contains("cmd.activate sent to c")
            && r.message.contains("no longer cordoned"),
        "{}",
        r.message
    );
    assert!(matches!(sends(&acts)[0].3, Message::Activate(_)));
    assert!(!h.core.cordons().contains("c"));
    // An active, uncordoned node cannot be activated.
    assert!(
        !ask(&mut h, AdminRequest::Activate { node: "a".into() })
            .0
            .ok
    );
}

/// Three quiet nodes in `district`.
fn quiet_fleet_in(h: &mut H, district: &str) {
    for (n, l) in QUIET {
        h.node(&format!("{district}-{n}"), district, *l, 100);
    }
}

#[test]
fn activate_returns_a_node_left_deactivated_to_service_in_openshift_too() {
    let mut h = H::new(cfg_with(|c| c.paas.kind = crate::paas::PaasKind::OpenShift));
    quiet_fleet(&mut h, QUIET);
    // c was left deactivated by a drain that failed: inactive for gearshift
    // and in its district, no drain running.
    let mut left = rep("c", "d1", "small", 100, 10, 0);
    left.active = false;
    left.district.as_mut().unwrap().active = false;
    h.report(left);
    let g1 = g("d1", "small");
    let before = h.core.group_stats(&g1, h.now).available_active_gears;
    let (r, acts) = ask(&mut h, AdminRequest::Activate { node: "c".into() });
    assert!(
        r.ok && r.message.contains("cmd.activate sent to c")
            && r.message.contains("activate-node c in district d1"),
        "{}",
        r.message
    );
    assert!(matches!(sends(&acts)[0].3, Message::Activate(_)));
    let paas = paas_calls(&acts);
    assert_eq!(paas.len(), 1, "{acts:?}");
    let activate = crate::core::PaasCall::Activate {
        district: "d1".into(),
        host: "c".into(),
    };
    assert_eq!(paas[0].1, activate);
    // The answer is only logged; the node's next report brings it back.
    let ok = CallResult::Paas {
        call: activate,
        outcome: crate::paas::Outcome::Done,
    };
    let tag = CallTag::Paas(paas[0].0.clone());
    assert!(h.core.on_handler_result(tag, ok, h.now).is_empty());
    h.advance(1);
    h.node("c", "d1", 10, 100);
    let after = h.core.group_stats(&g1, h.now).available_active_gears;
    assert_eq!(after, before + 90);
    // Inactive only in OpenShift: still activated (not "already active").
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    let mut only_district = rep("c", "d1", "small", 100, 10, 0);
    only_district.district.as_mut().unwrap().active = false;
    h.report(only_district);
    let (r, acts) = ask(&mut h, AdminRequest::Activate { node: "c".into() });
    // Without a PaaS adapter the answer says which command to run.
    assert!(
        r.ok && r
            .message
            .contains("oo-admin-ctl-district -c activate-node -u d1 -i c"),
        "{}",
        r.message
    );
    assert!(paas_calls(&acts).is_empty());
}
