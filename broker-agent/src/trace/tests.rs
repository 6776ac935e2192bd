use super::*;
use crate::core::testkit::{rep, t0};

fn line(node: &str, secs: i64) -> String {
    let t = TraceLine {
        at: t0() + chrono::Duration::seconds(secs),
        report: rep(node, "d1", "small", 10, 4, 1),
    };
    serde_json::to_string(&t).unwrap()
}

#[test]
fn reads_lines_in_order_and_skips_blank_ones() {
    let text = format!("{}\n\n{}\n", line("n1", 0), line("n2", 5));
    let t = read(text.as_bytes(), 10).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[1].report.node, "n2");
    assert_eq!(t[1].at, t0() + chrono::Duration::seconds(5));
    // The last line may lack its newline.
    let t = read(line("n3", 1).as_bytes(), 10).unwrap();
    assert_eq!(t[0].report.gears.started, 4);
}

#[test]
fn a_malformed_line_is_refused_with_its_number() {
    let text = format!("{}\n{{\"at\":\"yesterday\"}}\n", line("n1", 0));
    match read(text.as_bytes(), 10) {
        Err(TraceError::Line { line: 2, reason }) => assert!(reason.contains("at"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let text = format!("{}\n{}\nnot json\n", line("n1", 0), line("n1", 1));
    let e = read(text.as_bytes(), 10).unwrap_err();
    assert!(e.to_string().starts_with("line 3:"), "{e}");
    // Unknown fields are refused, not ignored.
    let extra = line("n1", 0).replacen('{', "{\"x\":1,", 1);
    assert!(matches!(
        read(extra.as_bytes(), 10),
        Err(TraceError::Line { line: 1, .. })
    ));
}

#[test]
fn overlong_lines_and_overlong_traces_are_refused() {
    let long = format!("{}\n{}\n", line("n1", 0), "x".repeat(MAX_LINE + 10));
    match read(long.as_bytes(), 10) {
        Err(TraceError::Line { line: 2, reason }) => assert!(reason.contains("longer")),
        other => panic!("{other:?}"),
    }
    let three = format!("{}\n{}\n{}\n", line("a", 0), line("b", 1), line("c", 2));
    assert!(matches!(
        read(three.as_bytes(), 2),
        Err(TraceError::TooLong(2))
    ));
    assert_eq!(read(three.as_bytes(), 3).unwrap().len(), 3);
}

#[test]
fn the_recorder_appends_readable_lines_and_stops_at_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TraceConfig {
        record: true,
        path: None,
        max_bytes: 64 * 1024,
    };
    let mut r = Recorder::open(&cfg, dir.path()).expect("recording");
    let report = rep("n1", "d1", "small", 10, 4, 1);
    for i in 0..1000 {
        r.record(t0() + chrono::Duration::seconds(i), &report);
    }
    r.flush();
    let size = std::fs::metadata(dir.path().join("trace.jsonl"))
        .unwrap()
        .len();
    assert!(size <= 64 * 1024 && size == r.written(), "{size}");
    let t = read_file(&dir.path().join("trace.jsonl"), 10_000).unwrap();
    assert!(t.len() > 10 && t.len() < 1000, "{}", t.len());
    assert_eq!(t[3].at, t0() + chrono::Duration::seconds(3));
    assert_eq!(t[3].report, report);
    // Off by default.
    assert!(Recorder::open(&TraceConfig::default(), dir.path()).is_none());
}
