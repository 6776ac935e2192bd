//! The `log` handler: a dry run. It logs what it would ask of the cloud and
//! reports success, so that a new installation can watch gearshift's
//! decisions before letting it act.

use async_trait::async_trait;

use super::{CreateOutcome, CreateRequest, Handler, HandlerError, RemoveOutcome, RemoveRequest};

/// Logs every request; changes nothing.
#[derive(Debug, Default, Clone)]
pub struct LogHandler;

#[async_trait]
impl Handler for LogHandler {
    fn kind(&self) -> &'static str {
        "log"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        tracing::info!(
            op = %req.op,
            district = %req.group.district,
            profile = %req.group.profile,
            flavor = ?req.shape.flavor,
            attempt = req.attempt,
            "dry run: would run `event create-node --profile={} --district={}`",
            req.group.profile,
            req.group.district
        );
        Ok(CreateOutcome {
            node: None,
            cloud_id: None,
            detail: format!(
                "dry run (log handler): create-node --profile={} --district={}",
                req.group.profile, req.group.district
            ),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        tracing::info!(
            op = %req.op,
            node = %req.node,
            district = %req.group.district,
            "dry run: would run `event remove-node --host={} --district={}`",
            req.node,
            req.group.district
        );
        Ok(RemoveOutcome {
            detail: format!(
                "dry run (log handler): remove-node --host={} --district={}",
                req.node, req.group.district
            ),
            gone: false,
        })
    }
}
