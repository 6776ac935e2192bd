//! One bootstrap for both agents' binaries: configuration (file, then
//! environment overrides, then checks, before any network access), exit
//! codes, `check-config` and `keygen`, logging, signals, SIGHUP reloads,
//! the bus's first connection, the metrics listener, `sd_notify`, and one
//! shutdown tree ([`CancellationToken`] + [`TaskTracker`]) that every task
//! of the binary is spawned on and that SIGTERM drains within the grace
//! period.
//!
//! ## Exit codes (both binaries)
//! - [`EXIT_OK`] `0`: success.
//! - [`EXIT_FAILURE`] `1`: a failure at run time (the bus, a listener, a
//!   cloud API, a key file that cannot be written).
//! - [`EXIT_CONFIG`] `2`: a bad configuration or usage, found before the
//!   agent does anything: a key that does not parse or fails its check, a
//!   key file the configuration names that cannot be read, a bad argument.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use gearshift_bus::{ConnectOptions, SharedBus};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Validate;
use crate::logging::LogFormat;
use crate::sections::LogSection;
use crate::shutdown::Shutdown;

/// Exit status of success.
pub const EXIT_OK: u8 = 0;
/// Exit status of a failure at run time.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a bad configuration or usage (both binaries).
pub const EXIT_CONFIG: u8 = 2;

/// Why a command failed, and so its exit status.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    error: Box<dyn Error + Send + Sync + 'static>,
}

impl Failure {
    /// A bad configuration or usage ([`EXIT_CONFIG`]).
    pub fn config(e: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        }
    }

    /// A failure at run time ([`EXIT_FAILURE`]).
    pub fn runtime(e: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        Failure {
            code: EXIT_FAILURE,
            error: e.into(),
        }
    }

    /// A failure with an exit status of its own (a subcommand's documented
    /// codes); `0` is taken as [`EXIT_FAILURE`].
    pub fn with_code(code: u8, e: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        Failure {
            code: if code == EXIT_OK { EXIT_FAILURE } else { code },
            error: e.into(),
        }
    }

    /// The exit status.
    pub fn code(&self) -> u8 {
        self.code
    }
}

impl fmt::Display for Failure {
    /// The error and its causes, `outer: inner: innermost`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        let mut source = self.error.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// The exit code of a command's result; a failure is printed on stderr as
/// `program: error`.
pub fn exit(program: &str, result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(f) => {
            eprintln!("{program}: {f}");
            ExitCode::from(f.code)
        }
    }
}

/// What the bootstrap reads of an agent's configuration.
pub trait ServiceConfig: DeserializeOwned + Validate + Clone + Send + Sync + 'static {
    /// Prefix of environment overrides (`GEARSHIFT_NODE`).
    const ENV_PREFIX: &'static str;

    /// `[log]`.
    fn log(&self) -> &LogSection;
}

/// Loads and checks the configuration at `path` (with its environment
/// overrides); a problem is a [`Failure::config`] naming the key.
pub fn load<C: ServiceConfig>(path: &Path) -> Result<C, Failure> {
    crate::config::load::<C>(path, C::ENV_PREFIX).map_err(Failure::config)
}

/// `check-config`: loads and checks `path` without touching the network,
/// then runs the agent's own `check` on it (loading every key file exactly
/// as `run` does: what `run` would refuse, `check-config` refuses), prints
/// the warnings it returns and `<path>: ok`.
pub fn check_config<C: ServiceConfig>(
    path: &Path,
    check: impl FnOnce(&C) -> Result<Vec<String>, Failure>,
) -> Result<(), Failure> {
    let cfg = load::<C>(path)?;
    for w in check(&cfg)? {
        eprintln!("warning: {w}");
    }
    println!("{}: ok", path.display());
    Ok(())
}

/// `keygen`: writes `<dir>/<name>.key` (mode 0600) and `<dir>/<name>.pub`,
/// never over an existing key unless `force`; `hint` says where the public
/// key goes.
pub fn keygen(dir: &Path, name: &str, force: bool, hint: &str) -> Result<(), Failure> {
    let (key, public, pair) =
        crate::keys::write_keypair(dir, name, force).map_err(Failure::runtime)?;
    println!("private key: {} (mode 0600)", key.display());
    println!("public key:  {}", public.display());
    println!("key id:      {}", pair.id());
    println!("{hint}");
    Ok(())
}

/// Runs `fut` on a new tokio runtime with `workers` threads (`None`: one
/// per core).
pub fn block_on<F>(workers: Option<usize>, fut: F) -> Result<(), Failure>
where
    F: Future<Output = Result<(), Failure>>,
{
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        b.worker_threads(n);
    }
    let rt = b
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    rt.block_on(fut)
}

/// A running agent's service plumbing: its configuration file, and the
/// shutdown tree every task is spawned on.
#[derive(Debug)]
pub struct Service<C> {
    path: PathBuf,
    shutdown: Shutdown,
    config: PhantomData<fn() -> C>,
}

impl<C: ServiceConfig> Service<C> {
    /// Loads and checks the configuration at `path`, starts logging
    /// (`log_format`, the command line's, before the file's) and listens
    /// for SIGTERM, SIGINT (stop) and SIGHUP (reload). Nothing touches the
    /// network yet.
    pub fn start(path: &Path, log_format: Option<LogFormat>) -> Result<(Self, C), Failure> {
        let cfg = load::<C>(path)?;
        cfg.log().init(log_format);
        let shutdown = Shutdown::new();
        shutdown
            .listen_for_signals()
            .map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
        let service = Service {
            path: path.to_path_buf(),
            shutdown,
            config: PhantomData,
        };
        Ok((service, cfg))
    }

    /// Cancelled when the agent must stop.
    pub fn token(&self) -> &CancellationToken {
        &self.shutdown.token
    }

    /// The tracker every task of the binary is spawned on. Hand it to
    /// components that spawn tasks of their own.
    pub fn tracker(&self) -> &TaskTracker {
        &self.shutdown.tracker
    }

    /// Spawns `fut` on the shutdown tree.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.shutdown.tracker.spawn(fut)
    }

    /// On every SIGHUP, loads and checks the file again and hands the new
    /// configuration to `apply`. A file that does not load, or that `apply`
    /// refuses, is logged and the running configuration is kept.
    pub fn on_reload<F>(&self, mut apply: F)
    where
        F: FnMut(C) -> Result<(), String> + Send + 'static,
    {
        let mut reloads = self.shutdown.reloads();
        let token = self.shutdown.token.clone();
        let path = self.path.clone();
        self.spawn(async move {
            loop {
                tokio::select! {
                    r = reloads.changed() => if r.is_err() { return },
                    _ = token.cancelled() => return,
                }
                let applied = crate::config::load::<C>(&path, C::ENV_PREFIX)
                    .map_err(|e| e.to_string())
                    .and_then(&mut apply);
                match applied {
                    Ok(()) => tracing::info!(path = %path.display(), "configuration reloaded"),
                    Err(e) => tracing::error!(error = %e,
                        "reload refused: keeping the running configuration"),
                }
            }
        });
    }

    /// Asks for a reload, as SIGHUP does.
    pub fn request_reload(&self) {
        self.shutdown.request_reload();
    }

    /// Connects to the bus, retrying with the reconnect backoff of `opts`
    /// until it answers; `None` when the agent is told to stop first.
    pub async fn connect_bus(&self, url: &str, opts: &ConnectOptions) -> Option<SharedBus> {
        let redacted = gearshift_bus::url::redact(url);
        crate::bus::connect_retrying(url, opts, self.token(), |e, wait| {
            tracing::warn!(url = %redacted, error = %e, wait = ?wait, "bus not reachable; retrying");
            crate::notify::status(&format!("waiting for the bus: {e}"));
        })
        .await
    }

    /// A bus that connects in the background from its first use on
    /// ([`crate::bus::LazyBus`]).
    pub fn lazy_bus(&self, url: String, opts: ConnectOptions) -> SharedBus {
        crate::bus::LazyBus::spawn(url, opts, self.token().clone(), self.tracker())
    }

    /// Serves `router` (`/metrics`, ...) on `addr` until the agent stops;
    /// returns the bound address.
    pub async fn serve(
        &self,
        addr: SocketAddr,
        router: axum::Router,
    ) -> Result<SocketAddr, Failure> {
        let (bound, _) = crate::http::serve_in(self.tracker(), addr, router, self.token().clone())
            .await
            .map_err(|e| Failure::runtime(format!("metrics.listen {addr}: {e}")))?;
        Ok(bound)
    }

    /// Tells systemd the agent is ready, and pets its watchdog while
    /// `alive` says the agent's main loop is healthy.
    pub fn ready(&self, status: &str, alive: impl Fn() -> bool + Send + 'static) {
        crate::notify::spawn_watchdog(self.tracker(), self.token().clone(), alive);
        crate::notify::ready(status);
    }

    /// Tells systemd the agent is stopping, cancels every task and waits up
    /// to `grace` for them to end. False when the grace period ran out.
    pub async fn stop(&self, grace: Duration) -> bool {
        crate::notify::stopping();
        let drained = self.shutdown.drain(grace).await;
        if !drained {
            tracing::warn!(
                ?grace,
                "grace period over: tasks still running are abandoned"
            );
        }
        drained
    }
}

#[cfg(test)]
mod tests;
