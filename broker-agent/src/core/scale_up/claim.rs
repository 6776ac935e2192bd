//! Which scale-up a node's report belongs to.
//!
//! A report that names its operation (`booted_for`, from the user data the
//! handler passed) belongs to it. Handlers that cannot pass the id (a Heat
//! scaling-policy signal, Magnum, heat-via-node, email, spool, log) boot
//! nodes that report without one: the first node never seen before that
//! reports in the group within the provision window claims the group's
//! oldest open scale-up. One node claims one operation: once claimed, the
//! operation has its node and is no longer `Booting`.

use gearshift_proto::msg::NodeReport;
use gearshift_proto::routing::NO_DISTRICT;

use super::{Match, UpStep};
use crate::fleet::group_of;
use crate::ops::{Op, OpId, Ops};

/// The scale-up `report` belongs to, and how it was matched. `new_node`:
/// the fleet had never seen the node before this report.
pub fn claim(ops: &Ops, report: &NodeReport, new_node: bool) -> Option<(OpId, Match)> {
    let node = report.node.as_str();
    if let Some(id) = report.booted_for.as_deref() {
        // Its own operation, or none (a finished one is not reopened).
        return ops
            .get(id)
            .filter(|o| o.up().is_some() && !o.is_done())
            .map(|o| (o.id.clone(), Match::OperationId));
    }
    // A node being added to its district reports again.
    if let Some((op, up)) = ops.in_flight().find_map(|o| {
        o.up()
            .filter(|u| u.node.as_deref() == Some(node) && u.seen_at.is_some())
            .map(|u| (o, u))
    }) {
        return Some((op.id.clone(), up.matched.unwrap_or(Match::FirstNewNode)));
    }
    if !new_node {
        return None;
    }
    let key = group_of(report);
    ops.in_flight()
        .filter(|o| open_for(o, report, &key.district))
        .min_by_key(|o| (o.created, o.id.clone()))
        .map(|o| (o.id.clone(), Match::FirstNewNode))
}

/// Whether `o` waits for a node like the one that sent `report`: a booting
/// scale-up of its profile, in its district (or any district when the node
/// is not districted yet), decided before the node's agent started, and not
/// expecting another node by name.
fn open_for(o: &Op, report: &NodeReport, district: &str) -> bool {
    let Some(u) = o.up() else {
        return false;
    };
    matches!(u.step, UpStep::Booting { .. })
        && u.node.as_deref().is_none_or(|n| n == report.node)
        && o.group.profile == report.profile
        && (district == NO_DISTRICT || o.group.district == district)
        && o.created <= report.started_at
}
