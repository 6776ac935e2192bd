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
