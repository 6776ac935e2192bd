//! Whether a leader may still carry out effects.
//!
//! A leader whose bus connection dropped may have been replaced already:
//! the broker hands the leader queue to another agent at once, before this
//! agent's loop hears of the loss. An effect carried out then (a handler
//! result arriving, say, makes the next step call the cloud) could be
//! carried out again by the successor, which resumes from the journal it
//! was last sent. So from the first connection change since the takeover,
//! or a journal that did not replicate, leadership is in doubt: effects are
//! left journaled, and the election steps down to prove it again.

use gearshift_bus::BusEvent;
use tokio::sync::broadcast::{self, error::TryRecvError};

/// The proof of leadership since the takeover.
#[derive(Debug, Default)]
pub(super) struct Proof {
    /// The bus's connection changes since the takeover (`None` standing by).
    since: Option<broadcast::Receiver<BusEvent>>,
    /// Why leadership is in doubt, once it is.
    doubt: Option<&'static str>,
}

impl Proof {
    /// Taking the lead: watch the connection from now on.
    pub fn arm(&mut self, events: broadcast::Receiver<BusEvent>) {
        self.since = Some(events);
        self.doubt = None;
    }

    /// Standing by: nothing to prove.
    pub fn disarm(&mut self) {
        self.since = None;
        self.doubt = None;
    }

    /// The journal could not be replicated: a successor would not know of
    /// the commit's effects.
    pub fn replication_failed(&mut self) {
        self.doubt.get_or_insert("replication_failed");
    }

    /// Why leadership is in doubt, checking the connection (`connected`,
    /// and the changes since the takeover) first.
    pub fn doubt(&mut self, connected: bool) -> Option<&'static str> {
        if self.doubt.is_none() && !connected {
            self.doubt = Some("bus_lost");
        }
        if let (None, Some(rx)) = (self.doubt, self.since.as_mut()) {
            loop {
                match rx.try_recv() {
                    Ok(BusEvent::Connected { reconnects: 0 }) => {}
                    Ok(_) | Err(TryRecvError::Lagged(_)) => {
                        self.doubt = Some("bus_lost");
                        break;
                    }
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                }
            }
        }
        self.doubt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_change_since_the_takeover_puts_leadership_in_doubt_until_disarmed() {
        let (tx, rx) = broadcast::channel(8);
        let mut p = Proof::default();
        p.arm(rx);
        assert_eq!(p.doubt(true), None);
        tx.send(BusEvent::Connected { reconnects: 0 }).unwrap();
        assert_eq!(p.doubt(true), None, "the first connection is no change");
        tx.send(BusEvent::Disconnected {
            reason: "closed".into(),
        })
        .unwrap();
        tx.send(BusEvent::Connected { reconnects: 1 }).unwrap();
        assert_eq!(p.doubt(true), Some("bus_lost"));
        assert_eq!(p.doubt(true), Some("bus_lost"), "it stays in doubt");
        p.disarm();
        assert_eq!(p.doubt(true), None);
        p.arm(tx.subscribe());
        assert_eq!(p.doubt(true), None, "a new takeover starts clean");
    }

    #[test]
    fn a_disconnected_bus_or_a_failed_replication_is_doubt_too() {
        let (_tx, rx) = broadcast::channel::<BusEvent>(8);
        let mut p = Proof::default();
        p.arm(rx);
        assert_eq!(p.doubt(false), Some("bus_lost"));
        let (_tx, rx) = broadcast::channel::<BusEvent>(8);
        p.arm(rx);
        p.replication_failed();
        assert_eq!(p.doubt(true), Some("replication_failed"));
    }

    #[test]
    fn missed_connection_events_are_doubt() {
        let (tx, rx) = broadcast::channel(1);
        let mut p = Proof::default();
        p.arm(rx);
        for _ in 0..3 {
            tx.send(BusEvent::Connected { reconnects: 0 }).unwrap();
        }
        assert_eq!(p.doubt(true), Some("bus_lost"));
    }
}
