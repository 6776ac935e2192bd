//! SIGHUP, meant: the new file's handlers, placement engine, trusted keys
//! and metrics listener are all built beside the running ones, and swapped
//! in only when every one of them could be built; a change to a key that
//! only applies at start refuses the whole reload, naming the key. Either
//! way the outcome is logged, counted (`config_reloads`) and shown in the
//! status; operations in flight carry on under the new settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use gearshift_handlers::Handler;
use gearshift_proto::Keyring;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Agent, RunState};
use crate::config::BrokerConfig;
use crate::core::Core;
use crate::planner::{EvacuationPlanner, PlacementPlanner};
use crate::status::ReloadStatus;

/// A new configuration for the loop, and where its answer goes.
pub(super) struct ReloadRequest {
    cfg: BrokerConfig,
    reply: oneshot::Sender<Result<(), String>>,
}

/// Hands new configurations to a running [`Agent`] and waits for its
/// answer (what `gearshift-broker run` does on SIGHUP).
#[derive(Debug, Clone)]
pub struct Reloader(pub(super) mpsc::Sender<ReloadRequest>);

impl Reloader {
    /// Asks the agent to run `cfg`; `Err` says why it keeps the running one.
    pub async fn reload(&self, cfg: BrokerConfig) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.0
            .send(ReloadRequest { cfg, reply })
            .await
            .map_err(|_| "the agent has stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the agent stopped before answering".to_string())?
    }
}

/// Why a reload was refused.
#[derive(Debug, Error)]
enum Refused {
    #[error("{}", gearshift_service::reload::restart_message(.0))]
    Restart(Vec<String>),
    #[error("{0}")]
    Build(String),
}

/// What the new file builds, before anything is swapped.
struct Rebuilt {
    cfg: Arc<BrokerConfig>,
    keyring: Arc<Keyring>,
    handlers: Arc<BTreeMap<String, Arc<dyn Handler>>>,
    engine: gearshift_placement::Engine,
}

impl Agent {
    /// Takes a new configuration, or refuses it whole; answers the sender.
    pub(super) async fn on_reload(
        &mut self,
        core: &mut Core,
        st: &mut RunState,
        req: ReloadRequest,
        token: &CancellationToken,
    ) {
        let changed = gearshift_service::reload::changed_keys(&*self.cfg, &req.cfg);
        let res = self.try_reload(core, req.cfg, token).await;
        let (restart_keys, error) = match &res {
            Ok(()) => (vec![], None),
            Err(Refused::Restart(k)) => (k.clone(), Some(res_text(&res))),
            Err(Refused::Build(_)) => (vec![], Some(res_text(&res))),
        };
        if res.is_ok() {
            tracing::info!(changed = ?changed, "reload: new handlers, placement, keys and listener in place");
        } else {
            tracing::warn!(restart_keys = ?restart_keys, "reload: the running configuration stays");
        }
        self.metrics.reload(res.is_ok());
        st.reload = Some(ReloadStatus {
            at: Utc::now(),
            applied: res.is_ok(),
            error,
            restart_keys,
        });
        st.status_dirty = true;
        let _ = req.reply.send(res.map_err(|e| e.to_string()));
    }

    async fn try_reload(
        &mut self,
        core: &mut Core,
        new: BrokerConfig,
        token: &CancellationToken,
    ) -> Result<(), Refused> {
        let restart = self.cfg.restart_keys(&new);
        if !restart.is_empty() {
            return Err(Refused::Restart(restart));
        }
        let rebuilt = self.rebuild(new)?;
        // The last step that can fail: the new address is bound before the
        // old listener closes.
        let listen = rebuilt.cfg.metrics.listen;
        match self.listener.as_mut() {
            Some(l) => {
                let bound = l
                    .rebind(listen)
                    .await
                    .map_err(|e| Refused::Build(format!("metrics.listen {}: {e}", show(listen))))?;
                if listen != self.cfg.metrics.listen {
                    tracing::info!(bound = ?bound, "metrics and dashboard listener moved");
                }
            }
            None if listen != self.cfg.metrics.listen => {
                tracing::warn!("metrics.listen changed, but this agent serves no listener");
            }
            None => {}
        }
        self.commit(core, rebuilt, token);
        Ok(())
    }

    /// Builds the keyring, the handlers and the placement engine of `new`.
    fn rebuild(&self, new: BrokerConfig) -> Result<Rebuilt, Refused> {
        // Keys read from the configuration's files again; keys an embedding
        // program gave stay as they are.
        let keyring = match &self.key_source {
            Some(f) => Arc::new(super::build::with_own_key(
                f(&new).map_err(|e| Refused::Build(format!("keys: {e}")))?,
                &self.signer,
            )),
            None => self.keyring.clone(),
        };
        let ctx = self.handler_context(keyring.clone());
        let handlers = super::build::build_handlers(&new, self.registered.clone(), &ctx)
            .and_then(|h| super::build::check_handlers(&new, &h).map(|()| h))
            .map_err(|e| Refused::Build(e.to_string()))?;
        let engine = gearshift_placement::Engine::new(&new.placement)
            .map_err(|e| Refused::Build(format!("placement: {e}")))?;
        Ok(Rebuilt {
            cfg: Arc::new(new),
            keyring,
            handlers: Arc::new(handlers),
            engine,
        })
    }

    /// Swaps everything in; the placement service restarts with the new
    /// engine and keys.
    fn commit(&mut self, core: &mut Core, r: Rebuilt, token: &CancellationToken) {
        self.cfg = r.cfg.clone();
        self.keyring = r.keyring;
        self.handlers = r.handlers;
        self.engine = r.engine;
        if !self.custom_planner {
            let p: Arc<dyn EvacuationPlanner> =
                Arc::new(PlacementPlanner::new(self.engine.clone()));
            self.planner = p.clone();
            core.planner = p;
        }
        core.set_config(r.cfg);
        if let Some(old) = self.placement_stop.take() {
            old.cancel();
            self.spawn_placement(token.clone());
        }
    }
}

fn res_text(r: &Result<(), Refused>) -> String {
    r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
}

fn show(a: Option<std::net::SocketAddr>) -> String {
    a.map_or_else(|| "(none)".into(), |a| a.to_string())
}

/// The next reload request, or never when the agent takes none.
pub(super) async fn next_reload(
    rx: &mut Option<mpsc::Receiver<ReloadRequest>>,
) -> Option<ReloadRequest> {
    match rx.as_mut() {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::BrokerConfig;

    #[test]
    fn restart_keys_name_what_only_applies_at_start() {
        let old = BrokerConfig::default();
        let mut new = old.clone();
        new.policy.interval = std::time::Duration::from_secs(5);
        new.metrics.listen = Some("127.0.0.1:9999".parse().unwrap());
        new.keys.trust.clear();
        assert!(
            old.restart_keys(&new).is_empty(),
            "{:?}",
            old.restart_keys(&new)
        );
        new.bus.url = "amqp://elsewhere:5672/%2f".into();
        new.agent.name = "b2".into();
        new.keys.signing_key = "/tmp/other.key".into();
        assert_eq!(
            old.restart_keys(&new),
            vec!["agent.name", "bus.url", "keys.signing_key"]
        );
    }
}
