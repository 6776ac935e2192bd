use std::time::Duration;

use serde::Deserialize;

use super::*;
use crate::config::Invalid;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Conf {
    n: u32,
    log: LogSection,
}

impl Validate for Conf {
    fn validate(&self) -> Result<(), Invalid> {
        if self.n > 10 {
            return Err(Invalid::new("n", "must be at most 10"));
        }
        Ok(())
    }
}

impl ServiceConfig for Conf {
    const ENV_PREFIX: &'static str = "GEARSHIFT_BOOTSTRAP_TEST";

    fn log(&self) -> &LogSection {
        &self.log
    }
}

#[test]
fn failures_carry_their_exit_code_and_causes() {
    let io = std::io::Error::other("disk on fire");
    let f = Failure::runtime(io);
    assert_eq!(f.code(), EXIT_FAILURE);
    assert_eq!(f.to_string(), "disk on fire");
    let f = Failure::config(crate::config::ConfigError::Invalid {
        path: "a.toml".into(),
        key: "n".into(),
        reason: "too big".into(),
    });
    assert_eq!(f.code(), EXIT_CONFIG);
    assert!(f.to_string().contains("key `n`: too big"), "{f}");
    assert_eq!(
        EXIT_CONFIG, 2,
        "documented in the README and both binaries' help"
    );
}

#[test]
fn a_bad_file_is_a_configuration_failure() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "n = 11\n").unwrap();
    let e = check_config::<Conf>(&p, |_| Ok(vec![])).unwrap_err();
    assert_eq!(e.code(), EXIT_CONFIG);
    assert!(e.to_string().contains("n") && e.to_string().contains("at most 10"));
    std::fs::write(&p, "m = 1\n").unwrap();
    assert_eq!(load::<Conf>(&p).unwrap_err().code(), EXIT_CONFIG);
    std::fs::write(&p, "n = 3\n").unwrap();
    assert!(check_config::<Conf>(&p, |c| Ok(vec![format!("n is {}", c.n)])).is_ok());
}

#[tokio::test]
async fn reload_keeps_the_running_configuration_when_the_new_one_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "n = 1\n").unwrap();
    let (service, cfg) = Service::<Conf>::start(&p, None).unwrap();
    assert_eq!(cfg.n, 1);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    service.on_reload(move |c: Conf| {
        if c.n == 7 {
            return Err("seven is refused by the agent".into());
        }
        tx.send(c.n).map_err(|e| e.to_string())
    });
    let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<u32>| {
        let r = rx.try_recv();
        async move { r }
    };
    for (text, applied) in [
        ("n = 99\n", None),
        ("n = \n", None),
        ("n = 7\n", None),
        ("n = 2\n", Some(2)),
    ] {
        std::fs::write(&p, text).unwrap();
        service.request_reload();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(next(&mut rx).await.ok(), applied, "{text:?}");
    }
    assert!(
        service.stop(Duration::from_secs(5)).await,
        "every task ends"
    );
}

#[tokio::test]
async fn stop_drains_every_tracked_task_within_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "").unwrap();
    let (service, _) = Service::<Conf>::start(&p, None).unwrap();
    let token = service.token().clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    service.spawn(async move {
        token.cancelled().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        d.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    service.spawn(std::future::pending::<()>());
    assert!(
        !service.stop(Duration::from_millis(300)).await,
        "a task that never ends"
    );
    assert!(
        done.load(std::sync::atomic::Ordering::SeqCst),
        "in-flight work finished"
    );
}
