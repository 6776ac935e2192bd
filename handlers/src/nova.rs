//! The `nova` handler: boots and deletes node hosts with Nova (and an
//! optional Cinder volume), named the seeds' way.
//!
//! ## Naming (seed 001)
//! A node's Nova name is `<base>_<N>` and its host name `<base>-<N>.<domain>`
//! (`openshift-node_1` / `openshift-node-1.example.com`). A new node takes
//! the first N in `1..=max_nodes` that no server of that base name uses.
//! Creates are serialised per handler so two sagas never pick the same N.
//!
//! ## Create
//! 1. If a server already carries this operation id in its metadata (a
//!    restarted or retried saga), it is resumed, never created twice.
//! 2. Quota pre-flight: Nova's `GET /limits` against the flavor (instances,
//!    cores, RAM); no room is [`HandlerError::Quota`] without asking Nova to boot.
//! 3. With `shape.volume_gb`: a Cinder volume named like the host (as the
//!    seed did) is created and waited for (`available`).
//! 4. `POST /servers` with the group's flavor, image, availability zone,
//!    key pair, networks, security groups, metadata (`gearshift_op`,
//!    `gearshift_node`, `gearshift_district`, `gearshift_profile`,
//!    `gearshift_agent` plus the shape's own) and user data (see below).
//! 5. With a volume: wait for `ACTIVE`, then attach it
//!    (`POST /servers/{id}/os-volume_attachments`, `volume_device` if set).
//!
//! Nova's 403/413 "Quota exceeded", Cinder's 413 and a boot fault naming a
//! quota are [`HandlerError::Quota`].
//!
//! ## User data
//! The shape's `user_data` template with `{node}`, `{short}`, `{domain}`,
//! `{profile}`, `{district}`, `{bus_url}`, `{op}` and `{enroll_token}`
//! replaced; without one, a cloud-config that sets the host name and writes
//! `/etc/gearshift/boot.json` = `{"node", "domain", "profile", "district",
//! "bus_url", "op", "enroll_token"}` for the node agent. The enrollment
//! token (when the broker agent's key is at hand) is minted for this one
//! host, one use, valid [`ENROLL_TTL`], signed by the broker agent's key:
//! the node enrolls its own key with it (`[enroll] token_file`).
//!
//! ## Remove
//! Deletes the server (found by `cloud_id`, else by name), waits until it
//! is gone, then deletes the volume named like the host (`delete_volume`).
//! A server already gone is success: remove is idempotent.

use std::collections::BTreeMap;

use async_trait::async_trait;
use gearshift_cloud::cinder::{Cinder, VolumeCreate};
use gearshift_cloud::nova::{Nova, Server, ServerCreate, find_image, find_network};

use crate::cloud::{exact_name_filter, to_handler_error};
use crate::config::NovaConfig;
use crate::{
    BuildError, Capacity, CreateOutcome, CreateRequest, GroupKey, Handler, HandlerContext,
    HandlerError, Lookup, NodeShape, Presence, RemoveOutcome, RemoveRequest,
};

/// Metadata key: the operation id.
pub const META_OP: &str = "gearshift_op";
/// Metadata key: the host name.
pub const META_NODE: &str = "gearshift_node";
/// Metadata key: the district.
pub const META_DISTRICT: &str = "gearshift_district";
/// Metadata key: the profile.
pub const META_PROFILE: &str = "gearshift_profile";
/// Metadata key: the broker agent's name.
pub const META_AGENT: &str = "gearshift_agent";

/// How long the enrollment token of a new server is accepted: longer than
/// any boot, short enough that a leaked user data is soon worthless.
pub const ENROLL_TTL: chrono::Duration = chrono::Duration::hours(2);

/// Boots node hosts with Nova.
#[derive(Debug)]
pub struct NovaHandler {
    cfg: NovaConfig,
    nova: Nova,
    cinder: Cinder,
    agent: String,
    bus_url: String,
    /// Signs each new server's one-use enrollment token (none: no token).
    signer: Option<std::sync::Arc<gearshift_proto::KeyPair>>,
    naming: tokio::sync::Mutex<()>,
}

impl NovaHandler {
    /// Reads the credentials; connects on first use.
    pub fn new(cfg: NovaConfig, ctx: &HandlerContext) -> Result<Self, BuildError> {
        cfg.validate()?;
        let session = crate::cloud::session(&cfg.auth)?;
        Ok(Self::with_session(cfg, session, ctx))
    }

    /// A handler on an existing session.
    pub fn with_session(
        cfg: NovaConfig,
        session: gearshift_cloud::Session,
        ctx: &HandlerContext,
    ) -> Self {
        NovaHandler {
            nova: Nova::new(session.clone()),
            cinder: Cinder::new(session),
            agent: ctx.agent.clone(),
            bus_url: ctx.bus_url.clone(),
            signer: ctx.signer.clone(),
            naming: tokio::sync::Mutex::new(()),
            cfg,
        }
    }

    /// Nova name of node N.
    pub fn nova_name(&self, n: u32) -> String {
        format!("{}_{n}", self.cfg.base_name)
    }

    /// Host name of node N.
    pub fn host_name(&self, n: u32) -> String {
        format!("{}-{n}.{}", self.cfg.base_name, self.cfg.domain)
    }

    /// N of a Nova name `<base>_<N>`.
    fn index_of_nova_name(&self, name: &str) -> Option<u32> {
        let rest = name.strip_prefix(&self.cfg.base_name)?.strip_prefix('_')?;
        if rest.is_empty() || rest.starts_with('0') || !rest.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        rest.parse().ok()
    }

    /// N of a host name `<base>-<N>.<domain>`.
    fn index_of_host(&self, host: &str) -> Option<u32> {
        let short = host.strip_suffix(&format!(".{}", self.cfg.domain))?;
        let rest = short.strip_prefix(&self.cfg.base_name)?.strip_prefix('-')?;
        if rest.is_empty() || rest.starts_with('0') || !rest.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        rest.parse().ok()
    }

    /// Servers named `<base>_<N>`.
    async fn our_servers(&self) -> Result<Vec<(u32, Server)>, HandlerError> {
        let prefix = exact_name_filter(&format!("{}_", self.cfg.base_name));
        let filter = prefix.trim_end_matches('$');
        let all = self
            .nova
            .list_servers(Some(filter))
            .await
            .map_err(to_handler_error)?;
        Ok(all
            .into_iter()
            .filter_map(|s| self.index_of_nova_name(&s.name).map(|n| (n, s)))
            .collect())
    }

    /// A one-use token for `host` in `req`'s group, signed by the broker
    /// agent's key.
    fn enroll_token(&self, req: &CreateRequest, host: &str) -> Option<String> {
        let grant = gearshift_proto::msg::EnrollToken {
            district: req.group.district.clone(),
            profile: req.group.profile.clone(),
            max_uses: 1,
            host: Some(host.to_string()),
        };
        let key = self.signer.as_ref()?;
        let now = chrono::Utc::now();
        Some(gearshift_proto::enroll::mint_token(
            key,
            &self.agent,
            grant,
            now,
            ENROLL_TTL,
        ))
    }

    fn user_data(&self, shape: &NodeShape, req: &CreateRequest, host: &str) -> String {
        let short = host.split('.').next().unwrap_or(host);
        let token = self.enroll_token(req, host);
        match &shape.user_data {
            Some(t) => t
                .replace("{node}", host)
                .replace("{short}", short)
                .replace("{domain}", &self.cfg.domain)
                .replace("{profile}", &req.group.profile)
                .replace("{district}", &req.group.district)
                .replace("{bus_url}", &self.bus_url)
                .replace("{op}", &req.op)
                .replace("{enroll_token}", token.as_deref().unwrap_or_default()),
            None => {
                let mut boot = serde_json::json!({
                    "node": host,
                    "domain": self.cfg.domain,
                    "profile": req.group.profile,
                    "district": req.group.district,
                    "bus_url": self.bus_url,
                    "op": req.op,
                });
                if let Some(t) = token {
                    boot["enroll_token"] = t.into();
                }
                format!(
                    "#cloud-config\nhostname: {short}\nfqdn: {host}\nwrite_files:\n  - path: /etc/gearshift/boot.json\n    permissions: '0640'\n    content: '{}'\n",
                    boot.to_string().replace('\'', "''")
                )
            }
        }
    }

    async fn preflight(&self, shape: &NodeShape) -> Result<(Capacity, String), HandlerError> {
        let flavor_ref = shape.flavor.as_deref().ok_or_else(|| {
            HandlerError::Permanent("the node group's shape has no flavor".into())
        })?;
        let flavor = self
            .nova
            .find_flavor(flavor_ref)
            .await
            .map_err(to_handler_error)?;
        let limits = self.nova.limits().await.map_err(to_handler_error)?;
        let (fit, detail) = limits.servers_that_fit(&flavor);
        Ok((
            Capacity {
                nodes_available: fit.map(|n| n.min(u32::MAX as u64) as u32),
                detail,
            },
            flavor.id,
        ))
    }

    /// Makes sure a server found for this operation has its volume.
    async fn resume(
        &self,
        n: u32,
        server: &Server,
        shape: &NodeShape,
    ) -> Result<CreateOutcome, HandlerError> {
        let host = self.host_name(n);
        if shape.volume_gb.is_some() {
            let vols = self
                .cinder
                .find_volumes(&host)
                .await
                .map_err(to_handler_error)?;
            let attached = vols.iter().any(|v| {
                v.attachments.iter().any(|a| {
                    a.get("server_id").and_then(|s| s.as_str()) == Some(server.id.as_str())
                })
            });
            if !attached {
                let op = server.metadata.get(META_OP).cloned().unwrap_or_default();
                self.ensure_volume_attached(&host, &server.id, shape, &op)
                    .await?;
            }
        }
        Ok(CreateOutcome {
            node: Some(host),
            cloud_id: Some(server.id.clone()),
            detail: format!(
                "server {} ({}) already exists for this operation",
                server.name, server.id
            ),
        })
    }

    async fn ensure_volume(
        &self,
        host: &str,
        shape: &NodeShape,
        op: &str,
    ) -> Result<String, HandlerError> {
        let existing = self
            .cinder
            .find_volumes(host)
            .await
            .map_err(to_handler_error)?;
        let vol = match existing
            .into_iter()
            .find(|v| v.metadata.get(META_OP).map(String::as_str) == Some(op))
        {
            Some(v) => v,
            None => {
                let mut metadata = BTreeMap::new();
                metadata.insert(META_OP.to_string(), op.to_string());
                metadata.insert(META_NODE.to_string(), host.to_string());
                self.cinder
                    .create_volume(&VolumeCreate {
                        size_gb: shape.volume_gb.unwrap_or(0),
                        name: host.to_string(),
                        volume_type: shape.volume_type.clone(),
                        availability_zone: shape.availability_zone.clone(),
                        metadata,
                    })
                    .await
                    .map_err(to_handler_error)?
            }
        };
        if vol.status != "available" {
            self.cinder
                .wait_available(&vol.id, self.cfg.volume_timeout, self.cfg.poll_interval)
                .await
                .map_err(to_handler_error)?;
        }
        Ok(vol.id)
    }

    async fn ensure_volume_attached(
        &self,
        host: &str,
        server_id: &str,
        shape: &NodeShape,
        op: &str,
    ) -> Result<(), HandlerError> {
        let vol = self.ensure_volume(host, shape, op).await?;
        self.nova
            .wait_active(server_id, self.cfg.boot_timeout, self.cfg.poll_interval)
            .await
            .map_err(to_handler_error)?;
        self.nova
            .attach_volume(server_id, &vol, self.cfg.volume_device.as_deref())
            .await
            .map_err(to_handler_error)
    }

    async fn delete_volumes(&self, host: &str) -> Result<usize, HandlerError> {
        if !self.cfg.delete_volume {
            return Ok(0);
        }
        let vols = self
            .cinder
            .find_volumes(host)
            .await
            .map_err(to_handler_error)?;
        for v in &vols {
            self.cinder
                .delete_volume(&v.id)
                .await
                .map_err(to_handler_error)?;
        }
        Ok(vols.len())
    }
}

impl NovaHandler {
    /// The lowest free `<base>_<N>` number.
    fn free_number(&self, servers: &[(u32, Server)]) -> Result<u32, HandlerError> {
        let used: std::collections::BTreeSet<u32> = servers.iter().map(|(n, _)| *n).collect();
        (1..=self.cfg.max_nodes)
            .find(|n| !used.contains(n))
            .ok_or_else(|| {
                HandlerError::Quota(format!(
                    "every name {}_1..{}_{} is taken (max_nodes)",
                    self.cfg.base_name, self.cfg.base_name, self.cfg.max_nodes
                ))
            })
    }

    /// The boot request of `host`: image and networks looked up by name,
    /// the operation, node and group in its metadata.
    async fn server_create(
        &self,
        req: &CreateRequest,
        host: &str,
        name: String,
        flavor_id: String,
        image_ref: &str,
    ) -> Result<ServerCreate, HandlerError> {
        let shape = &req.shape;
        let session = self.nova.session();
        let image_id = find_image(session, image_ref)
            .await
            .map_err(to_handler_error)?;
        let mut network_ids = Vec::new();
        for net in &shape.networks {
            network_ids.push(find_network(session, net).await.map_err(to_handler_error)?);
        }
        let mut metadata = shape.metadata.clone();
        metadata.insert(META_OP.into(), req.op.clone());
        metadata.insert(META_NODE.into(), host.to_string());
        metadata.insert(META_DISTRICT.into(), req.group.district.clone());
        metadata.insert(META_PROFILE.into(), req.group.profile.clone());
        metadata.insert(META_AGENT.into(), self.agent.clone());
        Ok(ServerCreate {
            name,
            flavor_id,
            image_id,
            availability_zone: shape.availability_zone.clone(),
            user_data: Some(self.user_data(shape, req, host)),
            key_name: shape.key_name.clone(),
            network_ids,
            security_groups: shape.security_groups.clone(),
            metadata,
        })
    }

    /// Asks Nova for the server; a refused boot deletes its new volume.
    async fn boot(
        &self,
        create: &ServerCreate,
        volume: Option<&str>,
    ) -> Result<String, HandlerError> {
        match self.nova.create_server(create).await {
            Ok(id) => Ok(id),
            Err(e) => {
                if let Some(v) = volume {
                    // Do not leave an orphan volume behind a refused boot.
                    if let Err(de) = self.cinder.delete_volume(v).await {
                        tracing::warn!(volume = %v, error = %de, "could not delete the volume of a refused boot");
                    }
                }
                Err(to_handler_error(e))
            }
        }
    }
}

#[async_trait]
impl Handler for NovaHandler {
    fn kind(&self) -> &'static str {
        "nova"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let shape = &req.shape;
        let image_ref = shape
            .image
            .as_deref()
            .ok_or_else(|| HandlerError::Permanent("the node group's shape has no image".into()))?;
        let _naming = self.naming.lock().await;
        let servers = self.our_servers().await?;
        if let Some((n, s)) = servers
            .iter()
            .find(|(_, s)| s.metadata.get(META_OP) == Some(&req.op))
        {
            return self.resume(*n, s, shape).await;
        }
        let (cap, flavor_id) = self.preflight(shape).await?;
        if cap.nodes_available == Some(0) {
            return Err(HandlerError::Quota(format!(
                "Nova quota pre-flight: {}",
                cap.detail
            )));
        }
        let n = self.free_number(&servers)?;
        let host = self.host_name(n);
        let name = self.nova_name(n);
        let create = self
            .server_create(req, &host, name.clone(), flavor_id, image_ref)
            .await?;
        let volume = match shape.volume_gb {
            Some(_) => Some(self.ensure_volume(&host, shape, &req.op).await?),
            None => None,
        };
        let id = self.boot(&create, volume.as_deref()).await?;
        tracing::info!(op = %req.op, server = %id, %name, %host, "server requested");
        if let Some(v) = &volume {
            self.nova
                .wait_active(&id, self.cfg.boot_timeout, self.cfg.poll_interval)
                .await
                .map_err(to_handler_error)?;
            self.nova
                .attach_volume(&id, v, self.cfg.volume_device.as_deref())
                .await
                .map_err(to_handler_error)?;
        }
        Ok(CreateOutcome {
            node: Some(host.clone()),
            cloud_id: Some(id.clone()),
            detail: format!(
                "Nova server {name} ({id}) for {host}{}; {}",
                if volume.is_some() {
                    " with its volume attached"
                } else {
                    ""
                },
                cap.detail
            ),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let server = match &req.cloud_id {
            Some(id) => self.nova.get_server(id).await.map_err(to_handler_error)?,
            None => {
                let servers = self.our_servers().await?;
                let by_index = self.index_of_host(&req.node);
                servers
                    .into_iter()
                    .find(|(n, s)| {
                        Some(*n) == by_index || s.metadata.get(META_NODE) == Some(&req.node)
                    })
                    .map(|(_, s)| s)
            }
        };
        let detail = match server {
            Some(s) => {
                self.nova
                    .delete_server(&s.id)
                    .await
                    .map_err(to_handler_error)?;
                self.nova
                    .wait_gone(&s.id, self.cfg.delete_timeout, self.cfg.poll_interval)
                    .await
                    .map_err(to_handler_error)?;
                format!("deleted Nova server {} ({})", s.name, s.id)
            }
            None => format!("no Nova server for {}: already gone", req.node),
        };
        let vols = self.delete_volumes(&req.node).await?;
        Ok(RemoveOutcome {
            detail: if vols > 0 {
                format!("{detail}; deleted {vols} volume(s)")
            } else {
                detail
            },
            gone: true,
        })
    }

    async fn lookup(&self, op: &str, _group: &GroupKey) -> Result<Lookup, HandlerError> {
        let servers = self.our_servers().await?;
        Ok(
            match servers
                .into_iter()
                .find(|(_, s)| s.metadata.get(META_OP).map(String::as_str) == Some(op))
            {
                Some((n, s)) => Lookup::Found(CreateOutcome {
                    node: Some(self.host_name(n)),
                    cloud_id: Some(s.id.clone()),
                    detail: format!(
                        "Nova server {} ({}) carries this operation id",
                        s.name, s.id
                    ),
                }),
                None => Lookup::NotFound,
            },
        )
    }

    async fn presence(&self, node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        let servers = self.our_servers().await?;
        let idx = self.index_of_host(node);
        let found = servers.iter().any(|(n, s)| {
            Some(*n) == idx || s.metadata.get(META_NODE).map(String::as_str) == Some(node)
        });
        Ok(if found {
            Presence::Present
        } else if idx.is_some() {
            Presence::Gone
        } else {
            // Not a name of ours and no server claims it: we cannot tell.
            Presence::Unknown
        })
    }

    async fn capacity(
        &self,
        _group: &GroupKey,
        shape: &NodeShape,
    ) -> Result<Capacity, HandlerError> {
        let (mut cap, _) = self.preflight(shape).await?;
        let taken = self.our_servers().await?.len() as u32;
        let names_left = self.cfg.max_nodes.saturating_sub(taken);
        if cap.nodes_available.is_none_or(|n| names_left < n) {
            cap.nodes_available = Some(names_left);
            cap.detail = format!(
                "{}; {names_left} name(s) left below max_nodes {}",
                cap.detail, self.cfg.max_nodes
            );
        }
        Ok(cap)
    }
}
