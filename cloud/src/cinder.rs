//! Cinder (block storage API v3, paths under the catalog endpoint, which
//! ends in `/v3/{project_id}`).
//!
//! Calls: `POST volumes`, `GET volumes/{id}`, `GET volumes/detail?name=`,
//! `DELETE volumes/{id}`. Attaching is Nova's job
//! ([`crate::nova::Nova::attach_volume`]).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Session;
use crate::error::{CloudError, Service};
use crate::heat::seg;

/// A volume to create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeCreate {
    /// Size in GiB.
    pub size_gb: u32,
    /// Name.
    pub name: String,
    /// Volume type (the cloud's default when `None`).
    pub volume_type: Option<String>,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
}

/// A volume (the fields we use).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Volume {
    /// Id.
    pub id: String,
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// `creating`, `available`, `in-use`, `error`, `deleting`, ...
    pub status: String,
    /// Size in GiB.
    pub size: u64,
    /// Metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Attachments (server ids in `server_id`).
    #[serde(default)]
    pub attachments: Vec<Value>,
}

/// Cinder client.
#[derive(Debug, Clone)]
pub struct Cinder {
    session: Session,
}

impl Cinder {
    /// A client on this session.
    pub fn new(session: Session) -> Self {
        Cinder { session }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<crate::http::Response, CloudError> {
        self.session
            .request(Service::BlockStorage, method, path, &[], body)
            .await
    }

    /// Creates a volume (202, status `creating`). Quota refusals (413
    /// `overLimit`) come back with `is_quota()`.
    pub async fn create_volume(&self, req: &VolumeCreate) -> Result<Volume, CloudError> {
        if req.size_gb == 0 {
            return Err(CloudError::Config(
                "volume size must be at least 1 GiB".into(),
            ));
        }
        let mut v = json!({ "size": req.size_gb, "name": req.name });
        if let Some(t) = &req.volume_type {
            v["volume_type"] = json!(t);
        }
        if let Some(az) = &req.availability_zone {
            v["availability_zone"] = json!(az);
        }
        if !req.metadata.is_empty() {
            v["metadata"] = json!(req.metadata);
        }
        let body = json!({ "volume": v });
        let resp = self.call(Method::POST, "volumes", Some(&body)).await?;
        #[derive(Deserialize)]
        struct Body {
            volume: Volume,
        }
        let b: Body = resp.json(Service::BlockStorage, "volumes")?;
        Ok(b.volume)
    }

    /// A volume, or `None` when Cinder does not know it.
    pub async fn get_volume(&self, id: &str) -> Result<Option<Volume>, CloudError> {
        let path = format!("volumes/{}", seg(id));
        match self.call(Method::GET, &path, None).await {
            Ok(resp) => {
                #[derive(Deserialize)]
                struct Body {
                    volume: Volume,
                }
                let b: Body = resp.json(Service::BlockStorage, &path)?;
                Ok(Some(b.volume))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Volumes with exactly this name.
    pub async fn find_volumes(&self, name: &str) -> Result<Vec<Volume>, CloudError> {
        let q: String = url::form_urlencoded::byte_serialize(name.as_bytes()).collect();
        let path = format!("volumes/detail?name={q}");
        let resp = self.call(Method::GET, &path, None).await?;
        #[derive(Deserialize)]
        struct Body {
            volumes: Vec<Volume>,
        }
        let b: Body = resp.json(Service::BlockStorage, &path)?;
        Ok(b.volumes
            .into_iter()
            .filter(|v| v.name.as_deref() == Some(name))
            .collect())
    }

    /// Waits for `available`; `error` is [`CloudError::Failed`].
    pub async fn wait_available(
        &self,
        id: &str,
        timeout: Duration,
        poll: Duration,
    ) -> Result<Volume, CloudError> {
        let start = tokio::time::Instant::now();
        loop {
            let v = self
                .get_volume(id)
                .await?
                .ok_or_else(|| CloudError::Failed {
                    what: format!("volume {id}"),
                    state: "deleted".into(),
                    reason: "the volume disappeared while being created".into(),
                    quota: false,
                })?;
            match v.status.as_str() {
                "available" => return Ok(v),
                s if s.starts_with("error") => {
                    return Err(CloudError::Failed {
                        what: format!("volume {id}"),
                        state: v.status.clone(),
                        reason: "Cinder could not create the volume".into(),
                        quota: false,
                    });
                }
                _ => {}
            }
            if start.elapsed() >= timeout {
                return Err(CloudError::Timeout {
                    what: format!("volume {id} to become available"),
                    waited: timeout,
                    last_state: v.status,
                });
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Deletes a volume; one already gone is fine.
    pub async fn delete_volume(&self, id: &str) -> Result<(), CloudError> {
        match self
            .call(Method::DELETE, &format!("volumes/{}", seg(id)), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}
