//! Magnum (container-infra API v1) with `OpenStack-API-Version:
//! container-infra 1.9` (resize needs 1.7, node groups 1.9).
//!
//! Calls: `GET clusters/{id}`, `GET clusters/{id}/nodegroups/{ng}`,
//! `POST clusters/{id}/actions/resize` with `{"node_count": N,
//! "nodes_to_remove": [server ids], "nodegroup": "name"}` (answered 202
//! `{"uuid": ...}`).

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Session;
use crate::error::{CloudError, Service, bounded, magnum_reason_names_quota};
use crate::heat::seg;

/// The microversion header we send.
pub const API_VERSION: &str = "container-infra 1.9";

/// A cluster (the fields we use).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Cluster {
    /// UUID.
    pub uuid: String,
    /// Name.
    pub name: String,
    /// `CREATE_COMPLETE`, `UPDATE_IN_PROGRESS`, `UPDATE_FAILED`, ...
    pub status: String,
    /// Reason for the status.
    #[serde(default)]
    pub status_reason: Option<String>,
    /// Worker nodes of the default node group.
    #[serde(default)]
    pub node_count: u32,
    /// The Heat stack behind it.
    #[serde(default)]
    pub stack_id: Option<String>,
}

/// A node group (the fields we use).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Nodegroup {
    /// UUID.
    pub uuid: String,
    /// Name.
    pub name: String,
    /// Nodes.
    pub node_count: u32,
    /// Lower bound.
    #[serde(default)]
    pub min_node_count: u32,
    /// Upper bound (none: unbounded).
    #[serde(default)]
    pub max_node_count: Option<u32>,
    /// `worker` or `master`.
    #[serde(default)]
    pub role: String,
    /// Status.
    #[serde(default)]
    pub status: String,
    /// Reason for the status.
    #[serde(default)]
    pub status_reason: Option<String>,
}

/// A resize request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resize {
    /// The node group's new size.
    pub node_count: u32,
    /// Server ids to remove (when shrinking).
    pub nodes_to_remove: Vec<String>,
    /// Node group name or uuid (the default worker group when `None`).
    pub nodegroup: Option<String>,
}

impl Resize {
    /// The documented body.
    pub fn to_body(&self) -> Value {
        let mut b = json!({ "node_count": self.node_count });
        if !self.nodes_to_remove.is_empty() {
            b["nodes_to_remove"] = json!(self.nodes_to_remove);
        }
        if let Some(ng) = &self.nodegroup {
            b["nodegroup"] = json!(ng);
        }
        b
    }
}

/// Refuses to act on a cluster `*_IN_PROGRESS` (busy) or `*_FAILED`.
pub fn ensure_settled(status: &str, reason: Option<&str>, what: &str) -> Result<(), CloudError> {
    if status.ends_with("_IN_PROGRESS") {
        return Err(CloudError::Busy {
            what: what.to_string(),
            state: status.to_string(),
        });
    }
    if status.ends_with("_FAILED") {
        let r = reason.unwrap_or("");
        return Err(CloudError::Failed {
            what: what.to_string(),
            state: status.to_string(),
            quota: magnum_reason_names_quota(r),
            reason: bounded(r),
        });
    }
    Ok(())
}

/// Magnum client.
#[derive(Debug, Clone)]
pub struct Magnum {
    session: Session,
}

impl Magnum {
    /// A client on this session.
    pub fn new(session: Session) -> Self {
        Magnum { session }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<crate::http::Response, CloudError> {
        self.session
            .request(
                Service::ContainerInfra,
                method,
                path,
                &[("OpenStack-API-Version", API_VERSION)],
                body,
            )
            .await
    }

    /// A cluster by name or uuid.
    pub async fn get_cluster(&self, ident: &str) -> Result<Cluster, CloudError> {
        let path = format!("clusters/{}", seg(ident));
        let resp = self.call(Method::GET, &path, None).await?;
        resp.json(Service::ContainerInfra, &path)
    }

    /// A node group of a cluster.
    pub async fn get_nodegroup(
        &self,
        cluster: &str,
        nodegroup: &str,
    ) -> Result<Nodegroup, CloudError> {
        let path = format!("clusters/{}/nodegroups/{}", seg(cluster), seg(nodegroup));
        let resp = self.call(Method::GET, &path, None).await?;
        resp.json(Service::ContainerInfra, &path)
    }

    /// `POST clusters/{id}/actions/resize`.
    pub async fn resize(&self, cluster: &str, req: &Resize) -> Result<(), CloudError> {
        let path = format!("clusters/{}/actions/resize", seg(cluster));
        self.call(Method::POST, &path, Some(&req.to_body())).await?;
        Ok(())
    }

    /// Waits until the cluster's resize to `node_count` is complete (the
    /// node group, or the cluster when `nodegroup` is `None`, has that many
    /// nodes and a `*_COMPLETE` status). `UPDATE_FAILED` is
    /// [`CloudError::Failed`], quota flagged from the reason.
    pub async fn wait_resized(
        &self,
        cluster: &str,
        nodegroup: Option<&str>,
        node_count: u32,
        timeout: Duration,
        poll: Duration,
    ) -> Result<(), CloudError> {
        let start = tokio::time::Instant::now();
        loop {
            let c = self.get_cluster(cluster).await?;
            let (status, reason, count) = match nodegroup {
                Some(ng) => {
                    let g = self.get_nodegroup(cluster, ng).await?;
                    // The cluster carries the failure reason when the group lacks one.
                    let status = if c.status.ends_with("_FAILED") {
                        c.status.clone()
                    } else {
                        g.status.clone()
                    };
                    let reason = g
                        .status_reason
                        .filter(|r| !r.is_empty())
                        .or(c.status_reason.clone());
                    (status, reason, g.node_count)
                }
                None => (c.status.clone(), c.status_reason.clone(), c.node_count),
            };
            let what = format!("cluster {}", c.name);
            if status.ends_with("_FAILED") {
                ensure_settled(&status, reason.as_deref(), &what)?;
            }
            if status.ends_with("_COMPLETE")
                && count == node_count
                && !c.status.ends_with("_IN_PROGRESS")
            {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(CloudError::Timeout {
                    what: format!("{what} to reach {node_count} nodes"),
                    waited: timeout,
                    last_state: format!("{status}, {count} nodes"),
                });
            }
            tokio::time::sleep(poll).await;
        }
    }
}
