//! One error type for every OpenStack call, classified once, where the
//! response is read, so callers decide by [`CloudError::is_retryable`],
//! [`CloudError::is_quota`] and [`CloudError::is_busy`] and never by text.
//!
//! The only place where text is read is the one "does this message name a
//! quota" function per API ([`nova_names_quota`], [`cinder_names_quota`],
//! [`heat_reason_names_quota`], [`magnum_reason_names_quota`]): the APIs
//! signal quota failures with a generic status (403, 413, or a `*_FAILED`
//! stack status) plus a documented phrase, so a phrase is all there is.

use std::time::Duration;

use thiserror::Error;

/// Which API an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Keystone v3.
    Identity,
    /// Nova.
    Compute,
    /// Cinder.
    BlockStorage,
    /// Heat (native API and pre-signed signal URLs).
    Orchestration,
    /// Magnum.
    ContainerInfra,
    /// Glance (image name look-ups).
    Image,
    /// Neutron (network name look-ups).
    Network,
    /// Gnocchi (pull mode's measures).
    Metric,
    /// A CloudWatch-compatible `PutMetricData` endpoint (heat-api-cloudwatch
    /// in the seeds' day; pull mode).
    CloudWatch,
}

impl Service {
    /// The catalog type this client looks for first.
    pub fn catalog_type(self) -> &'static str {
        match self {
            Service::Identity => "identity",
            Service::Compute => "compute",
            Service::BlockStorage => "block-storage",
            Service::Orchestration => "orchestration",
            Service::ContainerInfra => "container-infra",
            Service::Image => "image",
            Service::Network => "network",
            Service::Metric => "metric",
            Service::CloudWatch => "cloudwatch",
        }
    }

    /// Catalog types accepted for this service, in order of preference
    /// (the service-types authority's aliases).
    pub fn catalog_aliases(self) -> &'static [&'static str] {
        match self {
            Service::Identity => &["identity"],
            Service::Compute => &["compute"],
            Service::BlockStorage => &["block-storage", "volumev3", "volume"],
            Service::Orchestration => &["orchestration"],
            Service::ContainerInfra => &["container-infra", "container-infrastructure-management"],
            Service::Image => &["image"],
            Service::Network => &["network"],
            Service::Metric => &["metric"],
            Service::CloudWatch => &["cloudwatch"],
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Identity => "keystone",
            Service::Compute => "nova",
            Service::BlockStorage => "cinder",
            Service::Orchestration => "heat",
            Service::ContainerInfra => "magnum",
            Service::Image => "glance",
            Service::Network => "neutron",
            Service::Metric => "gnocchi",
            Service::CloudWatch => "cloudwatch",
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed cloud call.
#[derive(Debug, Clone, Error)]
pub enum CloudError {
    /// Credentials, `clouds.yaml`, a missing catalog entry or a bad argument:
    /// an operator must fix it.
    #[error("cloud configuration: {0}")]
    Config(String),
    /// The API answered with an error status.
    #[error("{service} {method} {url}: HTTP {status}: {message}")]
    Api {
        /// Which API.
        service: Service,
        /// HTTP method.
        method: String,
        /// Request URL (pre-signed query strings removed).
        url: String,
        /// HTTP status code.
        status: u16,
        /// The API's error message (from its documented error body), bounded.
        message: String,
        /// The API's documented quota signal was present.
        quota: bool,
        /// The API reported a conflicting operation in progress (Heat
        /// `ActionInProgress`, Nova/Cinder 409 on a busy resource).
        busy: bool,
        /// The error type the body names, when it names one: Heat's
        /// `error.type` (`ResourceNotFound` for a missing resource,
        /// `EntityNotFound` for a missing stack, `ActionInProgress`), an
        /// AWS-style XML `<Code>` (`AccessDenied`), Nova's fault name.
        kind: Option<String>,
    },
    /// No HTTP answer: connection refused or reset, TLS failure, timeout.
    #[error("{service} {url}: {message}")]
    Transport {
        /// Which API.
        service: Service,
        /// Request URL (pre-signed query strings removed).
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The answer did not have the documented shape (or was too large).
    #[error("{service} {url}: unexpected response: {message}")]
    Decode {
        /// Which API.
        service: Service,
        /// Request URL (pre-signed query strings removed).
        url: String,
        /// What did not fit.
        message: String,
    },
    /// The resource is busy with another operation (a Heat stack or Magnum
    /// cluster `*_IN_PROGRESS`): we refuse to act now, later may work.
    #[error("{what} is busy ({state}): refusing to act until it settles")]
    Busy {
        /// The resource.
        what: String,
        /// Its state.
        state: String,
    },
    /// The resource ended in (or already is in) a failed state.
    #[error("{what} is {state}: {reason}")]
    Failed {
        /// The resource.
        what: String,
        /// Its state (`UPDATE_FAILED`, `ERROR`, ...).
        state: String,
        /// The cloud's reason, bounded.
        reason: String,
        /// The reason names a quota (per the API's documented phrases).
        quota: bool,
    },
    /// Heat answered a scaling signal with 200 and then did nothing (or
    /// would have: the group was checked before signalling). Heat writes no
    /// event for an ignored signal, so this is found by watching the group.
    #[error("{what}: Heat accepted the signal but does not scale: {why}")]
    SignalIgnored {
        /// The group and policy.
        what: String,
        /// Why, as far as the group's state tells.
        why: Ignored,
    },
    /// gearshift refuses the call because Heat would do more than asked
    /// (replace every member, remove another member than the chosen one):
    /// the template or the configuration must change. Never retried.
    #[error("{what}: refused: {reason}")]
    Refused {
        /// The stack or group.
        what: String,
        /// What Heat would do, and what to change.
        reason: String,
    },
    /// heat-api-cfn refused a pre-signed URL: XML `AccessDenied` (403: the
    /// signature does not match, or its EC2 key is gone) or
    /// `IncompleteSignature` (400: the query lost its signature).
    #[error(
        "{url}: HTTP {status} {code}: {message} (the pre-signed URL is no longer valid: read the policy's alarm_url again)"
    )]
    PresignedRefused {
        /// The URL, without its query.
        url: String,
        /// HTTP status.
        status: u16,
        /// The XML error `Code`.
        code: String,
        /// The XML error `Message`.
        message: String,
    },
    /// Waited too long for a resource to reach a state.
    #[error("timed out after {waited:?} waiting for {what} (last state {last_state})")]
    Timeout {
        /// The resource and the awaited state.
        what: String,
        /// How long we waited.
        waited: Duration,
        /// The state seen last.
        last_state: String,
    },
}

/// Why Heat ignores (or would ignore) a scaling signal: its
/// `NoActionRequired` cases (`heat/scaling/cooldown.py`,
/// `autoscaling_group.py` `adjust`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    /// The group's `cooldown_end` (metadata) is in the future.
    Cooldown {
        /// When the cooldown ends (Heat's UTC time, as written).
        until: String,
    },
    /// The group's metadata says `scaling_in_progress`.
    Scaling,
    /// A scale-up with the group at `max_size`.
    AtMax {
        /// The group's `max_size`.
        max: i64,
    },
    /// A scale-down with the group at `min_size`.
    AtMin {
        /// The group's `min_size`.
        min: i64,
    },
    /// Nothing started within the bound and the group's state does not say
    /// why (a slow engine, or a limit gearshift could not read).
    Unexplained {
        /// How long we watched.
        waited: Duration,
    },
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ignored::Cooldown { until } => {
                write!(f, "the group is in its cooldown until {until} UTC")
            }
            Ignored::Scaling => f.write_str("the group is already scaling"),
            Ignored::AtMax { max } => write!(f, "the group is at its max_size {max}"),
            Ignored::AtMin { min } => write!(f, "the group is at its min_size {min}"),
            Ignored::Unexplained { waited } => write!(
                f,
                "nothing started within {waited:?} (no scaling_in_progress, no update, no policy event)"
            ),
        }
    }
}

impl CloudError {
    /// The HTTP status, when the API answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            CloudError::Api { status, .. } | CloudError::PresignedRefused { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }

    /// The error type the API's body named (see [`CloudError::Api`]'s `kind`).
    pub fn kind(&self) -> Option<&str> {
        match self {
            CloudError::Api { kind, .. } => kind.as_deref(),
            CloudError::PresignedRefused { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Heat said the *resource* is missing (`ResourceNotFound`), as opposed
    /// to its stack (`EntityNotFound`).
    pub fn is_resource_not_found(&self) -> bool {
        self.is_not_found() && self.kind() == Some("ResourceNotFound")
    }

    /// The cloud refused for lack of quota (a group at its `max_size`
    /// counts: the group is exhausted until an operator raises it).
    pub fn is_quota(&self) -> bool {
        match self {
            CloudError::Api { quota, .. } | CloudError::Failed { quota, .. } => *quota,
            CloudError::SignalIgnored {
                why: Ignored::AtMax { .. },
                ..
            } => true,
            _ => false,
        }
    }

    /// The target is busy with another operation (or in its cooldown); try later.
    pub fn is_busy(&self) -> bool {
        match self {
            CloudError::Busy { .. } => true,
            CloudError::Api { busy, .. } => *busy,
            CloudError::SignalIgnored { why, .. } => {
                matches!(why, Ignored::Cooldown { .. } | Ignored::Scaling)
            }
            _ => false,
        }
    }

    /// The resource does not exist (HTTP 404). Keystone's 404s (an unknown
    /// application credential) are authentication failures, not this: a
    /// caller must never read them as "the server is gone".
    pub fn is_not_found(&self) -> bool {
        match self {
            CloudError::Api {
                status: 404,
                service,
                ..
            } => *service != Service::Identity,
            _ => false,
        }
    }

    /// Whether the same call may succeed later without an operator:
    /// transport failures, timeouts, 408/429/5xx, busy targets, and quota
    /// (capacity may come back). Other 4xx, configuration and decode errors
    /// and failed resources are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            CloudError::Config(_)
            | CloudError::Decode { .. }
            | CloudError::Refused { .. }
            | CloudError::PresignedRefused { .. } => false,
            CloudError::Transport { .. } | CloudError::Timeout { .. } | CloudError::Busy { .. } => {
                true
            }
            CloudError::SignalIgnored { why, .. } => !matches!(why, Ignored::AtMin { .. }),
            CloudError::Api {
                status,
                quota,
                busy,
                ..
            } => *quota || *busy || matches!(status, 408 | 429 | 500..=599),
            CloudError::Failed { quota, .. } => *quota,
        }
    }
}

/// Longest error message kept from a response.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// Truncates `s` to [`MAX_ERROR_MESSAGE`] bytes on a character boundary.
pub(crate) fn bounded(s: &str) -> String {
    if s.len() <= MAX_ERROR_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_ERROR_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Nova: a 403 or 413 whose message carries the documented quota phrase
/// ("Quota exceeded for instances: Requested 1, but already used 10 of 10
/// instances", older releases: "Quota exceeded for cores ...",
/// `InstanceLimitExceeded`/`overLimit` bodies).
pub fn nova_names_quota(status: u16, message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    matches!(status, 403 | 413)
        && (m.contains("quota exceeded")
            || m.contains("quotaexceeded")
            || m.contains("instancelimitexceeded")
            || m.contains("maximum number of"))
}

/// Cinder: 413 `overLimit` ("VolumeLimitExceeded: Maximum number of volumes
/// allowed (10) exceeded for quota 'volumes'", "VolumeSizeExceedsAvailableQuota:
/// Requested volume or snapshot exceeds allowed gigabytes quota").
pub fn cinder_names_quota(status: u16, message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    status == 413
        || (matches!(status, 400 | 403)
            && (m.contains("exceeds allowed")
                || m.contains("limitexceeded")
                || m.contains("quota")))
}

/// Heat: a `*_FAILED` stack or resource reason that carries a nested
/// service's quota failure ("Quota exceeded for instances", "OverQuota",
/// "QuotaError", "exceeds allowed gigabytes quota", "InstanceLimitExceeded").
pub fn heat_reason_names_quota(reason: &str) -> bool {
    let m = reason.to_ascii_lowercase();
    m.contains("quota exceeded")
        || m.contains("overquota")
        || m.contains("over quota")
        || m.contains("quotaerror")
        || m.contains("exceeds allowed")
        || m.contains("limitexceeded")
        || m.contains("quota_exceeded")
}

/// Heat: a stack update that failed because another update superseded it
/// ("Stack UPDATE cancelled" in the reason; the convergence engine lets a
/// new PATCH replace a running update): a conflict, not a failure of the
/// stack.
pub fn heat_reason_names_cancel(reason: &str) -> bool {
    reason.to_ascii_lowercase().contains("update cancelled")
}

/// Magnum: a cluster/nodegroup `status_reason` or API error naming a quota
/// (Magnum relays Heat's and Nova's reasons, and has its own
/// "Quota exceeded" for its cluster quota).
pub fn magnum_reason_names_quota(reason: &str) -> bool {
    heat_reason_names_quota(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, quota: bool, busy: bool) -> CloudError {
        CloudError::Api {
            service: Service::Compute,
            method: "POST".into(),
            url: "http://x/servers".into(),
            status,
            message: "m".into(),
            quota,
            busy,
            kind: None,
        }
    }

    #[test]
    fn classification() {
        assert!(api(503, false, false).is_retryable());
        assert!(api(429, false, false).is_retryable());
        assert!(!api(400, false, false).is_retryable());
        assert!(!api(404, false, false).is_retryable());
        assert!(api(404, false, false).is_not_found());
        assert!(api(403, true, false).is_quota());
        assert!(api(403, true, false).is_retryable());
        assert!(api(409, false, true).is_busy());
        assert!(!CloudError::Config("x".into()).is_retryable());
        assert_eq!(api(413, false, false).status(), Some(413));
        assert_eq!(CloudError::Config("x".into()).status(), None);
        let keystone_404 = CloudError::Api {
            service: Service::Identity,
            method: "POST".into(),
            url: "http://k/v3/auth/tokens".into(),
            status: 404,
            message: "Could not find Application Credential".into(),
            quota: false,
            busy: false,
            kind: None,
        };
        assert!(!keystone_404.is_not_found(), "never 'the server is gone'");
        let ignored = |why| CloudError::SignalIgnored {
            what: "g".into(),
            why,
        };
        let cooldown = ignored(Ignored::Cooldown { until: "t".into() });
        assert!(cooldown.is_busy() && cooldown.is_retryable());
        let at_max = ignored(Ignored::AtMax { max: 3 });
        assert!(at_max.is_quota() && at_max.is_retryable() && !at_max.is_busy());
        assert!(!ignored(Ignored::AtMin { min: 1 }).is_retryable());
        assert!(heat_reason_names_cancel(
            "Resource UPDATE failed: resources.asg: Stack UPDATE cancelled"
        ));
    }

    #[test]
    fn quota_phrases() {
        assert!(nova_names_quota(
            403,
            "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"
        ));
        assert!(nova_names_quota(
            413,
            "Quota exceeded for cores: Requested 4, but already used 20 of 20 cores"
        ));
        assert!(!nova_names_quota(
            403,
            "Policy doesn't allow os_compute_api:servers:create"
        ));
        assert!(!nova_names_quota(500, "Quota exceeded"));
        assert!(cinder_names_quota(413, "VolumeLimitExceeded"));
        assert!(heat_reason_names_quota(
            "Resource CREATE failed: OverQuotaClient: resources.group.resources[2]: Quota exceeded for instances"
        ));
        assert!(!heat_reason_names_quota(
            "Resource CREATE failed: Flavor m1.huge could not be found"
        ));
    }

    #[test]
    fn bounded_keeps_char_boundaries() {
        let s = "é".repeat(MAX_ERROR_MESSAGE);
        let b = bounded(&s);
        assert!(b.len() <= MAX_ERROR_MESSAGE + 3);
        assert!(b.ends_with("..."));
    }
}
