//! What OpenShift answered to one operation, typed so that the sagas decide
//! on the cause and never on the tools' text.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The result of one PaaS operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The tool did it (for the `none` adapter: nothing to do).
    Done,
    /// The goal already held: deactivating a node already inactive,
    /// activating an active one, removing a node that is in no (or another)
    /// district, adding a node this district already holds, moving a gear to
    /// the node it is on. A repeated call after a crash lands here, so a saga
    /// treats it as done.
    AlreadyInState {
        /// What the tool printed.
        detail: String,
    },
    /// OpenShift refused for a reason of state: the saga must change
    /// something (or wait, see [`Cause::is_retryable`]) before trying again.
    Refused {
        /// The parsed reason.
        cause: Cause,
        /// What the tool printed.
        detail: String,
    },
    /// The tool failed without a refusal the parser knows (a crash, a usage
    /// error from a bad template, sudo refusing, a database update that did
    /// not apply, a copy that failed and was rolled back).
    Failed {
        /// What failed, as far as the parser can tell.
        failure: Failure,
        /// Whether running the same command again may succeed (from `failure`).
        retryable: bool,
        /// The end of what the tool printed.
        detail: String,
    },
    /// The tool outlived its timeout and its process group was killed. For a
    /// district command the effect is all or nothing and a retry is safe;
    /// for a move, the tool's rollback did not run: look where the gear is
    /// before moving it again.
    TimedOut,
}

impl Outcome {
    /// A failure, with `retryable` taken from its kind.
    pub fn failed(failure: Failure, detail: impl Into<String>) -> Outcome {
        Outcome::Failed {
            failure,
            retryable: failure.is_retryable(),
            detail: detail.into(),
        }
    }

    /// A command that never reached OpenShift (a refused value, a tool
    /// that cannot start), as the failure the sagas decide on.
    pub fn from_error(e: &super::PaasError) -> Outcome {
        use super::PaasError;
        let failure = match e {
            PaasError::BadValue { .. } => Failure::Usage,
            PaasError::Spawn { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                Failure::NotExecutable
            }
            PaasError::Spawn { .. } | PaasError::Wait { .. } => Failure::Unrecognized,
        };
        Outcome::Failed {
            failure,
            retryable: e.is_retryable(),
            detail: e.to_string(),
        }
    }

    /// A refusal.
    pub fn refused(cause: Cause, detail: impl Into<String>) -> Outcome {
        Outcome::Refused {
            cause,
            detail: detail.into(),
        }
    }

    /// The goal holds (done now or before).
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Done | Outcome::AlreadyInState { .. })
    }

    /// Whether the same call may succeed later without anything else
    /// changing first: an unreachable node, a transient failure, a timeout.
    pub fn is_retryable(&self) -> bool {
        match self {
            Outcome::Done | Outcome::AlreadyInState { .. } => false,
            Outcome::Refused { cause, .. } => cause.is_retryable(),
            Outcome::Failed { retryable, .. } => *retryable,
            Outcome::TimedOut => true,
        }
    }

    /// A short stable label for logs, metrics and explanations.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::AlreadyInState { .. } => "already_in_state",
            Outcome::Refused { cause, .. } => cause.label(),
            Outcome::Failed { failure, .. } => failure.label(),
            Outcome::TimedOut => "timed_out",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => f.write_str("done"),
            Outcome::AlreadyInState { detail } => write!(f, "already so: {detail}"),
            Outcome::Refused { cause, detail } => write!(f, "refused ({cause}): {detail}"),
            Outcome::Failed {
                failure,
                retryable,
                detail,
            } => {
                let again = if *retryable { "retryable" } else { "permanent" };
                write!(f, "failed ({failure}, {again}): {detail}")
            }
            Outcome::TimedOut => f.write_str("timed out (process group killed)"),
        }
    }
}

/// Why OpenShift refused. Each cause names the origin-server check that
/// raises it (`controller/app/models/district.rb`, `broker-util/*`, and the
/// MCollective proxy `mcollective_application_container_proxy.rb`, at
/// 7fd1910); the parser (`paas/parse/`) maps the tools' text to these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The node holds gears: add-node needs none (`district.rb:128`),
    /// remove-node needs none on the node (`:165-166`) nor in the broker's
    /// database (`:159-162`).
    NodeHasGears,
    /// remove-node needs the node deactivated first (`district.rb:155-157`).
    NodeActive,
    /// The node's profile is not the district's (add-node, `district.rb:129-130`),
    /// or a move would change a scalable application's profile (proxy `:2071-2075`).
    ProfileMismatch,
    /// The node is not in the district named (`district.rb:151-153`,
    /// `:186-188`, `:202-204`), or in none (`oo-admin-ctl-district:197`).
    NotInDistrict,
    /// add-node: the node is already in a district, and not this one as far
    /// as the tool's output shows (`district.rb:124-126`).
    InAnotherDistrict,
    /// The district does not exist (`oo-admin-ctl-district:143-149`), or
    /// add-node would have to create it and cannot (`district.rb:26-37`).
    UnknownDistrict,
    /// The profile is not a valid gear size (`oo-admin-ctl-district:134-137`).
    UnknownProfile,
    /// The node does not answer MCollective (`NodeException` 143, proxy
    /// `:3734`; add-node's `Cannot connect to node.`, `oo-admin-ctl-district:231`).
    NodeUnreachable,
    /// activate-node: the district marks the node unresponsive (`district.rb:207`);
    /// `oo-admin-repair` clears it.
    NodeUnresponsive,
    /// The node's platform (kernel) is not the district's or the source
    /// node's (`oo-admin-ctl-district:236-240`, proxy `:2051-2054`).
    PlatformMismatch,
    /// oo-admin-move: no application has this gear (`oo-admin-move:101-110`).
    GearNotFound,
    /// oo-admin-move: the target is in no district (proxy `:2064-2066`).
    TargetNotDistricted,
    /// oo-admin-move: the target is in another region (proxy `:2370-2372`).
    RegionMismatch,
    /// oo-admin-move: the target's disk would end over its buffer (proxy `:2415-2418`).
    TargetFull,
    /// oo-admin-move: the gear exceeds the target profile's quota (proxy `:2100`, `:2125`).
    QuotaExceeded,
    /// oo-admin-move into another district: the gear's UID is taken there (proxy `:273`).
    UidUnavailable,
}

impl Cause {
    /// Only an unreachable node may answer differently later without
    /// anything else changing; every other cause needs a change of state
    /// (or of the request) first.
    pub fn is_retryable(self) -> bool {
        matches!(self, Cause::NodeUnreachable)
    }

    /// A short stable label.
    pub fn label(self) -> &'static str {
        match self {
            Cause::NodeHasGears => "node_has_gears",
            Cause::NodeActive => "node_active",
            Cause::ProfileMismatch => "profile_mismatch",
            Cause::NotInDistrict => "not_in_district",
            Cause::InAnotherDistrict => "in_another_district",
            Cause::UnknownDistrict => "unknown_district",
            Cause::UnknownProfile => "unknown_profile",
            Cause::NodeUnreachable => "node_unreachable",
            Cause::NodeUnresponsive => "node_unresponsive",
            Cause::PlatformMismatch => "platform_mismatch",
            Cause::GearNotFound => "gear_not_found",
            Cause::TargetNotDistricted => "target_not_districted",
            Cause::RegionMismatch => "region_mismatch",
            Cause::TargetFull => "target_full",
            Cause::QuotaExceeded => "quota_exceeded",
            Cause::UidUnavailable => "uid_unavailable",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What kind of failure, as far as the parser can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The tool rejected its arguments (exit 255, or a required option
    /// missing): the template is wrong.
    Usage,
    /// sudo refused (no rule for this command, a password or a tty needed).
    NotPermitted,
    /// The command was not found or not executable behind a wrapper (exit
    /// 127 or 126).
    NotExecutable,
    /// OpenShift's database update did not apply (`Could not deactivate
    /// node S`, `district.rb:142`, `:174`, `:197`, `:212`).
    StoreUpdate,
    /// oo-admin-move's copy failed and the move was rolled back (`Error
    /// moving app ...`, proxy `:2438-2453`).
    CopyFailed,
    /// Killed by a signal the agent did not send.
    Signaled,
    /// Exit 0 without the line that says it worked.
    UnexpectedOutput,
    /// Any other failure: an exception the tool does not rescue (its broker
    /// environment, MongoDB or MCollective unavailable), or a refusal this
    /// parser does not know.
    Unrecognized,
}

impl Failure {
    /// A wrong template, a missing permission or tool, or output the parser
    /// cannot trust need an operator; the rest may pass.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Failure::StoreUpdate | Failure::CopyFailed | Failure::Signaled | Failure::Unrecognized
        )
    }

    /// A short stable label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Usage => "usage",
            Failure::NotPermitted => "not_permitted",
            Failure::NotExecutable => "not_executable",
            Failure::StoreUpdate => "store_update",
            Failure::CopyFailed => "copy_failed",
            Failure::Signaled => "signaled",
            Failure::UnexpectedOutput => "unexpected_output",
            Failure::Unrecognized => "unrecognized",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}
