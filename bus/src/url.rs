//! Bus URLs: `memory://[name]`, `amqp[s]://user:pass@host:port/vhost`,
//! `stomp[+ssl]://user:pass@host:port[/vhost][?flavor=rabbitmq|activemq]`.
//!
//! Without `?flavor=`, a STOMP bus learns the broker from the `server`
//! header of its CONNECTED frame ([`StompFlavor::from_server`]); a named
//! flavor that the server contradicts is an error at connect.

use std::fmt;

use crate::error::BusError;

/// Which broker speaks STOMP on the other end; it decides the destination names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StompFlavor {
    /// RabbitMQ's STOMP plugin: `/exchange/gearshift/<key>`, `/amq/queue/<name>`.
    RabbitMq,
    /// ActiveMQ Classic: virtual topics `/topic/VirtualTopic.gearshift.<key>`,
    /// consumer queues `/queue/Consumer.<name>.VirtualTopic.gearshift.<pattern>`
    /// (see [`crate::stomp::dest`]). Artemis is taken for it too, untested.
    ActiveMq,
}

impl StompFlavor {
    /// The flavor a CONNECTED frame's `server` header names: `ActiveMQ/5.17.2`
    /// (and `ActiveMQ-Artemis/…`) or `RabbitMQ/3.10.8`; `None` for anything else.
    pub fn from_server(server: &str) -> Option<StompFlavor> {
        let product = server.split('/').next().unwrap_or_default().trim();
        if product.starts_with("ActiveMQ") {
            Some(StompFlavor::ActiveMq)
        } else if product.starts_with("RabbitMQ") {
            Some(StompFlavor::RabbitMq)
        } else {
            None
        }
    }

    /// The name used in `?flavor=`.
    pub fn name(self) -> &'static str {
        match self {
            StompFlavor::RabbitMq => "rabbitmq",
            StompFlavor::ActiveMq => "activemq",
        }
    }
}

/// A parsed bus URL.
#[derive(Clone, PartialEq, Eq)]
pub enum BusUrl {
    /// In-process bus; agents that use the same name share one broker.
    Memory {
        /// Broker name (empty for the default).
        name: String,
    },
    /// AMQP 0-9-1.
    Amqp {
        /// The URL as lapin takes it.
        url: String,
        /// `amqps`.
        tls: bool,
        /// Host.
        host: String,
        /// Port.
        port: u16,
    },
    /// STOMP 1.2.
    Stomp {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// Login.
        login: String,
        /// Passcode.
        passcode: String,
        /// Virtual host (`host` header); defaults to `/`.
        vhost: String,
        /// `stomp+ssl`.
        tls: bool,
        /// Destination naming: the flavor `?flavor=` names, or RabbitMQ when
        /// it names none and the server's CONNECTED frame does not say either.
        flavor: StompFlavor,
        /// `?flavor=` was given: the server must agree with it. Otherwise
        /// the CONNECTED frame's `server` header decides.
        flavor_named: bool,
    },
}

impl fmt::Debug for BusUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for BusUrl {
    /// Displays the URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BusUrl::Memory { name } => write!(f, "memory://{name}"),
            BusUrl::Amqp { url, .. } => f.write_str(&redact(url)),
            BusUrl::Stomp {
                host,
                port,
                login,
                tls,
                vhost,
                ..
            } => {
                let scheme = if *tls { "stomp+ssl" } else { "stomp" };
                write!(f, "{scheme}://{login}:***@{host}:{port}/{vhost}")
            }
        }
    }
}

/// Removes the password from a URL for logs.
pub fn redact(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparseable URL>".into(),
    }
}

impl BusUrl {
    /// Parses and validates a bus URL; no network access.
    pub fn parse(raw: &str) -> Result<BusUrl, BusError> {
        let err = |reason: &str| BusError::Url {
            url: redact(raw),
            reason: reason.to_string(),
        };
        let u = url::Url::parse(raw).map_err(|e| err(&e.to_string()))?;
        let pct = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| err("user or password is not valid UTF-8"))
        };
        match u.scheme() {
            "memory" => {
                let name = format!(
                    "{}{}",
                    u.host_str().unwrap_or(""),
                    u.path().trim_start_matches('/')
                );
                Ok(BusUrl::Memory { name })
            }
            "amqp" | "amqps" => {
                let tls = u.scheme() == "amqps";
                let host = u
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| err("missing host"))?;
                let port = u.port().unwrap_or(if tls { 5671 } else { 5672 });
                Ok(BusUrl::Amqp {
                    url: raw.to_string(),
                    tls,
                    host: host.to_string(),
                    port,
                })
            }
            "stomp" | "stomp+ssl" | "stomp+tls" => {
                let tls = u.scheme() != "stomp";
                let host = u
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| err("missing host"))?;
                let port = u.port().unwrap_or(if tls { 61614 } else { 61613 });
                let login = if u.username().is_empty() {
                    "guest".to_string()
                } else {
                    pct(u.username())?
                };
                let passcode = match u.password() {
                    Some(p) => pct(p)?,
                    None => "guest".to_string(),
                };
                let path = u.path().trim_start_matches('/');
                let vhost = if path.is_empty() {
                    "/".to_string()
                } else {
                    pct(path)?
                };
                let (flavor, flavor_named) = stomp_flavor(&u).map_err(|r| err(&r))?;
                Ok(BusUrl::Stomp {
                    host: host.to_string(),
                    port,
                    login,
                    passcode,
                    vhost,
                    tls,
                    flavor,
                    flavor_named,
                })
            }
            other => Err(err(&format!(
                "unknown scheme {other:?} (memory, amqp, amqps, stomp, stomp+ssl)"
            ))),
        }
    }
}

/// The `?flavor=` of a STOMP URL: the flavor (RabbitMQ when absent) and
/// whether it was named; `Err` with the reason for anything unknown.
fn stomp_flavor(u: &url::Url) -> Result<(StompFlavor, bool), String> {
    let mut found = (StompFlavor::RabbitMq, false);
    for (k, v) in u.query_pairs() {
        found = match (k.as_ref(), v.as_ref()) {
            ("flavor", "rabbitmq") => (StompFlavor::RabbitMq, true),
            ("flavor", "activemq") | ("flavor", "artemis") => (StompFlavor::ActiveMq, true),
            ("flavor", other) => {
                return Err(format!("unknown flavor {other:?} (rabbitmq or activemq)"));
            }
            (other, _) => return Err(format!("unknown query parameter {other:?}")),
        };
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            BusUrl::parse("memory://").unwrap(),
            BusUrl::Memory { name: "".into() }
        );
        assert_eq!(
            BusUrl::parse("memory://demo").unwrap(),
            BusUrl::Memory {
                name: "demo".into()
            }
        );
        match BusUrl::parse("amqps://u:p@h:1234/%2f").unwrap() {
            BusUrl::Amqp {
                tls, host, port, ..
            } => assert_eq!((tls, host.as_str(), port), (true, "h", 1234)),
            other => panic!("{other:?}"),
        }
        match BusUrl::parse("stomp+ssl://us%40r:p%3Ass@broker.example.com/vh?flavor=activemq")
            .unwrap()
        {
            BusUrl::Stomp {
                host,
                port,
                login,
                passcode,
                vhost,
                tls,
                flavor,
                flavor_named,
            } => {
                assert_eq!(host, "broker.example.com");
                assert_eq!(port, 61614);
                assert_eq!(login, "us@r");
                assert_eq!(passcode, "p:ss");
                assert_eq!(vhost, "vh");
                assert!(tls);
                assert_eq!(flavor, StompFlavor::ActiveMq);
                assert!(flavor_named);
            }
            other => panic!("{other:?}"),
        }
        match BusUrl::parse("stomp://h").unwrap() {
            BusUrl::Stomp {
                flavor,
                flavor_named,
                ..
            } => assert_eq!((flavor, flavor_named), (StompFlavor::RabbitMq, false)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_server_header_names_the_flavor() {
        for (server, want) in [
            ("ActiveMQ/5.17.2", Some(StompFlavor::ActiveMq)),
            (
                "ActiveMQ-Artemis/2.31.2 ActiveMQ Artemis Messaging Engine",
                Some(StompFlavor::ActiveMq),
            ),
            ("RabbitMQ/3.10.8", Some(StompFlavor::RabbitMq)),
            ("Apache/1.0", None),
            ("", None),
        ] {
            assert_eq!(StompFlavor::from_server(server), want, "{server}");
        }
    }

    #[test]
    fn refuses_bad_urls_and_hides_passwords() {
        for bad in [
            "http://x",
            "amqp://",
            "stomp://h?flavor=nope",
            "nonsense",
            "stomp://h?x=1",
        ] {
            assert!(BusUrl::parse(bad).is_err(), "{bad}");
        }
        let e = BusUrl::parse("ftp://u:secret@h").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        let shown = BusUrl::parse("stomp://u:secret@h").unwrap().to_string();
        assert!(!shown.contains("secret"), "{shown}");
    }
}
