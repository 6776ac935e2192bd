//! systemd notifications: READY=1, STOPPING=1, STATUS= and the watchdog.
//! Every call is a no-op when the agent does not run under systemd.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Tells systemd the agent is ready (Type=notify).
pub fn ready(status: &str) {
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]);
}

/// Tells systemd the agent is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

/// Updates the status line `systemctl status` shows.
pub fn status(status: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(status)]);
}

/// The watchdog interval systemd asked for (`WatchdogSec=`), if any.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    Some(Duration::from_micros(usec))
}

/// Pets the watchdog at half its interval while `alive` says the agent's main
/// loop is healthy, until `token` is cancelled (a task of `tracker`).
pub fn spawn_watchdog(
    tracker: &TaskTracker,
    token: CancellationToken,
    alive: impl Fn() -> bool + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let every = watchdog_interval()? / 2;
    Some(tracker.spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if alive() {
                        let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                    } else {
                        tracing::warn!("main loop stalled: not petting the watchdog");
                    }
                }
                _ = token.cancelled() => break,
            }
        }
    }))
}
