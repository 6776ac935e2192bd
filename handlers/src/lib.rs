//! # gearshift-handlers: how a broker agent's decision reaches the cloud
//!
//! A handler turns "this node group needs one more node" and "remove exactly
//! this node" into calls on some system (a log line, an operator's script,
//! Nova, Heat, Magnum, an email, a spool directory, a node agent that signals
//! Heat). Each node group names its handler in `conf/broker.toml`.
//!
//! Handlers are called by the sagas, which journal their intent first, so a
//! handler only needs to be idempotent where it can (for example by tagging a
//! new server with the operation id and looking it up with [`Handler::lookup`]).
//!
//! ## Layout
//! - this file: the [`Handler`] trait and its request/answer types, the
//!   [`HandlerError`] classes the sagas decide on, [`HandlerContext`] (what
//!   the broker agent lends to handlers) and [`build`].
//! - [`config`]: [`HandlerConfig`] (`type = "..."`) and `validate()`, with
//!   the agents' one validation error, [`Invalid`]; the handlers on the
//!   broker host (`config/local.rs`) and the OpenStack ones (`config/openstack.rs`).
//! - one module per handler: [`log`], [`exec`], [`spool`], [`email`],
//!   [`nova`], [`heat`], [`magnum`], [`heat_via_node`].
//! - [`cloud`]: credentials to session, cloud errors to [`HandlerError`].
//!
//! `docs/handlers.md` is the operator's guide to every handler.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub mod cloud;
pub mod config;
pub mod email;
pub mod exec;
pub mod heat;
pub mod heat_via_node;
pub mod log;
pub mod magnum;
pub mod nova;
pub mod spool;

use std::sync::Arc;

pub use config::{HandlerConfig, Invalid};

/// A node group: one (district, profile).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupKey {
    /// District UUID, or `_none` for undistricted nodes.
    pub district: String,
    /// Node profile.
    pub profile: String,
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.district, self.profile)
    }
}

/// The cloud shape of a group's new nodes (Magnum-style heterogeneity: each
/// group may differ in flavor, image, zone, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeShape {
    /// Nova flavor name or id.
    pub flavor: Option<String>,
    /// Image name or id (a node host snapshot taken before districting).
    pub image: Option<String>,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// User data template; `{node}`, `{domain}`, `{profile}`, `{district}`,
    /// `{bus_url}` and `{op}` are substituted.
    pub user_data: Option<String>,
    /// Size of an extra Cinder volume for `/var/lib/openshift`, in GiB (none when absent).
    pub volume_gb: Option<u32>,
    /// Cinder volume type.
    pub volume_type: Option<String>,
    /// Nova key pair name.
    pub key_name: Option<String>,
    /// Network ids or names.
    pub networks: Vec<String>,
    /// Security group names.
    pub security_groups: Vec<String>,
    /// Extra server metadata.
    pub metadata: BTreeMap<String, String>,
}

/// Ask for one new node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateRequest {
    /// Operation id; the new node reports it as `booted_for`.
    pub op: String,
    /// The group.
    pub group: GroupKey,
    /// The group's cloud shape.
    pub shape: NodeShape,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The broker agent's leader epoch, for a handler that sends commands
    /// to nodes (`heat-via-node`); 0 without high availability.
    #[serde(default)]
    pub epoch: u64,
}

/// What the cloud said to a create request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateOutcome {
    /// The new node's host name, when known in advance.
    pub node: Option<String>,
    /// The cloud's id for it (server id, stack resource name, ...).
    pub cloud_id: Option<String>,
    /// A line for the log and the decision message.
    pub detail: String,
}

/// Remove exactly this node (it is inactive and empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    /// Operation id of the scale-down saga.
    pub op: String,
    /// The group.
    pub group: GroupKey,
    /// The node's host name.
    pub node: String,
    /// The cloud's id for it, when known.
    pub cloud_id: Option<String>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The broker agent's leader epoch, for a handler that sends commands
    /// to nodes (`heat-via-node`); 0 without high availability.
    #[serde(default)]
    pub epoch: u64,
}

/// What the cloud said to a remove request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveOutcome {
    /// A line for the log and the decision message.
    pub detail: String,
    /// The node is already confirmed gone (no need to poll [`Handler::presence`]).
    pub gone: bool,
}

/// Whether a node still exists in the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Presence {
    /// It exists.
    Present,
    /// It is gone.
    Gone,
    /// This handler cannot tell (the saga then relies on the node's reports stopping).
    Unknown,
}

/// Result of looking up a create request by operation id after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The cloud has it.
    Found(CreateOutcome),
    /// The cloud certainly has no such request: it is safe to ask again.
    NotFound,
    /// This handler cannot tell: the saga must not ask again.
    Unknown,
}

/// How much the cloud can still give a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// Nodes of the group's shape that still fit in the quota; `None` if unknown.
    pub nodes_available: Option<u32>,
    /// What was checked, with figures.
    pub detail: String,
}

impl Capacity {
    /// Nothing is known.
    pub fn unknown() -> Self {
        Capacity {
            nodes_available: None,
            detail: "this handler has no capacity check".into(),
        }
    }
}

/// Why a handler call failed. The sagas decide on retries by variant only.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum HandlerError {
    /// The cloud refused for lack of quota: the group becomes exhausted.
    #[error("quota exhausted: {0}")]
    Quota(String),
    /// The cloud is busy with something else (for example a Heat stack
    /// `*_IN_PROGRESS`): try again later; not a failure of the request itself.
    #[error("busy: {0}")]
    Busy(String),
    /// A passing failure (network, 5xx, timeout): retry with backoff.
    #[error("{0}")]
    Transient(String),
    /// A failure that retrying will not fix (bad configuration, 4xx): needs an operator.
    #[error("{0}")]
    Permanent(String),
}

impl HandlerError {
    /// Quota errors mark the group exhausted.
    pub fn is_quota(&self) -> bool {
        matches!(self, HandlerError::Quota(_))
    }

    /// Whether the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, HandlerError::Permanent(_))
    }

    /// A short stable label for metrics and decisions.
    pub fn label(&self) -> &'static str {
        match self {
            HandlerError::Quota(_) => "quota",
            HandlerError::Busy(_) => "busy",
            HandlerError::Transient(_) => "transient",
            HandlerError::Permanent(_) => "permanent",
        }
    }
}

/// One way of acting on the cloud.
#[async_trait]
pub trait Handler: Send + Sync {
    /// The handler type (`log`, `exec`, `nova`, ...), for logs and decisions.
    fn kind(&self) -> &'static str;

    /// Asks for one new node of `req.group`.
    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError>;

    /// Removes exactly `req.node`.
    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError>;

    /// After a restart: did the create request of operation `op` reach the cloud?
    async fn lookup(&self, _op: &str, _group: &GroupKey) -> Result<Lookup, HandlerError> {
        Ok(Lookup::Unknown)
    }

    /// Whether `node` still exists in the cloud.
    async fn presence(&self, _node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        Ok(Presence::Unknown)
    }

    /// Quota pre-flight: how many more nodes of this shape the cloud allows.
    async fn capacity(
        &self,
        _group: &GroupKey,
        _shape: &NodeShape,
    ) -> Result<Capacity, HandlerError> {
        Ok(Capacity::unknown())
    }
}

/// What the broker agent knows about its fleet, for handlers that need a
/// live node (`heat-via-node`). The broker agent implements it.
pub trait FleetView: Send + Sync {
    /// The group's active, reporting nodes (host names), preferred first.
    fn active_nodes(&self, group: &GroupKey) -> Vec<String>;
}

/// A fleet with no nodes (for handlers built without a broker agent).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFleet;

impl FleetView for NoFleet {
    fn active_nodes(&self, _group: &GroupKey) -> Vec<String> {
        Vec::new()
    }
}

/// What some handlers need from the broker agent.
#[derive(Clone)]
pub struct HandlerContext {
    /// The bus (needed by `heat-via-node`).
    pub bus: Option<gearshift_bus::SharedBus>,
    /// The broker agent's signing key (signs `cmd.heat_signal`).
    pub signer: Option<Arc<gearshift_proto::KeyPair>>,
    /// Keys that node events must be signed with; when `None`, events are
    /// matched on `from`, `corr` and the command id only.
    pub keyring: Option<Arc<gearshift_proto::Keyring>>,
    /// The broker agent's name (`from` of its messages, `requested_by` in spool files).
    pub agent: String,
    /// The bus URL new nodes are told to use (in Nova user data).
    pub bus_url: String,
    /// The fleet, as the broker agent sees it.
    pub fleet: Arc<dyn FleetView>,
}

impl std::fmt::Debug for HandlerContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerContext")
            .field("bus", &self.bus.as_ref().map(|b| b.transport()))
            .field("signer", &self.signer.as_ref().map(|k| k.id().to_string()))
            .field("agent", &self.agent)
            .field("bus_url", &self.bus_url)
            .finish_non_exhaustive()
    }
}

impl HandlerContext {
    /// A context with no bus, no key and no fleet (enough for every
    /// handler but `heat-via-node`).
    pub fn standalone(agent: impl Into<String>) -> Self {
        HandlerContext {
            bus: None,
            signer: None,
            keyring: None,
            agent: agent.into(),
            bus_url: String::new(),
            fleet: Arc::new(NoFleet),
        }
    }
}

/// Why a handler could not be built.
#[derive(Debug, Error)]
pub enum BuildError {
    /// The configuration is invalid.
    #[error("invalid handler configuration: {0}")]
    Invalid(Invalid),
    /// Something the handler needs is missing or unreadable (credentials,
    /// a password file, the bus or signing key for `heat-via-node`).
    #[error("{0}")]
    Setup(String),
}

/// Builds the handler `name` from its configuration. Validates first;
/// reads credential files but opens no network connection.
pub fn build(
    name: &str,
    config: &HandlerConfig,
    ctx: &HandlerContext,
) -> Result<Arc<dyn Handler>, BuildError> {
    config.validate()?;
    let h: Arc<dyn Handler> = match config {
        HandlerConfig::Log {} => Arc::new(log::LogHandler),
        HandlerConfig::Exec(c) => Arc::new(exec::ExecHandler::new(c.clone(), ctx)),
        HandlerConfig::Spool(c) => Arc::new(spool::SpoolHandler::new(c.clone(), ctx)),
        HandlerConfig::Email(c) => Arc::new(email::EmailHandler::new(c.clone(), ctx)?),
        HandlerConfig::Nova(c) => Arc::new(nova::NovaHandler::new(c.clone(), ctx)?),
        HandlerConfig::Heat(c) => Arc::new(heat::HeatHandler::new(c.clone())?),
        HandlerConfig::Magnum(c) => Arc::new(magnum::MagnumHandler::new(c.clone())?),
        HandlerConfig::HeatViaNode(c) => {
            Arc::new(heat_via_node::HeatViaNodeHandler::new(c.clone(), ctx)?)
        }
    };
    tracing::info!(handler = name, kind = h.kind(), "handler ready");
    Ok(h)
}
