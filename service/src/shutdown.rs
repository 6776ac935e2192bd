//! One shutdown tree: a [`CancellationToken`] every task watches and a
//! [`TaskTracker`] to wait for them, driven by SIGTERM/SIGINT; SIGHUP asks
//! for a configuration reload.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The agent's shutdown tree.
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Cancelled when the agent must stop.
    pub token: CancellationToken,
    /// Tracks every long-lived task.
    pub tracker: TaskTracker,
    reload: watch::Sender<u64>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A fresh tree, not yet wired to signals.
    pub fn new() -> Self {
        let (reload, _) = watch::channel(0);
        Shutdown {
            token: CancellationToken::new(),
            tracker: TaskTracker::new(),
            reload,
        }
    }

    /// Spawns a task (tracked) that cancels the tree on SIGTERM or SIGINT and
    /// bumps the reload counter on SIGHUP.
    pub fn listen_for_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let token = self.token.clone();
        let reload = self.reload.clone();
        self.tracker.spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); token.cancel(); break; }
                    _ = int.recv() => { tracing::info!("SIGINT: shutting down"); token.cancel(); break; }
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading configuration");
                        reload.send_modify(|n| *n += 1);
                    }
                    _ = token.cancelled() => break,
                }
            }
        });
        Ok(())
    }

    /// A receiver that changes on every SIGHUP.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reload.subscribe()
    }

    /// Requests a reload (as SIGHUP would).
    pub fn request_reload(&self) {
        self.reload.send_modify(|n| *n += 1);
    }

    /// Cancels the tree and waits up to `grace` for tracked tasks to end.
    /// Returns false when the grace period ran out first.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.token.cancel();
        self.tracker.close();
        tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
    }
}
