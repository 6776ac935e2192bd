use chrono::{Duration, Utc};
use gearshift_proto::enroll::Token;
use gearshift_proto::msg::{EnrollToken, Role};
use uuid::Uuid;

use super::*;

fn token(uses: u32, host: Option<&str>) -> Token {
    Token {
        id: Uuid::new_v4(),
        issuer: "alice".into(),
        role: Role::Operator,
        not_after: Utc::now() + Duration::days(1),
        grant: EnrollToken {
            district: "d1".into(),
            profile: "small".into(),
            max_uses: uses,
            host: host.map(str::to_string),
        },
    }
}

fn ask<'a>(host: &'a str, key_id: &'a str) -> Ask<'a> {
    Ask {
        host,
        key_id,
        district: Some("d1"),
        profile: Some("small"),
    }
}

#[test]
fn a_one_use_token_enrolls_one_host_and_a_retry_is_idempotent() {
    let now = Utc::now();
    let t = token(1, None);
    let mut l = Ledger::default();
    assert_eq!(decide(&l, &t, ask("n1", "k1"), None, now), Verdict::Enroll);
    assert!(l.record(&t, "n1"));
    // The node retries (its answer was lost): same key, already enrolled.
    assert_eq!(
        decide(&l, &t, ask("n1", "k1"), Some("k1"), now),
        Verdict::Already
    );
    assert!(!l.record(&t, "n1"), "nothing new recorded");
    // A second host with the same token: used up.
    let v = decide(&l, &t, ask("n2", "k2"), None, now);
    assert_eq!(v.label(), "token_used_up");
}

#[test]
fn every_refusal_has_its_reason() {
    let now = Utc::now();
    let l = Ledger::default();
    let t = token(5, None);
    let label = |v: Verdict| v.label();
    assert_eq!(
        label(decide(&l, &t, ask("../x", "k"), None, now)),
        "bad_request"
    );
    let expired = Token {
        not_after: now - Duration::seconds(1),
        ..t.clone()
    };
    assert_eq!(
        label(decide(&l, &expired, ask("n1", "k"), None, now)),
        "token_expired"
    );
    let pinned = token(1, Some("n9"));
    assert_eq!(
        label(decide(&l, &pinned, ask("n1", "k"), None, now)),
        "wrong_host"
    );
    assert_eq!(
        decide(&l, &pinned, ask("n9", "k"), None, now),
        Verdict::Enroll
    );
    let other_group = Ask {
        profile: Some("large"),
        ..ask("n1", "k")
    };
    assert_eq!(label(decide(&l, &t, other_group, None, now)), "wrong_group");
    let other_district = Ask {
        district: Some("d2"),
        ..ask("n1", "k")
    };
    assert_eq!(
        label(decide(&l, &t, other_district, None, now)),
        "wrong_group"
    );
    // A node that does not know its group yet is not refused for it.
    let unknown = Ask {
        district: None,
        profile: None,
        ..ask("n1", "k")
    };
    assert_eq!(decide(&l, &t, unknown, None, now), Verdict::Enroll);
    // Another key already holds the host: a stolen token cannot take it over.
    assert_eq!(
        label(decide(&l, &t, ask("n1", "k"), Some("old"), now)),
        "host_taken"
    );
}

#[test]
fn a_revoked_host_cannot_come_back_with_the_same_token() {
    let now = Utc::now();
    let t = token(3, None);
    let mut l = Ledger::default();
    l.record(&t, "n1");
    // nodes.d/n1.pub removed (revoked): the same token may not enroll n1 again.
    let v = decide(&l, &t, ask("n1", "k-new"), None, now);
    assert_eq!(v.label(), "revoked");
    // Other hosts still may, up to max_uses.
    assert_eq!(decide(&l, &t, ask("n2", "k2"), None, now), Verdict::Enroll);
    l.record(&t, "n2");
    l.record(&t, "n3");
    assert_eq!(
        decide(&l, &t, ask("n4", "k4"), None, now).label(),
        "token_used_up"
    );
}

#[test]
fn expired_tokens_are_forgotten_and_the_ledger_is_bounded() {
    let now = Utc::now();
    let mut l = Ledger::default();
    let old = Token {
        not_after: now - Duration::hours(1),
        ..token(1, None)
    };
    l.record(&old, "n1");
    l.record(&token(1, None), "n2");
    assert!(l.expire(now));
    assert_eq!(l.tokens.len(), 1);
    for _ in 0..MAX_TOKENS {
        l.record(&token(1, None), "n");
    }
    assert_eq!(
        decide(&l, &token(1, None), ask("n5", "k"), None, now).label(),
        "failed"
    );
}

#[test]
fn the_ledger_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let now = Utc::now();
    let t = token(2, None);
    let mut s = store::Stored::open(dir.path(), now);
    s.ledger.record(&t, "n1");
    s.save().unwrap();
    let again = store::Stored::open(dir.path(), now);
    assert_eq!(again.ledger, s.ledger);
    assert_eq!(
        decide(&again.ledger, &t, ask("n1", "k"), None, now).label(),
        "revoked"
    );
    // A corrupt file is set aside, not fatal.
    std::fs::write(dir.path().join(store::FILE), b"{not json").unwrap();
    let empty = store::Stored::open(dir.path(), now);
    assert!(empty.ledger.tokens.is_empty());
    assert!(dir.path().join("enroll-ledger.json.unreadable").exists());
}
