//! A node's first report goes out only once its command queue exists and is
//! consumed (section 7.1): a docs-following client that sends a command as
//! soon as it sees that report, to a node whose queue nobody declared
//! before, has it acted upon (before, it was unroutable and lost).

use gearshift_proto::msg::{Deactivate, Message};

use super::{HostileNode, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_a_command_right_after_the_first_report_is_acted_upon() {
    for run in 0..3 {
        // Nobody declares the node's queue: only the node does.
        let mut n = HostileNode::new("2s", false).await;
        let mut events = n.ctl.events(&n.name, &n.node_key).await;
        let mut reports = n.ctl.reports(&n.name, &n.node_key).await;
        n.proc.start();
        reports.next(WAIT).await;
        let id = n.ctl.send(&n.name, Deactivate::default(), None).await;
        let e = events.outcome(id, WAIT).await;
        assert!(
            matches!(e.msg, Message::Done(_)),
            "run {run}: {:?}\n{}",
            e.msg,
            n.log_tail()
        );
    }
}
