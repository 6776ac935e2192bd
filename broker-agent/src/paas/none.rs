//! `kind = "none"`: a fleet without OpenShift districts. Nothing runs and
//! every call is done, so the sagas run the same steps either way.

use async_trait::async_trait;

use super::{Outcome, PaasAdapter, PaasError, PaasKind};

/// Answers [`Outcome::Done`] to every call without running anything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoneAdapter;

#[async_trait]
impl PaasAdapter for NoneAdapter {
    fn kind(&self) -> PaasKind {
        PaasKind::None
    }

    async fn deactivate(&self, _: &str, _: &str) -> Result<Outcome, PaasError> {
        Ok(Outcome::Done)
    }

    async fn activate(&self, _: &str, _: &str) -> Result<Outcome, PaasError> {
        Ok(Outcome::Done)
    }

    async fn add_node(&self, _: &str, _: &str, _: &str) -> Result<Outcome, PaasError> {
        Ok(Outcome::Done)
    }

    async fn remove_node(&self, _: &str, _: &str) -> Result<Outcome, PaasError> {
        Ok(Outcome::Done)
    }

    async fn move_gear(&self, _: &str, _: &str) -> Result<Outcome, PaasError> {
        Ok(Outcome::Done)
    }
}
