//! The history: records, rotation, reading back, the explanation filter.

use chrono::{DateTime, Duration, Utc};
use gearshift_proto::msg::{Decision, DecisionKind, Explanation, GroupStats, Outcome, Reason};

use super::*;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).unwrap()
}

fn decision(district: &str, i: u32) -> Record {
    Record {
        at: t0() + Duration::minutes(i64::from(i)),
        event: Event::Decision(Decision {
            decision: DecisionKind::ScaleUp,
            district: district.into(),
            profile: "small".into(),
            op: Some(format!("op-{i:012}")),
            node: None,
            reason: "x".repeat(200),
            handler: Some("log".into()),
            stats: None,
            dry_run: false,
            epoch: 0,
        }),
    }
}

fn explanation(outcome: Outcome, ok: bool, detail: &str) -> Explanation {
    Explanation {
        district: "d1".into(),
        profile: "small".into(),
        evaluated_at: t0(),
        outcome,
        summary: detail.into(),
        reasons: vec![Reason {
            rule: "stabilization".into(),
            ok,
            detail: detail.into(),
        }],
        stats: GroupStats::default(),
        ops_in_flight: vec![],
    }
}

#[test]
fn records_are_one_json_object_per_line_with_a_type() {
    let r = Record {
        at: t0(),
        event: Event::Saga(SagaStep {
            op: "op-1".into(),
            kind: "scale_down".into(),
            district: "d1".into(),
            profile: "small".into(),
            node: Some("n1".into()),
            from: Some("deactivating".into()),
            to: "evacuating".into(),
        }),
    };
    let line = serde_json::to_string(&r).unwrap();
    assert!(
        line.starts_with(r#"{"at":"2023-11-14T22:13:20Z","type":"saga","op":"op-1""#),
        "{line}"
    );
    assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    let d = decision("d1", 1);
    let back: Record = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
    assert_eq!(back, d);
    assert!(read::render(&d).contains("DECISION scale_up d1/small op-000000000001"));
}

#[test]
fn the_writer_rotates_by_size_and_keeps_n_files() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = HistoryConfig {
        enabled: true,
        max_file_bytes: 2_000,
        rotated_files: 2,
    };
    let mut w = Writer::new(dir.path(), &cfg);
    for i in 0..40 {
        w.append(&decision("d1", i)).unwrap();
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for n in 0..3 {
        let len = std::fs::metadata(writer::path_of(dir.path(), n))
            .unwrap()
            .len();
        assert!(len <= 2_000, "file {n}: {len} bytes");
    }
    // Oldest first, the newest last, nothing lost within the kept files.
    let all = read(dir.path(), &Filter::default()).unwrap();
    assert_eq!(all.last().unwrap(), &decision("d1", 39));
    assert!(all.windows(2).all(|w| w[0].at < w[1].at));
    // A new writer (a restarted agent) appends to the current file.
    let before = all.len();
    let mut w = Writer::new(dir.path(), &cfg);
    w.append(&decision("d1", 40)).unwrap();
    let again = read(dir.path(), &Filter::default()).unwrap();
    assert!(again.len() == before + 1 || again.last() == Some(&decision("d1", 40)));
}

#[test]
fn reading_filters_by_time_and_group_and_skips_torn_lines() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::new(dir.path(), &HistoryConfig::default());
    for i in 0..10 {
        w.append(&decision(if i % 2 == 0 { "d1" } else { "d2" }, i))
            .unwrap();
    }
    let breaker = Record {
        at: t0() + Duration::minutes(20),
        event: Event::Decision(Decision {
            decision: DecisionKind::BreakerOpen,
            district: "_all".into(),
            profile: "_all".into(),
            op: None,
            node: None,
            reason: "r".into(),
            handler: None,
            stats: None,
            dry_run: false,
            epoch: 0,
        }),
    };
    w.append(&breaker).unwrap();
    drop(w);
    // A torn last line (killed mid-write) is skipped.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(writer::path_of(dir.path(), 0))
        .unwrap();
    f.write_all(b"{\"at\":\"2023-").unwrap();
    let d2 = Filter {
        group: Some(GroupKey {
            district: "d2".into(),
            profile: "small".into(),
        }),
        ..Default::default()
    };
    let got = read(dir.path(), &d2).unwrap();
    assert_eq!(got.len(), 6, "5 of d2 and the fleet-wide breaker");
    let recent = Filter {
        since: Some(t0() + Duration::minutes(8)),
        limit: Some(2),
        ..Default::default()
    };
    let got = read(dir.path(), &recent).unwrap();
    assert_eq!(got, vec![decision("d2", 9), breaker]);
    assert!(
        read(&dir.path().join("none"), &Filter::default())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn only_explanations_that_changed_meaning_pass() {
    let mut f = ExplanationFilter::default();
    assert!(f.changed(&explanation(Outcome::Held, false, "for 1m")));
    // Same verdicts, other durations: nothing new.
    assert!(!f.changed(&explanation(Outcome::Held, false, "for 2m")));
    assert!(f.changed(&explanation(Outcome::Held, true, "for 10m")));
    assert!(f.changed(&explanation(Outcome::ScaleDown, true, "for 10m")));
    let mut other = explanation(Outcome::ScaleDown, true, "x");
    other.district = "d2".into();
    assert!(f.changed(&other));
}
