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
