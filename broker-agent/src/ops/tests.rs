//! The journal's records as the first versions wrote them: this version
//! must read them, and write them back with the same fields.

use super::*;

const UP_BOOTING: &str = r#"{"id":"op-0123456789ab","group":{"district":"d1","profile":"small"},"handler":"nova","reason":"why","created":"2026-11-20T10:00:00Z","updated":"2026-11-20T10:00:00Z","call_seq":2,"body":{"type":"scale_up","step":{"step":"booting","uncertain":true},"attempt":1,"node":"n9","cloud_id":"c-1","requested_at":"2026-11-20T10:00:00Z","detail":"d"}}"#;

const UP_FAILED: &str = r#"{"id":"op-0123456789ab","group":{"district":"d1","profile":"small"},"handler":"nova","reason":"why","created":"2026-11-20T10:00:00Z","updated":"2026-11-20T10:00:00Z","call_seq":2,"body":{"type":"scale_up","step":{"step":"failed","kind":"quota","error":"e"},"attempt":2,"node":null,"cloud_id":null,"requested_at":null,"detail":""}}"#;

const UP_WAITING: &str = r#"{"id":"op-0123456789ab","group":{"district":"d1","profile":"small"},"handler":"nova","reason":"why","created":"2026-11-20T10:00:00Z","updated":"2026-11-20T10:00:00Z","call_seq":2,"body":{"type":"scale_up","step":{"step":"waiting","until":"2026-11-20T10:00:00Z"},"attempt":2,"node":null,"cloud_id":null,"requested_at":null,"detail":""}}"#;

const DOWN_REACTIVATING: &str = r#"{"id":"op-ba9876543210","group":{"district":"d1","profile":"small"},"handler":"log","reason":"r","created":"2026-11-20T10:00:00Z","updated":"2026-11-20T10:00:00Z","call_seq":1,"body":{"type":"scale_down","node":"c","origin":{"operator":{"by":"alice"}},"step":{"step":"reactivating","cancel":true},"cmd":"00000000-0000-0000-0000-000000000007","cmd_sent":"2026-11-20T10:00:00Z","sends":1,"deadline":"2026-11-20T10:00:00Z","round":1,"gears":[{"id":"g1","app":"a","state":"idle","uid":1001,"bytes":5,"do_not_disrupt":false}],"moves":[{"gear":"g1","target":"b"}],"progress":{"moved":1,"failed":0,"remaining":0,"total":1,"moved_total":1},"remove_attempt":0,"removed_at":null,"next_call":null,"presence":"Unknown","abort_reason":"x","end":null,"replan_at":"2026-11-20T10:00:00Z"}}"#;

const DOWN_ABORTED: &str = r#"{"id":"op-ba9876543210","group":{"district":"d1","profile":"small"},"handler":"log","reason":"r","created":"2026-11-20T10:00:00Z","updated":"2026-11-20T10:00:00Z","call_seq":1,"body":{"type":"scale_down","node":"c","origin":{"policy":{"strategy":"least_busy"}},"step":{"step":"done"},"cmd":null,"cmd_sent":null,"sends":0,"deadline":"2026-11-20T10:00:00Z","round":0,"gears":[],"moves":[],"progress":{"moved":0,"failed":0,"remaining":0,"total":0,"moved_total":0},"remove_attempt":1,"removed_at":"2026-11-20T10:00:00Z","next_call":"2026-11-20T10:00:00Z","presence":null,"abort_reason":null,"end":{"end":"aborted","reason":"no"},"replan_at":null}}"#;

const GROUP_FULL: &str = r#"{"last_scale_up":"2026-11-20T10:00:00Z","last_scale_down":null,"last_failure":"2026-11-20T10:00:00Z","backoff_until":"2026-11-20T10:00:00Z","up_failures":2,"quota_failures":1,"exhausted":{"since":"2026-11-20T10:00:00Z","reason":"quota","next_check":"2026-11-20T10:00:00Z"},"underused_since":"2026-11-20T10:00:00Z","last_decision":"2026-11-20T10:00:00Z"}"#;

const GROUP_EMPTY: &str = r#"{"last_scale_up":null,"last_scale_down":null,"last_failure":null,"backoff_until":null,"up_failures":0,"quota_failures":0,"exhausted":null,"underused_since":null,"last_decision":null}"#;

/// Parses `json` as `T`, writes it again, and checks that the written form
/// reads back equal and names the same fields with the same values.
fn round_trip<T>(json: &str) -> T
where
    T: serde::de::DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    let v: T = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let again = serde_json::to_string(&v).unwrap();
    let back: T = serde_json::from_str(&again).unwrap();
    assert_eq!(back, v);
    let old: serde_json::Value = serde_json::from_str(json).unwrap();
    let new: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(old, new, "the record is written as before");
    v
}

#[test]
fn operations_written_by_earlier_versions_read_back() {
    let up = round_trip::<Op>(UP_BOOTING);
    assert_eq!(up.id, "op-0123456789ab");
    assert_eq!(up.state(), "booting");
    assert_eq!(up.node(), Some("n9"));
    assert!(!up.is_done());
    let failed = round_trip::<Op>(UP_FAILED);
    assert!(failed.is_done());
    assert_eq!(failed.state(), "failed");
    assert_eq!(round_trip::<Op>(UP_WAITING).state(), "waiting");
    let down = round_trip::<Op>(DOWN_REACTIVATING);
    assert_eq!((down.kind(), down.state()), ("scale_down", "cancelling"));
    let d = down.down().unwrap();
    assert_eq!(d.gears.len(), 1);
    assert_eq!(d.origin, Origin::Operator { by: "alice".into() });
    let ended = round_trip::<Op>(DOWN_ABORTED);
    assert!(ended.is_done());
    assert_eq!(ended.state(), "aborted");
}

#[test]
fn group_records_written_by_earlier_versions_read_back() {
    let g = round_trip::<GroupState>(GROUP_FULL);
    assert_eq!(g.supply.up_failures, 2);
    assert_eq!(g.supply.quota_failures, 1);
    assert!(g.supply.exhausted.is_some());
    assert!(g.supply.backoff_until.is_some());
    assert!(g.memory.last_scale_up.is_some());
    assert!(g.memory.last_scale_down.is_none());
    assert!(g.memory.underused_since.is_some());
    assert_eq!(round_trip::<GroupState>(GROUP_EMPTY), GroupState::default());
}

#[test]
fn op_ids_are_their_string_on_the_wire_and_in_the_journal() {
    let id = OpId::new(Uuid::from_u128(0xabcdef));
    assert!(id.as_str().starts_with("op-") && id.as_str().len() == 15);
    assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
    let mut ops = Ops::default();
    let op: Op = serde_json::from_str(UP_BOOTING).unwrap();
    ops.insert(op);
    assert!(ops.get("op-0123456789ab").is_some());
}

const DOWN_KEPT: &str = r#"{"id":"op-ba9876543210","group":{"district":"d1","profile":"small"},"handler":"log","reason":"r","created":"2026-11-20T10:00:00Z","updated":"2026-11-20T10:00:00Z","call_seq":0,"body":{"type":"scale_down","node":"c","origin":{"operator":{"by":"alice"}},"keep":true,"step":{"step":"done"},"cmd":null,"cmd_sent":null,"sends":1,"deadline":"2026-11-20T10:00:00Z","round":1,"gears":[],"moves":[],"progress":{"moved":0,"failed":0,"remaining":0,"total":0,"moved_total":0},"remove_attempt":0,"removed_at":null,"next_call":null,"presence":null,"abort_reason":null,"end":{"end":"kept"},"replan_at":null}}"#;

const GROUP_PAUSED: &str = r#"{"last_scale_up":null,"last_scale_down":null,"last_failure":null,"backoff_until":null,"up_failures":0,"quota_failures":0,"exhausted":null,"underused_since":null,"last_decision":null,"paused":{"by":"alice","reason":"upgrade","since":"2026-11-20T10:00:00Z","until":"2026-11-20T12:00:00Z"}}"#;

#[test]
fn maintenance_drains_and_pauses_have_their_own_fields() {
    let kept = round_trip::<Op>(DOWN_KEPT);
    let d = kept.down().unwrap();
    assert!(d.keep && kept.is_done());
    assert_eq!(kept.state(), "kept");
    let g = round_trip::<GroupState>(GROUP_PAUSED);
    assert_eq!(g.paused.unwrap().by, "alice");
    // Earlier records have neither: they read as a removal drain, unpaused.
    assert!(!round_trip::<Op>(DOWN_ABORTED).down().unwrap().keep);
    assert!(round_trip::<GroupState>(GROUP_FULL).paused.is_none());
}
