//! The `magnum` handler: node hosts are the nodes of a Magnum cluster's
//! node group (seed 004's heterogeneity: one node group per gearshift node
//! group, each with its own flavor and zone).
//!
//! - add: `POST /v1/clusters/{cluster}/actions/resize` with
//!   `{"node_count": n + 1, "nodegroup": "<nodegroup>"}`;
//! - remove exactly this node: the same call with `node_count: n - 1` and
//!   `nodes_to_remove: ["<server id>"]` (its `cloud_id`, else the Nova
//!   server named after the host).
//!
//! Both wait until the node group has the new size and a `*_COMPLETE`
//! status. A cluster `*_IN_PROGRESS` is [`HandlerError::Busy`]; `*_FAILED`
//! (before or after) is refused with its reason, [`HandlerError::Quota`]
//! when the reason names a quota. A node group at its `max_node_count` is
//! [`HandlerError::Quota`] too: Magnum would refuse to grow it.

use async_trait::async_trait;
use gearshift_cloud::magnum::{Magnum, Resize, ensure_settled};
use gearshift_cloud::nova::Nova;

use crate::cloud::{resolve_server, to_handler_error};
use crate::config::MagnumConfig;
use crate::{
    BuildError, Capacity, CreateOutcome, CreateRequest, GroupKey, Handler, HandlerError, NodeShape,
    Presence, RemoveOutcome, RemoveRequest,
};

/// Resizes a Magnum node group.
#[derive(Debug)]
pub struct MagnumHandler {
    cfg: MagnumConfig,
    magnum: Magnum,
    nova: Nova,
}

/// The settled group's size and bounds.
struct Size {
    count: u32,
    min: u32,
    max: Option<u32>,
    name: String,
}

impl MagnumHandler {
    /// Reads the credentials; connects on first use.
    pub fn new(cfg: MagnumConfig) -> Result<Self, BuildError> {
        cfg.validate()?;
        let session = crate::cloud::session(&cfg.auth)?;
        Ok(Self::with_session(cfg, session))
    }

    /// A handler on an existing session.
    pub fn with_session(cfg: MagnumConfig, session: gearshift_cloud::Session) -> Self {
        MagnumHandler {
            magnum: Magnum::new(session.clone()),
            nova: Nova::new(session),
            cfg,
        }
    }

    async fn settled_size(&self) -> Result<Size, HandlerError> {
        let c = self
            .magnum
            .get_cluster(&self.cfg.cluster)
            .await
            .map_err(to_handler_error)?;
        ensure_settled(
            &c.status,
            c.status_reason.as_deref(),
            &format!("cluster {}", c.name),
        )
        .map_err(to_handler_error)?;
        match &self.cfg.nodegroup {
            Some(ng) => {
                let g = self
                    .magnum
                    .get_nodegroup(&self.cfg.cluster, ng)
                    .await
                    .map_err(to_handler_error)?;
                ensure_settled(
                    &g.status,
                    g.status_reason.as_deref(),
                    &format!("node group {}", g.name),
                )
                .map_err(to_handler_error)?;
                Ok(Size {
                    count: g.node_count,
                    min: g.min_node_count,
                    max: g.max_node_count,
                    name: g.name,
                })
            }
            None => Ok(Size {
                count: c.node_count,
                min: 1,
                max: None,
                name: "default worker group".into(),
            }),
        }
    }

    async fn resize(&self, req: Resize) -> Result<(), HandlerError> {
        self.magnum
            .resize(&self.cfg.cluster, &req)
            .await
            .map_err(to_handler_error)?;
        self.magnum
            .wait_resized(
                &self.cfg.cluster,
                self.cfg.nodegroup.as_deref(),
                req.node_count,
                self.cfg.resize_timeout,
                self.cfg.poll_interval,
            )
            .await
            .map_err(to_handler_error)
    }
}

#[async_trait]
impl Handler for MagnumHandler {
    fn kind(&self) -> &'static str {
        "magnum"
    }

    async fn create_node(&self, _req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let size = self.settled_size().await?;
        if size.max.is_some_and(|m| size.count >= m) {
            return Err(HandlerError::Quota(format!(
                "{} of cluster {} is at its max_node_count {}",
                size.name, self.cfg.cluster, size.count
            )));
        }
        let target = size.count + 1;
        self.resize(Resize {
            node_count: target,
            nodes_to_remove: Vec::new(),
            nodegroup: self.cfg.nodegroup.clone(),
        })
        .await?;
        Ok(CreateOutcome {
            node: None,
            cloud_id: None,
            detail: format!(
                "cluster {} {}: {} -> {target} nodes",
                self.cfg.cluster, size.name, size.count
            ),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let Some(server_id) = resolve_server(
            &self.nova,
            &req.node,
            req.cloud_id.as_deref(),
            self.cfg.server_name,
        )
        .await?
        else {
            return Ok(RemoveOutcome {
                detail: format!("no Nova server for {}: already gone", req.node),
                gone: true,
            });
        };
        let size = self.settled_size().await?;
        if size.count <= size.min {
            return Err(HandlerError::Permanent(format!(
                "{} of cluster {} is at its min_node_count {}: Magnum would refuse to shrink it",
                size.name, self.cfg.cluster, size.min
            )));
        }
        let target = size.count - 1;
        self.resize(Resize {
            node_count: target,
            nodes_to_remove: vec![server_id.clone()],
            nodegroup: self.cfg.nodegroup.clone(),
        })
        .await?;
        let gone = self
            .nova
            .get_server(&server_id)
            .await
            .map_err(to_handler_error)?
            .is_none();
        Ok(RemoveOutcome {
            detail: format!(
                "cluster {} {}: {} -> {target} nodes, removed {} ({server_id})",
                self.cfg.cluster, size.name, size.count, req.node
            ),
            gone,
        })
    }

    async fn presence(&self, node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        Ok(
            match resolve_server(&self.nova, node, None, self.cfg.server_name).await? {
                Some(_) => Presence::Present,
                None => Presence::Gone,
            },
        )
    }

    async fn capacity(
        &self,
        _group: &GroupKey,
        _shape: &NodeShape,
    ) -> Result<Capacity, HandlerError> {
        let size = self.settled_size().await;
        Ok(match size {
            Ok(s) => match s.max {
                Some(m) => Capacity {
                    nodes_available: Some(m.saturating_sub(s.count)),
                    detail: format!("{} has {} of at most {m} nodes", s.name, s.count),
                },
                None => Capacity::unknown(),
            },
            Err(e) if e.is_quota() => Capacity {
                nodes_available: Some(0),
                detail: e.to_string(),
            },
            Err(e) => return Err(e),
        })
    }
}
