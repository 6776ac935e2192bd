//! The operator side: `status`, `watch`, `ping`, `evacuate`, `abort`,
//! `do-not-disrupt`, as library functions the binary (and tests) call;
//! `controls.rs` the operator controls (`pause`, `resume`, `cordon`,
//! `uncordon`, `activate`, `drain`) and `history`; `enroll.rs` the offline
//! `enroll-token`.

pub mod controls;
pub mod enroll;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::Utc;
use gearshift_bus::{BusError, OutMessage, SharedBus};
use gearshift_proto::msg::{AdminReply, AdminRequest, Kind, Message, Ping, Role};
use gearshift_proto::sign::{Keyring, TimePolicy};
use gearshift_proto::{Decoded, Envelope, Expect, Gate, KeyPair, routing};
use thiserror::Error;

use crate::status::Status;

/// Why an operator command failed.
#[derive(Debug, Error)]
pub enum CliError {
    /// The bus failed or nobody answered in time.
    #[error("bus: {0}")]
    Bus(#[from] BusError),
    /// A key file could not be read.
    #[error(transparent)]
    Keys(#[from] gearshift_service::keys::KeyFileError),
    /// The answer is not an authentic `admin.reply`.
    #[error("bad reply: {0}")]
    BadReply(String),
    /// The broker agent refused the request.
    #[error("{0}")]
    Refused(String),
    /// The arguments do not make a request (or the history cannot be read).
    #[error("{0}")]
    Usage(String),
}

/// Keys of the operator side: the key that signs requests and the keys
/// replies must be signed with.
#[derive(Debug, Clone)]
pub struct OperatorKeys {
    /// Signs the request (role operator, or the broker key itself).
    pub signer: KeyPair,
    /// Trusted keys: the broker's, and with `--config` every key the broker
    /// agent trusts (so that `watch` verifies node reports and events too).
    pub brokers: Keyring,
}

impl OperatorKeys {
    /// Reads `key`; trusts `broker_pub` when given, else `broker.pub` next to
    /// `key` when it exists, else the signing key itself (when it is the broker's).
    pub fn load(key: &Path, broker_pub: Option<&Path>) -> Result<OperatorKeys, CliError> {
        let signer = gearshift_service::keys::load_keypair(key)?;
        let mut brokers = Keyring::new();
        let beside: PathBuf = key.with_file_name("broker.pub");
        match broker_pub {
            Some(p) => {
                gearshift_service::keys::trust(&mut brokers, p, Role::Broker)?;
            }
            None if beside.exists() => {
                gearshift_service::keys::trust(&mut brokers, &beside, Role::Broker)?;
            }
            None => {
                brokers.add(signer.public(), Role::Broker, key.display().to_string());
            }
        }
        Ok(OperatorKeys { signer, brokers })
    }
}

/// Sends one operator request on `key` (the broker agent's `agent.admin_key`;
/// `admin` by default) and returns the authenticated reply.
pub async fn admin_on(
    bus: &SharedBus,
    keys: &OperatorKeys,
    from: &str,
    key: &str,
    req: AdminRequest,
    timeout: Duration,
) -> Result<AdminReply, CliError> {
    let env = Envelope::new(from, req).with_ttl(timeout.max(Duration::from_secs(5)));
    let msg = OutMessage::new(key, keys.signer.seal(env)).transient();
    let d = bus.request(msg, timeout).await?;
    let reply = Gate::new(&keys.brokers, TimePolicy::default())
        .admit(
            &d.payload,
            Expect::kinds(|k| k == Kind::AdminReply),
            Utc::now(),
        )
        .map_err(|r| CliError::BadReply(r.to_string()))?;
    match reply.envelope.msg {
        Message::AdminReply(r) => Ok(r),
        other => Err(CliError::BadReply(format!(
            "expected admin.reply, got {}",
            other.kind()
        ))),
    }
}

/// `status`: the status report of the broker agent listening on `admin_key`.
pub async fn status(
    bus: &SharedBus,
    keys: &OperatorKeys,
    from: &str,
    admin_key: &str,
    timeout: Duration,
) -> Result<Status, CliError> {
    let r = admin_on(bus, keys, from, admin_key, AdminRequest::Status, timeout).await?;
    if !r.ok {
        return Err(CliError::Refused(r.message));
    }
    serde_json::from_value(r.data).map_err(|e| CliError::BadReply(format!("status: {e}")))
}

/// One answer to `ping`.
#[derive(Debug, Clone, PartialEq)]
pub struct PingAnswer {
    /// The agent.
    pub agent: String,
    /// `node` or `broker`.
    pub role: String,
    /// Its version.
    pub version: String,
    /// Round trip.
    pub rtt: Duration,
    /// Whether its signature checked out against `trust` (when given).
    pub verified: Option<bool>,
}

/// `ping`: every agent on the bus with its round trip, like `mco ping`.
/// Answers are timed as they arrive on a reply queue of our own.
pub async fn ping(
    bus: &SharedBus,
    signer: &KeyPair,
    from: &str,
    window: Duration,
    trust: Option<&Keyring>,
) -> Result<Vec<PingAnswer>, CliError> {
    let queue = format!("gearshift.reply.ping-{}", uuid::Uuid::new_v4().simple());
    let spec = gearshift_bus::QueueSpec::transient(queue.clone(), vec![]);
    let mut replies = bus
        .consume(&spec, gearshift_bus::ConsumeOptions { prefetch: 1024 })
        .await?;
    let env = Envelope::new(from, Ping {}).with_ttl(window.max(Duration::from_secs(5)));
    let id = env.id;
    let mut msg = OutMessage::new(routing::PING, signer.seal(env)).transient();
    msg.reply_to = Some(queue);
    msg.correlation_id = Some(id.to_string());
    let sent = Instant::now();
    bus.publish(msg).await?;
    let deadline = tokio::time::Instant::now() + window;
    let mut out = vec![];
    while let Ok(Some(d)) = tokio::time::timeout_at(deadline, replies.next()).await {
        let rtt = sent.elapsed();
        let payload = d.payload.clone();
        let _ = d.ack().await;
        let Ok(decoded) = Envelope::decode(&payload) else {
            continue;
        };
        let verified = trust.map(|k| signed_by(k, &decoded));
        if let Message::Pong(p) = decoded.envelope.msg
            && p.ping == id
        {
            out.push(PingAnswer {
                agent: p.agent,
                role: p.role,
                version: p.version,
                rtt,
                verified,
            });
        }
    }
    out.sort_by(|a, b| a.agent.cmp(&b.agent));
    Ok(out)
}

/// `watch`: prints decisions, explanations and node events until `stop`.
pub async fn watch(
    bus: &SharedBus,
    trust: &Keyring,
    explanations: bool,
    mut print: impl FnMut(String),
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), CliError> {
    let mut dec = bus.subscribe(routing::ALL_DECISIONS).await?;
    let mut exp = bus.subscribe(routing::ALL_EXPLANATIONS).await?;
    let mut ev = bus.subscribe(routing::ALL_EVENTS).await?;
    loop {
        let d = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            d = dec.next() => d,
            d = exp.next() => d,
            d = ev.next() => d,
        };
        let Some(d) = d else { return Ok(()) };
        let Ok(decoded) = Envelope::decode(&d.payload) else {
            continue;
        };
        let mark = if signed_by(trust, &decoded) {
            ""
        } else {
            " (UNVERIFIED)"
        };
        let e = decoded.envelope;
        let t = e.ts.format("%H:%M:%S%.3f");
        let line = match &e.msg {
            Message::Decision(x) => format!(
                "{t} DECISION {} {}/{}{}{}: {}{mark}",
                x.decision.as_str(),
                x.district,
                x.profile,
                x.op.as_ref().map(|o| format!(" {o}")).unwrap_or_default(),
                x.node
                    .as_ref()
                    .map(|n| format!(" node={n}"))
                    .unwrap_or_default(),
                x.reason
            ),
            Message::Explain(x) if explanations => format!(
                "{t} explain {}/{} {:?}: {} (usage {:.1} %, {} available){mark}",
                x.district,
                x.profile,
                x.outcome,
                x.summary,
                x.stats.usage_pct,
                x.stats.available_active_gears
            ),
            Message::Progress(p) => format!(
                "{t} progress {} {}: [{}] {}/{} moved, {} failed{mark}",
                e.from,
                e.corr.as_deref().unwrap_or("-"),
                crate::status::bar(p.moved + p.failed, p.total),
                p.moved,
                p.total,
                p.failed
            ),
            Message::Done(x) => format!(
                "{t} done {} {} {}{mark}",
                e.from,
                e.corr.as_deref().unwrap_or("-"),
                x.command
            ),
            Message::Failed(x) => format!(
                "{t} FAILED {} {} {}: {}{mark}",
                e.from,
                e.corr.as_deref().unwrap_or("-"),
                x.command,
                x.error
            ),
            Message::Refused(x) => {
                format!("{t} REFUSED by {}: {} {}{mark}", e.from, x.reason, x.detail)
            }
            _ => continue,
        };
        print(line);
    }
}

/// Whether a message seen on the bus passes the gate with `trust` (any kind,
/// any age): `ping` and `watch` show what does not as unverified rather than
/// hide it.
fn signed_by(trust: &Keyring, decoded: &Decoded) -> bool {
    Gate::new(trust, TimePolicy::default())
        .admit_decoded(decoded.clone(), Expect::any().any_age(), Utc::now())
        .is_ok()
}
