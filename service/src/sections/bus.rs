//! `[bus]`: how an agent connects to the message bus.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_bus::{ConnectOptions, TlsOptions};
use serde::Serialize;
use serde::de::MapAccess;

use super::{Fields, Human, Part};
use crate::check;
use crate::config::{Invalid, duration};

/// An agent's own `[bus]` keys, and its reconnect defaults.
pub trait BusPart: Part {
    /// `reconnect_min` when the file does not set it.
    const RECONNECT_MIN: Duration;
    /// `reconnect_max` when the file does not set it.
    const RECONNECT_MAX: Duration;
}

/// `[bus]`: the connection settings of both agents, plus the agent's own
/// keys (`X`, reached by `Deref`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BusSection<X> {
    /// `amqp://…`, `amqps://…`, `stomp://…`, `stomp+ssl://…` or `memory://`.
    /// Default `amqp://guest:guest@127.0.0.1:5672/%2f`.
    pub url: String,
    /// Heart-beat interval proposed to the bus broker. Default `10s`.
    #[serde(with = "duration")]
    pub heartbeat: Duration,
    /// First reconnect delay; it doubles up to `reconnect_max`, forever.
    /// Default: the node's `500ms`, the broker agent's `100ms`.
    #[serde(with = "duration")]
    pub reconnect_min: Duration,
    /// Longest reconnect delay. Default: the node's `30s`, the broker
    /// agent's `2s`.
    #[serde(with = "duration")]
    pub reconnect_max: Duration,
    /// How long one bus operation may wait (including a reconnect). Default `30s`.
    #[serde(with = "duration")]
    pub op_timeout: Duration,
    /// How long one connection attempt may take. Default `10s`.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// PEM file of the CA that signed the bus broker's certificate, for
    /// TLS URLs. Default none (the system's roots).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate. Default none.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate. Default none.
    pub key_file: Option<PathBuf>,
    /// Name to check in the bus broker's certificate. Default: the URL's host.
    pub server_name: Option<String>,
    /// The agent's own keys.
    #[serde(flatten)]
    pub own: X,
}

const KEYS: &[&str] = &[
    "url",
    "heartbeat",
    "reconnect_min",
    "reconnect_max",
    "op_timeout",
    "connect_timeout",
    "ca_file",
    "cert_file",
    "key_file",
    "server_name",
];

impl<X: BusPart> Default for BusSection<X> {
    fn default() -> Self {
        BusSection {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            heartbeat: Duration::from_secs(10),
            reconnect_min: X::RECONNECT_MIN,
            reconnect_max: X::RECONNECT_MAX,
            op_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
            own: X::default(),
        }
    }
}

impl<X: BusPart> Fields for BusSection<X> {
    type Own = X;

    const SHARED: &'static [&'static str] = KEYS;

    fn read_shared<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "url" => self.url = map.next_value()?,
            "heartbeat" => self.heartbeat = map.next_value::<Human>()?.0,
            "reconnect_min" => self.reconnect_min = map.next_value::<Human>()?.0,
            "reconnect_max" => self.reconnect_max = map.next_value::<Human>()?.0,
            "op_timeout" => self.op_timeout = map.next_value::<Human>()?.0,
            "connect_timeout" => self.connect_timeout = map.next_value::<Human>()?.0,
            "ca_file" => self.ca_file = map.next_value()?,
            "cert_file" => self.cert_file = map.next_value()?,
            "key_file" => self.key_file = map.next_value()?,
            "server_name" => self.server_name = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn own_mut(&mut self) -> &mut X {
        &mut self.own
    }
}

super::section_with_part!(BusSection, BusPart);

impl<X: BusPart> BusSection<X> {
    /// Checks the section (no network, no files read).
    pub fn check(&self) -> Result<(), Invalid> {
        gearshift_bus::BusUrl::parse(&self.url)
            .map_err(|e| Invalid::new("bus.url", e.to_string()))?;
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        check::within("bus.heartbeat", self.heartbeat, Duration::ZERO, hour)?;
        check::within(
            "bus.reconnect_min",
            self.reconnect_min,
            ms(10),
            Duration::from_secs(600),
        )?;
        check::within(
            "bus.reconnect_max",
            self.reconnect_max,
            self.reconnect_min,
            hour,
        )?;
        check::within("bus.op_timeout", self.op_timeout, ms(100), hour)?;
        check::within("bus.connect_timeout", self.connect_timeout, ms(100), hour)?;
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(Invalid::new(
                "bus.cert_file",
                "bus.cert_file and bus.key_file go together",
            ));
        }
        self.own.check("bus")
    }
}

impl<X> BusSection<X> {
    /// The TLS settings of `amqps://` and `stomp+ssl://` URLs.
    pub fn tls(&self) -> TlsOptions {
        TlsOptions {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            server_name: self.server_name.clone(),
        }
    }

    /// The connection options; `name` is shown by the bus broker's
    /// management tools (`gearshift-node n1.example.com`).
    pub fn connect_options(&self, name: String) -> ConnectOptions {
        ConnectOptions {
            name,
            tls: self.tls(),
            heartbeat: self.heartbeat,
            reconnect_min: self.reconnect_min,
            reconnect_max: self.reconnect_max,
            op_timeout: self.op_timeout,
            connect_timeout: self.connect_timeout,
        }
    }
}
