//! Fleet figures against a full scan, and the `oo-stats` formulas.

use super::*;
use gearshift_proto::msg::{DistrictInfo, GearCounts};

pub fn report(
    node: &str,
    district: Option<&str>,
    profile: &str,
    max: u32,
    started: u32,
    idle: u32,
) -> NodeReport {
    NodeReport {
        node: node.into(),
        seq: 1,
        profile: profile.into(),
        district: district.map(|d| DistrictInfo {
            uuid: d.into(),
            active: true,
            first_uid: Some(1000),
            max_uid: Some(1999),
        }),
        max_active_gears: max,
        gears: GearCounts {
            started,
            idle,
            ..Default::default()
        },
        active: true,
        region: None,
        zone: None,
        mem_free_mb: 0,
        mem_total_mb: 0,
        started_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        booted_at: None,
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 10,
        agent_version: "t".into(),
    }
}

fn t(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
}

#[test]
fn oo_stats_figures() {
    let mut f = Fleet::new();
    // n1: 60 active of 100; n2: 90 active (+10 idle) of 100; n3 inactive 5 active.
    f.accept(report("n1", Some("d1"), "small", 100, 60, 0), t(0))
        .unwrap();
    f.accept(report("n2", Some("d1"), "small", 100, 90, 10), t(0))
        .unwrap();
    let mut r3 = report("n3", Some("d1"), "small", 100, 5, 0);
    r3.active = false;
    f.accept(r3, t(0)).unwrap();
    let g = GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    };
    let s = f.group_stats(&g, t(5), 3, &|_| false);
    assert_eq!(s.nodes_active, 2);
    assert_eq!(s.nodes_inactive, 1);
    assert_eq!(s.gears_active, 155);
    assert_eq!(s.gears_total, 165);
    // available = (100-60) + (100-90) = 50; inactive node gives none.
    assert_eq!(s.available_active_gears, 50);
    // usage = 100 * 155 / (50 + 155) = 75.6
    assert_eq!(s.usage_pct, 75.6);
    // district capacity 1000 UIDs, 165 used.
    assert_eq!(s.district_free_uids, Some(835));
    assert_eq!(s.effective_available_gears, 50);
}

#[test]
fn effective_is_capped_by_free_uids() {
    let mut f = Fleet::new();
    let mut r = report("n1", Some("d1"), "small", 2000, 10, 980);
    r.district.as_mut().unwrap().max_uid = Some(1999);
    f.accept(r, t(0)).unwrap();
    let g = GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    };
    let s = f.group_stats(&g, t(0), 3, &|_| false);
    assert_eq!(s.available_active_gears, 1990);
    assert_eq!(s.district_free_uids, Some(10));
    assert_eq!(s.effective_available_gears, 10);
}

#[test]
fn stale_seq_is_refused_and_missing_nodes_counted() {
    let mut f = Fleet::new();
    let mut r = report("n1", None, "small", 100, 1, 0);
    r.seq = 10;
    f.accept(r.clone(), t(0)).unwrap();
    r.seq = 10;
    assert_eq!(
        f.accept(r.clone(), t(1)).unwrap_err(),
        ReportRejected::StaleSeq { last: 10, got: 10 }
    );
    r.seq = 9;
    assert!(f.accept(r.clone(), t(1)).is_err());
    let g = GroupKey {
        district: NO_DISTRICT.into(),
        profile: "small".into(),
    };
    // interval 10 s x 3 = 30 s.
    assert_eq!(f.group_stats(&g, t(30), 3, &|_| false).nodes_missing, 0);
    let s = f.group_stats(&g, t(31), 3, &|_| false);
    assert_eq!((s.nodes_missing, s.nodes_active), (1, 0));
    assert_eq!(s.district_free_uids, None);
    assert_eq!(f.staleness(t(31), 3, &BTreeSet::new()), (1, 1));
    // A node being removed counts neither as known nor as missing.
    let removing = BTreeSet::from(["n1".to_string()]);
    assert_eq!(f.staleness(t(31), 3, &removing), (0, 0));
    assert_eq!(
        f.long_missing(t(100), Duration::seconds(60)),
        vec!["n1".to_string()]
    );
}

#[test]
fn profile_sums_districts() {
    let mut f = Fleet::new();
    f.accept(report("a", Some("d1"), "small", 100, 50, 0), t(0))
        .unwrap();
    f.accept(report("b", Some("d2"), "small", 100, 100, 0), t(0))
        .unwrap();
    f.accept(report("c", Some("d3"), "large", 10, 1, 0), t(0))
        .unwrap();
    let p = f.profile_stats("small", t(0), 3, &|_| false);
    assert_eq!(p.gears_active, 150);
    assert_eq!(p.available_active_gears, 50);
    assert_eq!(p.usage_pct, 75.0);
    assert_eq!(f.profiles(), vec!["large".to_string(), "small".to_string()]);
}

#[test]
fn a_district_shared_by_two_profiles_updates_both_totals() {
    // A report of a "small" node uses UIDs of d1, which also caps the
    // "large" group of d1: the large total must follow.
    let mut f = Fleet::new();
    let mut a = report("a", Some("d1"), "small", 2000, 10, 0);
    f.accept(a.clone(), t(0)).unwrap();
    f.accept(report("b", Some("d1"), "large", 2000, 10, 0), t(0))
        .unwrap();
    let none = BTreeSet::new();
    let before = f.profile_stats_without("large", t(1), 3, &none);
    assert_eq!(before.effective_available_gears, 980);
    a.seq = 2;
    a.gears.started = 900;
    f.accept(a, t(2)).unwrap();
    let after = f.profile_stats_without("large", t(3), 3, &none);
    assert_eq!(after, f.profile_stats("large", t(3), 3, &|_| false));
    assert_eq!(after.effective_available_gears, 90);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Any sequence of reports (moving between groups and districts,
    /// changing gears and activity), forgets and clock steps (sometimes
    /// backwards): the running totals equal a full scan at every step.
    #[test]
    fn running_totals_match_a_full_scan(
        steps in proptest::collection::vec(
            (0u8..6, 0usize..12, 0usize..4, 0usize..2, 0u32..120, 0i64..25),
            1..120,
        )
    ) {
        let mut f = Fleet::new();
        let mut now = 0i64;
        let mut seq = 0u64;
        let excl: BTreeSet<String> = ["n1", "n7"].iter().map(|s| s.to_string()).collect();
        for (op, node, d, p, gears, dt) in steps {
            let name = format!("n{node}");
            match op {
                0 => f.forget(&name).map(|_| ()).unwrap_or(()),
                1 => now = (now - dt).max(0),
                _ => {
                    now += dt;
                    seq += 1;
                    let district = ["d1", "d2", "d3"].get(d).copied();
                    let max = 100 + gears % 3 * 10;
                    let mut r = report(&name, district, ["small", "large"][p], max, gears, gears % 7);
                    r.seq = seq;
                    r.active = gears % 5 != 0;
                    f.accept(r, t(now)).unwrap();
                }
            }
            // Asked at the step's instant: the clock goes forward
            // between steps except for a backward step.
            for g in f.groups() {
                let scan = f.in_group(&g).map(|e| e.report.max_active_gears).max();
                proptest::prop_assert_eq!(f.group_max_active(&g, t(now), 3), scan);
                proptest::prop_assert_eq!(f.group_len(&g), f.in_group(&g).count());
            }
            for p in f.profiles() {
                for ex in [&BTreeSet::new(), &excl] {
                    let full = f.profile_stats(&p, t(now), 3, &|n| ex.contains(n));
                    proptest::prop_assert_eq!(
                        f.profile_stats_without(&p, t(now), 3, ex),
                        full
                    );
                }
            }
        }
    }
}

#[test]
fn remembered_sums_match_a_full_scan() {
    // Nodes in three groups reporting at different times; figures asked at
    // times around each node's stale instant, with and without
    // exclusions, after reports, moves between groups and forgets.
    let mut f = Fleet::new();
    let mut seq = 0u64;
    let mut rep = |f: &mut Fleet, node: &str, d: &str, p: &str, started: u32, at: i64| {
        seq += 1;
        let mut r = report(node, Some(d), p, 100, started, 3);
        r.seq = seq;
        r.active = started % 7 != 0;
        f.accept(r, t(at)).unwrap();
    };
    for i in 0..30 {
        let d = ["d1", "d2", "d3"][i % 3];
        let p = if i % 4 == 0 { "large" } else { "small" };
        rep(
            &mut f,
            &format!("n{i}"),
            d,
            p,
            (i * 3) as u32 % 100,
            i as i64,
        );
    }
    let check = |f: &Fleet, now: i64, excl: &BTreeSet<String>| {
        for g in f.groups() {
            let full = f.group_stats(&g, t(now), 3, &|n| excl.contains(n));
            assert_eq!(
                f.group_stats_without(&g, t(now), 3, excl),
                full,
                "{g:?} at {now}"
            );
        }
        for p in f.profiles() {
            let full = f.profile_stats(&p, t(now), 3, &|n| excl.contains(n));
            assert_eq!(
                f.profile_stats_without(&p, t(now), 3, excl),
                full,
                "{p} at {now}"
            );
        }
    };
    let none = BTreeSet::new();
    let some: BTreeSet<String> = ["n4", "n5", "n29", "gone"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // interval 10 s x 3: node i is stale after t(i + 30).
    for now in [0, 5, 29, 30, 31, 35, 45, 59, 60, 61, 100, 40, 20] {
        check(&f, now, &none);
        check(&f, now, &some);
    }
    // Reports in the same group update the remembered sums in place.
    for (k, (i, now)) in [(0usize, 40i64), (1, 41), (0, 42), (5, 43)]
        .into_iter()
        .enumerate()
    {
        check(&f, now, &some);
        let (d, p) = (
            ["d1", "d2", "d3"][i % 3],
            if i % 4 == 0 { "large" } else { "small" },
        );
        rep(&mut f, &format!("n{i}"), d, p, 11 * (k as u32 + 1), now);
        check(&f, now, &none);
        check(&f, now, &some);
        check(&f, now + 31, &some);
    }
    rep(&mut f, "n4", "d3", "small", 99, 50);
    rep(&mut f, "n7", "d1", "large", 10, 51);
    f.forget("n9");
    for now in [50, 51, 55, 80, 81, 82] {
        check(&f, now, &none);
        check(&f, now, &some);
    }
    assert_eq!(f.district_uids("d3"), {
        let mut fresh = f.clone();
        fresh.forget("nobody");
        fresh.district_uids("d3")
    });
}

#[test]
fn news_is_a_change_or_a_return_not_a_keepalive() {
    let mut f = Fleet::new();
    let mut r = report("n1", Some("d1"), "small", 100, 10, 2);
    r.interval_secs = 10;
    assert!(f.is_news(&r, t(0), 3), "a new node");
    f.accept(r.clone(), t(0)).unwrap();
    let mut next = r.clone();
    next.seq = 2;
    next.mem_free_mb = 123;
    assert!(!f.is_news(&next, t(10), 3), "same figures: a keep-alive");
    assert!(f.is_news(&next, t(31), 3), "a missing node that returns");
    next.gears.started = 11;
    assert!(f.is_news(&next, t(10), 3), "figures");
    let mut other = r.clone();
    other.active = false;
    assert!(f.is_news(&other, t(10), 3), "activity");
}
