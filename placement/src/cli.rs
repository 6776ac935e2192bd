//! `gearshift-broker place`: ask the broker agent's placement service where
//! a gear would go, over the bus, as an operator.
//!
//! ```text
//! gearshift-broker place --app blog --login alice --web-cartridge php-5.4 \
//!     --component redhat/php-5.4 --profile small
//! gearshift-broker place --input request.json --json
//! ```
//!
//! Without `--node` (and without `nodes` in the input), the broker agent
//! uses the fleet as it knows it. The request is signed with the operator's
//! key; the reply must be signed by a trusted broker key.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::{BusError, ConnectOptions, OutMessage, SharedBus};
use gearshift_proto::msg::{
    ComponentProperties, Kind, Message, NodeProperties, PlacementReply, PlacementRequest, Role,
    Validate,
};
use gearshift_proto::sign::{KeyPair, Keyring, TimePolicy};
use gearshift_proto::{Envelope, Expect, Gate, Step, routing};
use gearshift_service::keys::KeyFileError;
use thiserror::Error;

/// Arguments of `gearshift-broker place`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlaceArgs {
    /// JSON file holding a `placement.request` body (`-` reads standard
    /// input); the flags below override its fields.
    #[arg(long, short = 'f', value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Application name (required without --input).
    #[arg(long)]
    pub app: Option<String>,
    /// Application id. Default: the name.
    #[arg(long)]
    pub app_id: Option<String>,
    /// The application's web cartridge, for example php-5.4.
    #[arg(long)]
    pub web_cartridge: Option<String>,
    /// The application is scaled.
    #[arg(long)]
    pub scalable: bool,
    /// The application is highly available.
    #[arg(long)]
    pub ha: bool,
    /// The owner's login.
    #[arg(long)]
    pub login: Option<String>,
    /// A component of the new gear, as VENDOR/CARTRIDGE or CARTRIDGE (repeatable).
    #[arg(long = "component", value_name = "VENDOR/CARTRIDGE")]
    pub components: Vec<String>,
    /// Required gear profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// Required region.
    #[arg(long)]
    pub region: Option<String>,
    /// A candidate node, optionally with its consumed capacity in percent
    /// (repeatable). Default: the fleet as the broker agent knows it.
    #[arg(long = "node", value_name = "NAME[=PERCENT]")]
    pub nodes: Vec<String>,
    /// Strategy to use instead of the configured one.
    #[arg(long)]
    pub strategy: Option<String>,
    /// Bus URL.
    #[arg(
        long,
        env = "GEARSHIFT_BUS",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub bus: String,
    /// The operator's private key (PKCS#8 PEM) that signs the request.
    #[arg(
        long,
        env = "GEARSHIFT_OPERATOR_KEY",
        default_value = "/etc/gearshift/operator.key"
    )]
    pub key: PathBuf,
    /// The broker agent's public key, to verify the reply.
    #[arg(
        long,
        env = "GEARSHIFT_BROKER_PUB",
        default_value = "/etc/gearshift/broker.pub"
    )]
    pub broker_pub: PathBuf,
    /// Sender name in the request's envelope.
    #[arg(long, default_value = "gearshift-place")]
    pub from: String,
    /// How long to wait for the answer.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print the reply as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why `place` did not print a placement.
#[derive(Debug, Error)]
pub enum PlaceError {
    /// The request could not be built from the input file or flags.
    #[error("{0}")]
    Input(String),
    /// A key file could not be read.
    #[error(transparent)]
    Keys(#[from] KeyFileError),
    /// The bus failed (connect, publish, or no answer in time).
    #[error("bus: {0}")]
    Bus(#[from] BusError),
    /// The answer is not a valid, authenticated `placement.reply` to our request.
    #[error("bad reply: {0}")]
    BadReply(String),
    /// The placement service refused (the reason was printed).
    #[error("refused: {0}")]
    Refused(String),
}

impl PlaceError {
    /// Exit code for the CLI: 2 for a refusal, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            PlaceError::Refused(_) => 2,
            _ => 1,
        }
    }
}

/// Largest input file accepted (the envelope limit).
const MAX_INPUT: u64 = gearshift_proto::envelope::MAX_MESSAGE_BYTES as u64;

/// Builds the request from `--input` and the flags.
pub fn build_request(args: &PlaceArgs) -> Result<PlacementRequest, PlaceError> {
    let mut v = match &args.input {
        Some(p) => {
            let mut text = String::new();
            let r = if p.as_os_str() == "-" {
                std::io::stdin()
                    .take(MAX_INPUT + 1)
                    .read_to_string(&mut text)
            } else {
                std::fs::File::open(p).and_then(|f| f.take(MAX_INPUT + 1).read_to_string(&mut text))
            };
            r.map_err(|e| PlaceError::Input(format!("{}: {e}", p.display())))?;
            if text.len() as u64 > MAX_INPUT {
                return Err(PlaceError::Input(format!(
                    "{}: larger than {MAX_INPUT} bytes",
                    p.display()
                )));
            }
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| PlaceError::Input(format!("{}: not JSON: {e}", p.display())))?;
            if !v.is_object() {
                return Err(PlaceError::Input(format!(
                    "{}: expected a JSON object (a placement.request body)",
                    p.display()
                )));
            }
            v
        }
        None => {
            if args.app.is_none() {
                return Err(PlaceError::Input("give --app NAME or --input FILE".into()));
            }
            serde_json::json!({})
        }
    };
    // Fill what a hand-written file may leave out.
    let obj = v
        .as_object_mut()
        .ok_or_else(|| PlaceError::Input("not an object".into()))?;
    obj.entry("nodes").or_insert_with(|| serde_json::json!([]));
    obj.entry("app")
        .or_insert_with(|| serde_json::json!({"id": "", "name": ""}));
    obj.entry("user")
        .or_insert_with(|| serde_json::json!({"id": "", "login": ""}));
    obj.entry("request_time")
        .or_insert_with(|| serde_json::json!(gearshift_proto::envelope::format_ts(Utc::now())));
    let mut req: PlacementRequest = serde_json::from_value(v)
        .map_err(|e| PlaceError::Input(format!("not a placement request: {e}")))?;

    if let Some(a) = &args.app {
        req.app.name = a.clone();
        if req.app.id.is_empty() {
            req.app.id = a.clone();
        }
    }
    if let Some(id) = &args.app_id {
        req.app.id = id.clone();
    }
    if args.web_cartridge.is_some() {
        req.app.web_cartridge = args.web_cartridge.clone();
    }
    req.app.scalable |= args.scalable;
    req.app.ha |= args.ha;
    if let Some(l) = &args.login {
        req.user.login = l.clone();
        if req.user.id.is_empty() {
            req.user.id = l.clone();
        }
    }
    for c in &args.components {
        let (vendor, cart) = c.split_once('/').unwrap_or(("", c.as_str()));
        if cart.is_empty() {
            return Err(PlaceError::Input(format!(
                "--component {c:?}: empty cartridge"
            )));
        }
        req.components.push(ComponentProperties {
            cartridge_name: cart.to_string(),
            component_name: cart.to_string(),
            version: String::new(),
            cartridge_vendor: vendor.to_string(),
        });
    }
    if args.profile.is_some() {
        req.profile = args.profile.clone();
    }
    if args.region.is_some() {
        req.region = args.region.clone();
    }
    if args.strategy.is_some() {
        req.strategy = args.strategy.clone();
    }
    for spec in &args.nodes {
        req.nodes.push(parse_node(spec)?);
    }
    req.validate()
        .map_err(|e| PlaceError::Input(format!("invalid request: {e}")))?;
    Ok(req)
}

fn parse_node(spec: &str) -> Result<NodeProperties, PlaceError> {
    let (name, pct) = match spec.split_once('=') {
        Some((n, p)) => {
            let pct: f64 = p
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && (0.0..=100.0).contains(x))
                .ok_or_else(|| {
                    PlaceError::Input(format!("--node {spec:?}: {p:?} is not a percentage"))
                })?;
            (n, pct)
        }
        None => (spec, 0.0),
    };
    if name.is_empty() {
        return Err(PlaceError::Input(format!("--node {spec:?}: empty name")));
    }
    Ok(NodeProperties {
        name: name.to_string(),
        node_consumed_capacity: pct,
        district_id: None,
        district_available_capacity: None,
        region_id: None,
        zone_id: None,
        profile: None,
        active: true,
        mem_free_mb: None,
        gears_active: None,
        max_active_gears: None,
    })
}

/// Sends `req` as a signed `placement.request` under routing key `key`
/// (normally [`routing::PLACEMENT`]) and returns the verified reply.
pub async fn request_placement(
    bus: &SharedBus,
    key: &str,
    signer: &KeyPair,
    from: &str,
    trusted: &Keyring,
    req: PlacementRequest,
    timeout: Duration,
) -> Result<PlacementReply, PlaceError> {
    let env = Envelope::new(from, req).with_ttl(timeout.max(Duration::from_secs(1)));
    let id = env.id.to_string();
    let msg = OutMessage::new(key, signer.seal(env)).transient();
    let d = bus.request(msg, timeout).await?;
    const REPLIES: Expect = Expect::kinds(|k| k == Kind::PlacementReply).roles(&[Role::Broker]);
    let reply = Gate::new(trusted, TimePolicy::default())
        .admit(&d.payload, REPLIES, Utc::now())
        .map_err(|r| match r.step {
            Step::Auth | Step::Time => {
                PlaceError::BadReply(format!("not authenticated: {}", r.detail))
            }
            _ => PlaceError::BadReply(r.to_string()),
        })?
        .envelope;
    if reply.corr.as_deref() != Some(id.as_str()) {
        return Err(PlaceError::BadReply(format!(
            "answers request {:?}, not {id}",
            reply.corr
        )));
    }
    match reply.msg {
        Message::PlacementReply(r) => Ok(r),
        other => Err(PlaceError::BadReply(format!("unexpected {}", other.kind()))),
    }
}

/// The reply as the CLI prints it.
pub fn format_reply(r: &PlacementReply, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(r).unwrap_or_default();
    }
    let mut out = match (&r.node, &r.refused) {
        (Some(n), _) => format!(
            "{n}\n  strategy {}, {} candidates after the filters\n",
            if r.strategy.is_empty() {
                "-"
            } else {
                &r.strategy
            },
            r.candidates
        ),
        (None, Some(why)) => format!(
            "refused: {why}\n  strategy {}, {} candidates after the filters\n",
            if r.strategy.is_empty() {
                "-"
            } else {
                &r.strategy
            },
            r.candidates
        ),
        (None, None) => "no answer\n".to_string(),
    };
    const SHOWN: usize = 20;
    for f in r.filtered.iter().take(SHOWN) {
        out.push_str(&format!("  filtered {} ({})\n", f.node, f.filter));
    }
    if r.filtered.len() > SHOWN {
        out.push_str(&format!(
            "  ... and {} more filtered\n",
            r.filtered.len() - SHOWN
        ));
    }
    out
}

/// `gearshift-broker place`: builds the request, asks over the bus, prints
/// the answer. A refusal is printed and returned as [`PlaceError::Refused`].
pub async fn run_place(args: PlaceArgs) -> Result<(), PlaceError> {
    let req = build_request(&args)?;
    let signer = gearshift_service::keys::load_keypair(&args.key)?;
    let trusted =
        gearshift_service::keys::load_keyring([(Role::Broker, args.broker_pub.as_path())])?;
    let bus = gearshift_bus::connect(
        &args.bus,
        ConnectOptions {
            name: "gearshift-place".into(),
            connect_timeout: args.timeout,
            op_timeout: args.timeout,
            ..Default::default()
        },
    )
    .await?;
    let r = request_placement(
        &bus,
        routing::PLACEMENT,
        &signer,
        &args.from,
        &trusted,
        req,
        args.timeout,
    )
    .await;
    bus.close().await;
    let reply = r?;
    print!("{}", format_reply(&reply, args.json));
    if args.json {
        println!();
    }
    match reply.refused {
        Some(why) if reply.node.is_none() => Err(PlaceError::Refused(why)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        place: PlaceArgs,
    }

    fn args(v: &[&str]) -> PlaceArgs {
        Cli::try_parse_from(std::iter::once("place").chain(v.iter().copied()))
            .unwrap()
            .place
    }

    #[test]
    fn flags_build_a_request() {
        let a = args(&[
            "--app",
            "blog",
            "--login",
            "alice",
            "--web-cartridge",
            "php-5.4",
            "--component",
            "redhat/php-5.4",
            "--component",
            "mysql-5.5",
            "--node",
            "n1=40",
            "--node",
            "n2",
            "--profile",
            "small",
            "--scalable",
            "--strategy",
            "first",
        ]);
        let r = build_request(&a).unwrap();
        assert_eq!(r.app.name, "blog");
        assert_eq!(r.app.id, "blog");
        assert!(r.app.scalable && !r.app.ha);
        assert_eq!(r.user.login, "alice");
        assert_eq!(r.components.len(), 2);
        assert_eq!(r.components[0].cartridge_vendor, "redhat");
        assert_eq!(r.components[1].cartridge_vendor, "");
        assert_eq!(r.nodes[0].node_consumed_capacity, 40.0);
        assert_eq!(r.nodes[1].name, "n2");
        assert_eq!(r.profile.as_deref(), Some("small"));
        assert_eq!(r.strategy.as_deref(), Some("first"));
    }

    #[test]
    fn input_file_with_overrides_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("req.json");
        std::fs::write(
            &p,
            r#"{"nodes":[{"name":"a"}],"app":{"id":"1","name":"x"},"user":{"id":"u","login":"bob"}}"#,
        )
        .unwrap();
        let r =
            build_request(&args(&["--input", p.to_str().unwrap(), "--login", "carol"])).unwrap();
        assert_eq!(r.nodes.len(), 1);
        assert_eq!(r.user.login, "carol");
        assert_eq!(r.user.id, "u");

        assert!(build_request(&args(&[])).is_err());
        assert!(build_request(&args(&["--app", "x", "--node", "n=150"])).is_err());
        assert!(build_request(&args(&["--app", "x", "--node", "=5"])).is_err());
        std::fs::write(&p, "[1]").unwrap();
        assert!(build_request(&args(&["--input", p.to_str().unwrap()])).is_err());
        std::fs::write(&p, "{not json").unwrap();
        assert!(build_request(&args(&["--input", p.to_str().unwrap()])).is_err());
    }

    #[test]
    fn human_output() {
        let r = PlacementReply {
            node: None,
            refused: Some("nope".into()),
            strategy: "first".into(),
            candidates: 0,
            filtered: (0..25)
                .map(|i| gearshift_proto::msg::FilteredNode {
                    node: format!("n{i}"),
                    filter: "full".into(),
                })
                .collect(),
        };
        let s = format_reply(&r, false);
        assert!(s.starts_with("refused: nope\n"));
        assert!(s.contains("filtered n0 (full)"));
        assert!(s.contains("... and 5 more filtered"));
        let j: serde_json::Value = serde_json::from_str(&format_reply(&r, true)).unwrap();
        assert_eq!(j["refused"], "nope");
    }
}
