//! The PaaS adapter: how the broker agent tells OpenShift v2 that a node
//! stops or resumes taking gears, joins or leaves a district, and how it
//! moves a gear, with OpenShift's own broker-host tools
//! (`oo-admin-ctl-district`, `oo-admin-move`).
//!
//! The sagas call a [`PaasAdapter`]; [`build`] makes the one `[paas]`
//! selects. Each call answers a typed [`Outcome`] (done, already so,
//! refused with a [`Cause`], failed, timed out), or a [`PaasError`] when the
//! call never reached OpenShift (a value the tools may not receive, a tool
//! that cannot start).
//!
//! ## Layout
//! - `config.rs`: the `[paas]` section ([`PaasConfig`]) and its checks.
//! - `template.rs`: command templates, parsed at load, filled without a shell.
//! - `names.rs`: the placeholders and the checks of every value filled in.
//! - `run.rs`: runs one command (process group, timeout, bounded output).
//! - `capture.rs`: the bounded head-and-tail output buffer.
//! - `parse/`: the tools' exit codes and output, as origin-server prints
//!   them; the only code that reads their text.
//! - `outcome.rs`: [`Outcome`], [`Cause`], [`Failure`]; `error.rs`: [`PaasError`].
//! - `openshift.rs` and `none.rs`: the two adapters.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

mod capture;
mod config;
mod error;
mod names;
mod none;
mod openshift;
mod outcome;
pub mod parse;
mod run;
mod template;

pub use config::{PaasConfig, PaasKind};
pub use error::PaasError;
pub use names::{Placeholder, Values};
pub use none::NoneAdapter;
pub use openshift::OpenShiftAdapter;
pub use outcome::{Cause, Failure, Outcome};
pub use run::{Ran, Runner};
pub use template::Template;

/// One kind of PaaS call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `deactivate-node`: no new gears on the node.
    Deactivate,
    /// `activate-node`: the node takes gears again.
    Activate,
    /// `add-node`: an empty node joins a district.
    AddNode,
    /// `remove-node`: an inactive, empty node leaves its district.
    RemoveNode,
    /// `oo-admin-move`: one gear to another node of its district.
    MoveGear,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 5] = [
        Operation::Deactivate,
        Operation::Activate,
        Operation::AddNode,
        Operation::RemoveNode,
        Operation::MoveGear,
    ];

    /// Its template's key in `[paas]`.
    pub fn key(self) -> &'static str {
        match self {
            Operation::Deactivate => "deactivate",
            Operation::Activate => "activate",
            Operation::AddNode => "add_node",
            Operation::RemoveNode => "remove_node",
            Operation::MoveGear => "move_gear",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// What the sagas call to change OpenShift's view of a node or a gear.
/// `district` is the district's UUID (as nodes report it); `host` and
/// `target` are server identities; `gear` a gear's UUID.
#[async_trait]
pub trait PaasAdapter: Send + Sync + fmt::Debug {
    /// `none` or `openshift`.
    fn kind(&self) -> PaasKind;

    /// Stops new gears landing on `host` (the district's `active` flag).
    async fn deactivate(&self, district: &str, host: &str) -> Result<Outcome, PaasError>;

    /// Lets `host` take new gears again.
    async fn activate(&self, district: &str, host: &str) -> Result<Outcome, PaasError>;

    /// Adds an empty, undistricted `host` of `profile` to `district`.
    async fn add_node(
        &self,
        district: &str,
        host: &str,
        profile: &str,
    ) -> Result<Outcome, PaasError>;

    /// Removes an inactive, empty `host` from `district`.
    async fn remove_node(&self, district: &str, host: &str) -> Result<Outcome, PaasError>;

    /// Moves `gear` to `target`, keeping its UID. The tool checks neither
    /// that `target` is active, nor that it has room, nor that it is in the
    /// gear's district: the caller chooses `target` so.
    async fn move_gear(&self, gear: &str, target: &str) -> Result<Outcome, PaasError>;
}

/// The adapter `[paas]` selects.
pub fn build(cfg: &PaasConfig) -> Arc<dyn PaasAdapter> {
    match cfg.kind {
        PaasKind::None => Arc::new(NoneAdapter),
        PaasKind::OpenShift => Arc::new(OpenShiftAdapter::new(cfg)),
    }
}
