//! `kind = "openshift"`: OpenShift v2's broker-host tools, run from the
//! `[paas]` templates.

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::names::{Placeholder, Values};
use super::{Operation, Outcome, PaasAdapter, PaasConfig, PaasError, PaasKind, Runner, parse};

/// Runs `oo-admin-ctl-district` and `oo-admin-move` (or what the templates
/// name instead), at most `max_parallel_moves` moves at once.
#[derive(Debug)]
pub struct OpenShiftAdapter {
    cfg: PaasConfig,
    runner: Runner,
    moves: Semaphore,
}

impl OpenShiftAdapter {
    /// An adapter for a checked `[paas]` section.
    pub fn new(cfg: &PaasConfig) -> OpenShiftAdapter {
        OpenShiftAdapter {
            runner: Runner {
                path: cfg.path.clone(),
                env: cfg.env.clone().into_iter().collect(),
                max_output: cfg.max_output_bytes,
                kill_grace: cfg.kill_grace,
            },
            moves: Semaphore::new(cfg.max_parallel_moves.max(1) as usize),
            cfg: cfg.clone(),
        }
    }

    /// Runs `op` with `values` and reads its answer.
    async fn call(&self, op: Operation, values: Values) -> Result<Outcome, PaasError> {
        let argv = self.cfg.template(op).render(&values)?;
        let ran = self.runner.run(&argv, self.cfg.timeout_of(op)).await?;
        let outcome = if ran.timed_out {
            Outcome::TimedOut
        } else if op == Operation::MoveGear {
            parse::moves::parse(values.get(Placeholder::Gear).unwrap_or_default(), &ran.exit)
        } else {
            parse::ctl::parse(
                op,
                values.get(Placeholder::Host).unwrap_or_default(),
                &ran.exit,
            )
        };
        let command = argv.join(" ");
        let ms = ran.elapsed.as_millis() as u64;
        if outcome.is_success() {
            tracing::info!(%op, %command, ms, outcome = outcome.label(), "paas command");
        } else {
            tracing::warn!(
                %op, %command, ms,
                exit = ?ran.exit.code, signal = ?ran.exit.signal,
                stdout = %ran.exit.stdout.trim(), stderr = %ran.exit.stderr.trim(),
                %outcome, "paas command did not succeed"
            );
        }
        Ok(outcome)
    }

    fn node(district: &str, host: &str) -> Result<Values, PaasError> {
        Values::new()
            .with(Placeholder::District, district)?
            .with(Placeholder::Host, host)
    }
}

#[async_trait]
impl PaasAdapter for OpenShiftAdapter {
    fn kind(&self) -> PaasKind {
        PaasKind::OpenShift
    }

    async fn deactivate(&self, district: &str, host: &str) -> Result<Outcome, PaasError> {
        self.call(Operation::Deactivate, Self::node(district, host)?)
            .await
    }

    async fn activate(&self, district: &str, host: &str) -> Result<Outcome, PaasError> {
        self.call(Operation::Activate, Self::node(district, host)?)
            .await
    }

    async fn add_node(
        &self,
        district: &str,
        host: &str,
        profile: &str,
    ) -> Result<Outcome, PaasError> {
        let values = Self::node(district, host)?.with(Placeholder::Profile, profile)?;
        self.call(Operation::AddNode, values).await
    }

    async fn remove_node(&self, district: &str, host: &str) -> Result<Outcome, PaasError> {
        self.call(Operation::RemoveNode, Self::node(district, host)?)
            .await
    }

    async fn move_gear(&self, gear: &str, target: &str) -> Result<Outcome, PaasError> {
        let values = Values::new()
            .with(Placeholder::Gear, gear)?
            .with(Placeholder::Target, target)?;
        // Closed never: the semaphore lives as long as the adapter.
        let _slot = self.moves.acquire().await;
        self.call(Operation::MoveGear, values).await
    }
}
