use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;

fn t0() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap()
}

fn at(ms: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::milliseconds(ms)
}

fn timing() -> LeadTiming {
    LeadTiming {
        period: Duration::from_secs(1),
        lease: Duration::from_secs(3),
    }
}

/// The token a tick published, if any.
fn published(acts: &[LeadAction]) -> Option<u64> {
    acts.iter().find_map(|a| match a {
        LeadAction::PublishToken { seq } => Some(*seq),
        _ => None,
    })
}

fn own(seq: u64) -> Input {
    Input::Token { own: true, seq }
}

/// A machine that led at `at(0)` with its first token.
fn leader() -> (Lead, u64) {
    let mut l = Lead::new(timing(), 0);
    let seq = published(&l.step(Input::Tick, at(0))).unwrap();
    let acts = l.step(own(seq), at(5));
    let Some(LeadAction::BecomeLeader { epoch }) = acts.first().cloned() else {
        panic!("{acts:?}")
    };
    (l, epoch)
}

#[test]
fn an_agent_alone_leads_on_its_first_token() {
    let mut l = Lead::new(timing(), 0);
    assert!(!l.is_leader());
    let acts = l.step(Input::Tick, at(0));
    assert_eq!(acts, vec![LeadAction::PublishToken { seq: 0 }]);
    let acts = l.step(own(0), at(3));
    let epoch = at(3).timestamp_millis() as u64;
    assert_eq!(
        acts,
        vec![LeadAction::BecomeLeader { epoch }, LeadAction::Announce]
    );
    assert_eq!(
        l.role(),
        &Role::Leader {
            epoch,
            since: at(3)
        }
    );
}

#[test]
fn tokens_go_out_every_period_and_the_leader_announces() {
    let (mut l, _) = leader();
    assert_eq!(l.step(Input::Tick, at(500)), vec![]);
    assert_eq!(
        l.step(Input::Tick, at(1000)),
        vec![LeadAction::PublishToken { seq: 1 }, LeadAction::Announce]
    );
}

#[test]
fn a_standby_that_receives_nothing_stays_standby() {
    let mut l = Lead::new(timing(), 0);
    for s in 0..10 {
        let acts = l.step(Input::Tick, at(s * 1000));
        assert_eq!(published(&acts), Some(s as u64));
        assert!(
            !acts
                .iter()
                .any(|a| matches!(a, LeadAction::BecomeLeader { .. }))
        );
    }
    // Other agents' tokens never make it lead.
    assert_eq!(
        l.step(Input::Token { own: false, seq: 3 }, at(10_000)),
        vec![]
    );
    assert!(!l.is_leader());
}

#[test]
fn the_epoch_exceeds_every_epoch_seen_and_the_clock() {
    let far = at(0).timestamp_millis() as u64 + 1_000_000;
    let mut l = Lead::new(timing(), far);
    l.step(Input::Tick, at(0));
    let acts = l.step(own(0), at(1));
    assert_eq!(acts[0], LeadAction::BecomeLeader { epoch: far + 1 });
    // An announcement seen later raises what the next takeover must exceed.
    let mut l = Lead::new(timing(), 0);
    l.step(
        Input::EpochSeen {
            epoch: far + 50,
            other_leader: true,
        },
        at(0),
    );
    l.step(Input::Tick, at(0));
    assert_eq!(
        l.step(own(0), at(1))[0],
        LeadAction::BecomeLeader { epoch: far + 51 }
    );
}

#[test]
fn a_bus_reset_steps_down_at_once_and_old_tokens_prove_nothing() {
    let (mut l, epoch) = leader();
    l.step(Input::Tick, at(1000)); // token 1, still in flight
    assert_eq!(
        l.step(Input::BusReset, at(1100)),
        vec![LeadAction::StepDown(StepDown::BusLost)]
    );
    assert!(!l.is_leader());
    // Token 1 was published before the reset: buffered somewhere, no proof.
    assert_eq!(l.step(own(1), at(1200)), vec![]);
    assert!(!l.is_leader());
    // The next tick proves it again at once, with a newer epoch.
    let seq = published(&l.step(Input::Tick, at(1300))).unwrap();
    assert_eq!(seq, 2);
    match l.step(own(seq), at(1310)).first() {
        Some(LeadAction::BecomeLeader { epoch: e }) => assert!(*e > epoch),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_leader_without_its_own_tokens_steps_down_after_the_lease() {
    let (mut l, _) = leader();
    for s in 1..=3 {
        let acts = l.step(Input::Tick, at(s * 1000));
        assert!(!acts.contains(&LeadAction::StepDown(StepDown::LeaseLost)));
    }
    let acts = l.step(Input::Tick, at(3006));
    assert_eq!(acts[0], LeadAction::StepDown(StepDown::LeaseLost));
    assert!(!l.is_leader());
    // A late own token (published before the lease ran out) leads again.
    assert!(matches!(
        l.step(own(3), at(3100)).first(),
        Some(LeadAction::BecomeLeader { .. })
    ));
}

#[test]
fn own_tokens_keep_the_lease() {
    let (mut l, epoch) = leader();
    for s in 1..20 {
        let seq = published(&l.step(Input::Tick, at(s * 1000))).unwrap();
        assert_eq!(l.step(own(seq), at(s * 1000 + 10)), vec![]);
    }
    assert_eq!(l.epoch(), Some(epoch));
}

#[test]
fn a_newer_leader_deposes_and_an_older_one_does_not() {
    let (mut l, epoch) = leader();
    let older = Input::EpochSeen {
        epoch: epoch - 1,
        other_leader: true,
    };
    assert_eq!(l.step(older, at(100)), vec![]);
    // A replicated journal with a newer epoch is no claim to lead.
    let journal = Input::EpochSeen {
        epoch: epoch + 1,
        other_leader: false,
    };
    assert_eq!(l.step(journal, at(150)), vec![]);
    assert!(l.is_leader());
    let newer = Input::EpochSeen {
        epoch: epoch + 5,
        other_leader: true,
    };
    assert_eq!(
        l.step(newer, at(200)),
        vec![LeadAction::StepDown(StepDown::Deposed)]
    );
    assert_eq!(l.seen_epoch(), epoch + 5);
    // Its token in flight proves nothing; a new one leads above the newer epoch.
    assert_eq!(l.step(own(0), at(210)), vec![]);
    let seq = published(&l.step(Input::Tick, at(1000))).unwrap();
    match l.step(own(seq), at(1010)).first() {
        Some(LeadAction::BecomeLeader { epoch: e }) => assert!(*e > epoch + 5),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tokens_never_published_are_ignored() {
    let mut l = Lead::new(timing(), 0);
    l.step(Input::Tick, at(0));
    // A forged or foreign sequence number beyond what was published.
    assert_eq!(l.step(own(7), at(1)), vec![]);
    assert!(!l.is_leader());
}
