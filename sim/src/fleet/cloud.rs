//! The simulated cloud: a [`Handler`] that boots a node agent of the
//! [`SimFleet`] per create request and deletes the host on removal.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use gearshift_handlers::{
    CreateOutcome, CreateRequest, GroupKey, Handler, HandlerError, Lookup, Presence, RemoveOutcome,
    RemoveRequest,
};
use gearshift_proto::msg::GearInfo;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{NodeSpec, SimFleet, lock};

/// What the simulated cloud did, for a display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudEvent {
    /// A create request was accepted; the node boots after the delay.
    Booting {
        /// The new node.
        node: String,
        /// The scale-up operation.
        op: String,
    },
    /// The node's agent started.
    Booted {
        /// The node.
        node: String,
    },
    /// The node could not be started.
    BootFailed {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node was deleted.
    Deleted {
        /// The node.
        node: String,
        /// Gears that were still on it (lost: must be none).
        gears_left: usize,
    },
}

/// The simulated cloud: boots a node agent per create request, after a
/// delay, reporting the operation id as `booted_for`, and stops it (and
/// deletes the host from the world) on removal. Idempotent on the operation
/// id, as the sagas expect of a handler; it also counts every request, so
/// that a test can tell a repeated request from a single one.
pub struct SimCloud {
    fleet: Arc<SimFleet>,
    naming: Box<dyn Fn(u32) -> String + Send + Sync>,
    max_active_gears: u32,
    boot_delay: Duration,
    serial: AtomicU32,
    create_requests: AtomicU32,
    remove_requests: Mutex<Vec<String>>,
    created: Mutex<BTreeMap<String, String>>,
    deleted: Mutex<BTreeSet<String>>,
    lost: Mutex<Vec<GearInfo>>,
    events: broadcast::Sender<CloudEvent>,
    token: CancellationToken,
}

impl std::fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCloud")
            .field("boot_delay", &self.boot_delay)
            .field("created", &*lock(&self.created))
            .finish_non_exhaustive()
    }
}

impl SimCloud {
    /// A cloud that names its `n`-th new node `naming(n)` (n from
    /// `first_serial`), gives it `max_active_gears`, and starts its agent
    /// `boot_delay` after the request (zero: before answering the request).
    /// `token` stops pending boots.
    pub fn new(
        fleet: Arc<SimFleet>,
        naming: impl Fn(u32) -> String + Send + Sync + 'static,
        first_serial: u32,
        max_active_gears: u32,
        boot_delay: Duration,
        token: CancellationToken,
    ) -> Arc<SimCloud> {
        Arc::new(SimCloud {
            fleet,
            naming: Box::new(naming),
            max_active_gears,
            boot_delay,
            serial: AtomicU32::new(first_serial),
            create_requests: AtomicU32::new(0),
            remove_requests: Mutex::default(),
            created: Mutex::default(),
            deleted: Mutex::default(),
            lost: Mutex::default(),
            events: broadcast::channel(256).0,
            token,
        })
    }

    /// What the cloud does, as it does it.
    pub fn events(&self) -> broadcast::Receiver<CloudEvent> {
        self.events.subscribe()
    }

    /// Nodes created, by operation id.
    pub fn created(&self) -> BTreeMap<String, String> {
        lock(&self.created).clone()
    }

    /// Nodes deleted.
    pub fn deleted(&self) -> BTreeSet<String> {
        lock(&self.deleted).clone()
    }

    /// Gears that were still on a node when it was deleted.
    pub fn lost(&self) -> Vec<GearInfo> {
        lock(&self.lost).clone()
    }

    /// Create requests received, repeated ones included.
    pub fn create_requests(&self) -> u32 {
        self.create_requests.load(Ordering::SeqCst)
    }

    /// The node of every remove request received, in order, repeated ones
    /// included.
    pub fn remove_requests(&self) -> Vec<String> {
        lock(&self.remove_requests).clone()
    }

    /// The node booted for `op`, and whether it is new.
    fn node_for(&self, op: &str) -> (String, bool) {
        let mut created = lock(&self.created);
        if let Some(n) = created.get(op) {
            return (n.clone(), false);
        }
        let n = (self.naming)(self.serial.fetch_add(1, Ordering::SeqCst));
        created.insert(op.to_string(), n.clone());
        (n, true)
    }

    fn boot(fleet: &SimFleet, spec: &NodeSpec) -> CloudEvent {
        match fleet.start_node(spec) {
            Ok(()) => CloudEvent::Booted {
                node: spec.name.clone(),
            },
            Err(e) => {
                tracing::error!(node = %spec.name, error = %e, "simulated node did not boot");
                CloudEvent::BootFailed {
                    node: spec.name.clone(),
                    reason: e.to_string(),
                }
            }
        }
    }

    /// Boots the node now, or after the boot delay on a task of its own.
    fn schedule_boot(&self, spec: NodeSpec) {
        if self.boot_delay.is_zero() {
            let _ = self.events.send(SimCloud::boot(&self.fleet, &spec));
            return;
        }
        let fleet = self.fleet.clone();
        let events = self.events.clone();
        let delay = self.boot_delay;
        let token = self.token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = token.cancelled() => return,
            }
            let _ = events.send(SimCloud::boot(&fleet, &spec));
        });
    }
}

#[async_trait]
impl Handler for SimCloud {
    fn kind(&self) -> &'static str {
        "sim"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        self.create_requests.fetch_add(1, Ordering::SeqCst);
        let (name, new) = self.node_for(&req.op);
        if !new {
            // A repeated request for the same operation: the same node.
            return Ok(CreateOutcome {
                node: Some(name.clone()),
                cloud_id: Some(format!("sim-{name}")),
                detail: format!("{name} is already booting for {}", req.op),
            });
        }
        let _ = self.events.send(CloudEvent::Booting {
            node: name.clone(),
            op: req.op.clone(),
        });
        self.schedule_boot(NodeSpec {
            name: name.clone(),
            district: req.group.district.clone(),
            profile: req.group.profile.clone(),
            max_active_gears: self.max_active_gears,
            booted_for: Some(req.op.clone()),
            gears: 0,
        });
        Ok(CreateOutcome {
            node: Some(name.clone()),
            cloud_id: Some(format!("sim-{name}")),
            detail: format!(
                "booting {name} (ready in about {} ms)",
                self.boot_delay.as_millis()
            ),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        lock(&self.remove_requests).push(req.node.clone());
        if lock(&self.deleted).contains(&req.node) {
            return Ok(RemoveOutcome {
                detail: format!("{} was already deleted", req.node),
                gone: true,
            });
        }
        let left = self.fleet.delete_node(&req.node).await;
        let gears_left = left.len();
        if gears_left > 0 {
            tracing::error!(node = %req.node, gears = gears_left, "node deleted with gears on it");
        }
        lock(&self.lost).extend(left);
        lock(&self.deleted).insert(req.node.clone());
        let _ = self.events.send(CloudEvent::Deleted {
            node: req.node.clone(),
            gears_left,
        });
        Ok(RemoveOutcome {
            detail: format!("deleted {}", req.node),
            gone: false,
        })
    }

    async fn lookup(&self, op: &str, group: &GroupKey) -> Result<Lookup, HandlerError> {
        Ok(match lock(&self.created).get(op) {
            Some(n) => Lookup::Found(CreateOutcome {
                node: Some(n.clone()),
                cloud_id: Some(format!("sim-{n}")),
                detail: format!("{n} was created for {op} in {group}"),
            }),
            None => Lookup::NotFound,
        })
    }

    async fn presence(&self, node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        Ok(if self.fleet.world().nodes().iter().any(|n| n == node) {
            Presence::Present
        } else {
            Presence::Gone
        })
    }
}
