//! OpenShift's own state in the policy: a node deactivated in its district
//! is neither capacity nor a victim; undistricted nodes are not where a
//! profile with districts grows; a new node joining its district is not a
//! victim of the group it reports in meanwhile.

use crate::core::testkit::*;

/// `node`'s report in `district` with OpenShift's `district_active` flag.
fn in_district(node: &str, district: &str, active: u32, district_active: bool) -> NodeReport {
    let mut r = rep(node, district, "small", 100, active, 0);
    if let Some(d) = r.district.as_mut() {
        d.active = district_active;
    }
    r
}

#[test]
fn a_node_inactive_in_its_district_is_not_capacity() {
    let mut h = H::new(cfg_with(|_| {}));
    h.report(in_district("a", "d1", 85, true));
    h.report(in_district("b", "d1", 0, true));
    // With b's 100 free slots: 85 of 185, under 80 %.
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", kinds(&a));
    // An operator deactivates b with oo-admin-ctl-district: 85 of 100.
    h.advance(11);
    h.report(in_district("a", "d1", 85, true));
    h.report(in_district("b", "d1", 0, false));
    let st = h.core.group_stats(&g("d1", "small"), h.now);
    assert_eq!(
        (
            st.nodes_active,
            st.nodes_inactive,
            st.available_active_gears
        ),
        (1, 1, 15)
    );
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleUp]);
    // Nor a placement target for another node's gears.
    assert!(
        h.core
            .candidates(&g("d1", "small"), "a", h.now)
            .iter()
            .all(|c| c.name != "b")
    );
}

#[test]
fn a_node_inactive_in_its_district_is_not_a_victim() {
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    // c (the least busy) is deactivated in OpenShift by someone else.
    h.report(in_district("c", "d1", 10, false));
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleDown, "d1".into(), Some("b".into()))]
    );
    // With a and b opted out, nothing is drained, and the explanation says why.
    let mut h2 = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h2, QUIET);
    h2.report(in_district("c", "d1", 10, false));
    h2.core.set_do_not_disrupt("a", true);
    h2.core.set_do_not_disrupt("b", true);
    let a = h2.eval();
    assert!(kinds(&a).is_empty(), "{:?}", decisions(&a));
    let e = explain(&a, "d1");
    assert!(
        rule(e, "victim")
            .detail
            .contains("c inactive in its district"),
        "{e:?}"
    );
}

#[test]
fn undistricted_nodes_are_not_scale_up_targets_when_the_profile_has_districts() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 95, 100);
    h.node("u", "_none", 95, 100);
    let a = h.eval();
    // `_none` has no district (so "most free UIDs"): still d1 gets the node.
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleUp, "d1".into(), None)]
    );
    // And its own triggers (min_nodes here) do not boot nodes there either.
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.group_defaults.min_nodes = 2;
    }));
    h.node("a", "d1", 10, 100);
    h.node("b", "d1", 10, 100);
    h.node("u", "_none", 10, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", decisions(&a));
    let e = explain(&a, "_none");
    assert!(!rule(e, "districted_target").ok, "{e:?}");
    assert!(
        rule(e, "districted_target")
            .detail
            .contains("has districts")
    );
    // A profile without districts grows its `_none` group.
    let mut h = H::new(cfg_with(|_| {}));
    h.node("u", "_none", 95, 100);
    assert_eq!(
        decisions(&h.eval()),
        vec![(DecisionKind::ScaleUp, "_none".into(), None)]
    );
}

#[test]
fn a_new_node_joining_its_district_is_not_a_victim() {
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.profile_threshold = PerKey::off();
        c.policy.district_threshold = PerKey::off();
    }));
    let (op, acts) = h
        .core
        .start_scale_up(&g("d1", "small"), "test".into(), h.now);
    h.out.extend(acts);
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(&mut h, CallResult::Create(Ok(CreateOutcome::default())));
    h.advance(60);
    // Two quiet undistricted nodes: the new one (being added) and an old one.
    let mut new = rep("new", "_none", "small", 100, 0, 0);
    new.started_at = h.now;
    h.report(new);
    // Without a PaaS adapter it waits for its district (with one: add-node).
    assert_eq!(up_step(&h, &op), UpStep::Districting);
    h.node("old", "_none", 10, 100);
    h.node("old2", "_none", 20, 100);
    h.core.set_do_not_disrupt("old2", true);
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleDown, "_none".into(), Some("old".into()))]
    );
    // The others draining or opted out, it is still not drained, and the
    // explanation says why.
    let a = h.eval();
    let e = explain(&a, "_none");
    assert!(
        rule(e, "victim")
            .detail
            .contains("new joining its district"),
        "{e:?}"
    );
}
