//! Moves that copy, verify and delete, and their resumption after a crash.

use std::time::{Duration, Instant};

use super::files::*;
use super::*;

struct Fixture {
    _d: tempfile::TempDir,
    base: PathBuf,
    rt: DirRuntime,
}

fn fixture() -> Fixture {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().to_path_buf();
    for n in ["n1", "n2"] {
        fs::create_dir_all(base.join(n)).unwrap();
    }
    let rt = DirRuntime::new(
        &DirSection {
            root: base.join("n1"),
            target_root: format!("{}/{{target}}", base.display()),
            ..DirSection::default()
        },
        NodeFacts {
            profile: "small".into(),
            max_active_gears: 10,
            district: None,
        },
    )
    .unwrap();
    Fixture { _d: d, base, rt }
}

fn make_gear(dir: &Path, seed: u8) {
    fs::create_dir_all(dir.join("app-root/data")).unwrap();
    fs::write(dir.join("app-root/data/blob"), vec![seed; 300_000]).unwrap();
    fs::write(dir.join("README"), format!("gear {seed}")).unwrap();
    fs::write(dir.join(".state"), "idle").unwrap();
    std::os::unix::fs::symlink("app-root/data/blob", dir.join("link")).unwrap();
}

#[tokio::test]
async fn move_copies_verifies_and_deletes() {
    let f = fixture();
    make_gear(&f.base.join("n1/g1"), 7);
    let before = manifest(&f.base.join("n1/g1"), &CancellationToken::new()).unwrap();
    let inv = f.rt.inventory().await.unwrap();
    assert_eq!(inv.gears.len(), 1);
    assert_eq!(inv.gears[0].state, GearState::Idle);
    let out =
        f.rt.move_gear("g1", "n2", &MoveCtx::default())
            .await
            .unwrap();
    assert_eq!(out, MoveOutcome::Moved);
    assert!(!f.base.join("n1/g1").exists());
    let after = manifest(&f.base.join("n2/g1"), &CancellationToken::new()).unwrap();
    assert_eq!(before, after);
    assert_eq!(
        fs::read_link(f.base.join("n2/g1/link")).unwrap(),
        PathBuf::from("app-root/data/blob")
    );
    // Again: already there, nothing copied.
    assert_eq!(
        f.rt.move_gear("g1", "n2", &MoveCtx::default())
            .await
            .unwrap(),
        MoveOutcome::AlreadyMoved
    );
    assert_eq!(
        f.rt.move_gear("nope", "n2", &MoveCtx::default())
            .await
            .unwrap(),
        MoveOutcome::Missing
    );
    assert!(matches!(
        f.rt.move_gear("g1", "n9", &MoveCtx::default()).await,
        Err(RuntimeError::UnknownTarget(_))
    ));
}

#[tokio::test]
async fn half_done_moves_are_completed_not_duplicated() {
    let f = fixture();
    // Crash during the copy: a partial .incoming copy is discarded.
    make_gear(&f.base.join("n1/g1"), 1);
    fs::create_dir_all(f.base.join("n2/.incoming-g1/app-root")).unwrap();
    fs::write(f.base.join("n2/.incoming-g1/README"), "partial").unwrap();
    assert_eq!(
        f.rt.move_gear("g1", "n2", &MoveCtx::default())
            .await
            .unwrap(),
        MoveOutcome::Moved
    );
    assert!(!f.base.join("n2/.incoming-g1").exists());
    assert_eq!(
        fs::read_to_string(f.base.join("n2/g1/README")).unwrap(),
        "gear 1"
    );

    // Crash after the rename into place, before the source was deleted.
    make_gear(&f.base.join("n1/g2"), 2);
    make_gear(&f.base.join("n2/g2"), 2);
    assert_eq!(
        f.rt.move_gear("g2", "n2", &MoveCtx::default())
            .await
            .unwrap(),
        MoveOutcome::Moved
    );
    assert!(!f.base.join("n1/g2").exists());

    // Crash while deleting the source.
    make_gear(&f.base.join("n1/.removing-g3"), 3);
    make_gear(&f.base.join("n2/g3"), 3);
    assert_eq!(
        f.rt.move_gear("g3", "n2", &MoveCtx::default())
            .await
            .unwrap(),
        MoveOutcome::AlreadyMoved
    );
    assert!(!f.base.join("n1/.removing-g3").exists());

    // A different gear of the same id at the target is a conflict; nothing is deleted.
    make_gear(&f.base.join("n1/g4"), 4);
    make_gear(&f.base.join("n2/g4"), 5);
    let e =
        f.rt.move_gear("g4", "n2", &MoveCtx::default())
            .await
            .unwrap_err();
    assert!(matches!(e, RuntimeError::Conflict { .. }));
    assert!(!e.is_retryable());
    assert!(f.base.join("n1/g4").exists());

    // Listing ignores work-in-progress directories.
    fs::create_dir_all(f.base.join("n1/.removing-g9")).unwrap();
    let inv = f.rt.inventory().await.unwrap();
    let ids: Vec<_> = inv.gears.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(ids, ["g4"]);
}

#[test]
fn cancellation_leaves_the_source_intact_and_the_next_attempt_finishes() {
    let f = fixture();
    make_gear(&f.base.join("n1/g1"), 9);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let e = f.rt.move_blocking("g1", "n2", &cancel).unwrap_err();
    assert_eq!(e, RuntimeError::Interrupted);
    assert!(f.base.join("n1/g1/README").exists());
    assert!(!f.base.join("n2/g1").exists());
    let out =
        f.rt.move_blocking("g1", "n2", &CancellationToken::new())
            .unwrap();
    assert_eq!(out, MoveOutcome::Moved);
}

#[test]
fn verify_detects_every_difference() {
    let mk = |entries: &[(&str, Entry)]| -> Manifest {
        entries
            .iter()
            .map(|(p, e)| (PathBuf::from(p), e.clone()))
            .collect()
    };
    let file = |s: &str| Entry::File {
        size: 1,
        sha256: s.into(),
    };
    let a = mk(&[("a", file("x")), ("d", Entry::Dir)]);
    assert!(verify("g", &a, &a).is_ok());
    assert!(verify("g", &a, &mk(&[("a", file("y")), ("d", Entry::Dir)])).is_err());
    assert!(verify("g", &a, &mk(&[("a", file("x"))])).is_err());
    assert!(
        verify(
            "g",
            &a,
            &mk(&[("a", file("x")), ("d", Entry::Dir), ("e", Entry::Dir)])
        )
        .is_err()
    );
}

#[test]
fn throttle_limits_bandwidth() {
    let mut t = Throttle::new(1_000_000);
    let start = Instant::now();
    t.account(200_000);
    assert!(start.elapsed() >= Duration::from_millis(190));
}

#[test]
fn a_file_is_read_with_a_buffer_its_size() {
    assert_eq!(buffer_for(0).len(), 4096);
    assert_eq!(buffer_for(10_000).len(), 10_001);
    assert_eq!(buffer_for(300_000).len(), CHUNK);
    assert_eq!(buffer_for(u64::MAX).len(), CHUNK);
    // A file longer than it was when its length was taken is read whole.
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("grown");
    fs::write(&path, vec![3u8; 50_000]).unwrap();
    let mut f = fs::File::open(&path).unwrap();
    let mut seen = 0;
    let (size, sha) = read_hashing(&mut f, 10, &path, &CancellationToken::new(), |c| {
        seen += c.len();
        Ok(())
    })
    .unwrap();
    assert_eq!((size, seen), (50_000, 50_000));
    assert_eq!(sha, hash_file(&path, &CancellationToken::new()).unwrap().1);
}
