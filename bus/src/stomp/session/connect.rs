//! Opening a session (STOMP 1.2, no socket): the CONNECT frame, heart-beat
//! negotiation, the broker's flavor, and how its answers are classified.

use std::time::Duration;

use crate::error::BusError;
use crate::stomp::frame::{Command, Frame};
use crate::url::StompFlavor;

/// A peer is declared dead after this many of its heart-beat intervals of
/// silence. Three, because ActiveMQ sends its first beat two intervals after
/// CONNECTED and then one every interval exactly (measured): two would call
/// it dead at the first ordinary jitter. ActiveMQ itself drops a client
/// after three silent intervals; the margin is one whole interval.
pub const PEER_SILENCE_FACTOR: u32 = 3;

/// What the two sides agreed on (STOMP 1.2, "Heart-beating").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeartBeats {
    /// We send something (a frame or an EOL) at least this often.
    pub send_every: Option<Duration>,
    /// The broker promised to send something at least this often.
    pub expect_every: Option<Duration>,
}

impl HeartBeats {
    /// After how much silence the broker is declared dead.
    pub fn peer_timeout(&self) -> Option<Duration> {
        self.expect_every.map(|d| d * PEER_SILENCE_FACTOR)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `heart-beat` header we send: we can send every `ours` and want to
/// receive every `ours` (0 disables both).
pub fn heart_beat_header(ours: Duration) -> String {
    let ms = millis(ours);
    format!("{ms},{ms}")
}

/// Parses a `heart-beat` header value `cx,cy`.
pub fn parse_heart_beat(value: &str) -> Option<(u64, u64)> {
    let (a, b) = value.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// Negotiates heart-beats from what we proposed (`ours` both ways) and the
/// CONNECTED frame's `heart-beat` header (`sx,sy`; absent means `0,0`).
pub fn negotiate(ours: Duration, server: Option<&str>) -> Result<HeartBeats, BusError> {
    let (sx, sy) = match server {
        None => (0, 0),
        Some(v) => parse_heart_beat(v)
            .ok_or_else(|| BusError::Protocol(format!("bad heart-beat header {v:?}")))?,
    };
    let (cx, cy) = (millis(ours), millis(ours));
    let pick = |a: u64, b: u64| (a != 0 && b != 0).then(|| Duration::from_millis(a.max(b)));
    Ok(HeartBeats {
        send_every: pick(cx, sy),
        expect_every: pick(sx, cy),
    })
}

/// The CONNECT frame (accept-version 1.2 only).
pub fn connect_frame(host: &str, login: &str, passcode: &str, heartbeat: Duration) -> Frame {
    Frame::new(Command::Connect)
        .header("accept-version", "1.2")
        .header("host", host)
        .header("login", login)
        .header("passcode", passcode)
        .header("heart-beat", heart_beat_header(heartbeat))
}

/// The text of an ERROR frame: its `message` header and its body.
pub fn error_text(frame: &Frame) -> String {
    let message = frame.get("message").unwrap_or("error");
    let body = String::from_utf8_lossy(&frame.body);
    let body: String = body.trim().chars().take(512).collect();
    // ActiveMQ repeats the message as the body.
    if body.is_empty() || body == message {
        message.to_string()
    } else {
        format!("{message}: {body}")
    }
}

/// Which flavor the session speaks: the one the URL names (`named`), the
/// one the CONNECTED frame's `server` header names, or RabbitMQ when
/// neither says. A named flavor the server contradicts is an error, not
/// retried: the destinations would be wrong on every connection.
pub fn resolve_flavor(
    named: Option<StompFlavor>,
    server: Option<&str>,
    endpoint: &str,
) -> Result<StompFlavor, BusError> {
    let detected = server.and_then(StompFlavor::from_server);
    match (named, detected) {
        (Some(n), Some(d)) if n != d => Err(BusError::Url {
            url: format!("stomp://{endpoint}?flavor={}", n.name()),
            reason: format!(
                "the URL names flavor={} but the broker at {endpoint} is {} (the `server` \
                 header of its CONNECTED frame): use ?flavor={} or leave it out to detect it",
                n.name(),
                server.unwrap_or_default(),
                d.name()
            ),
        }),
        (Some(n), _) => Ok(n),
        (None, Some(d)) => Ok(d),
        (None, None) => Ok(StompFlavor::RabbitMq),
    }
}

/// Classifies the broker's answer to CONNECT.
pub fn check_connected(
    frame: &Frame,
    endpoint: &str,
    ours: Duration,
) -> Result<HeartBeats, BusError> {
    match frame.command {
        Command::Connected => {
            match frame.get("version") {
                Some("1.2") => {}
                other => {
                    return Err(BusError::Protocol(format!(
                        "{endpoint} does not speak STOMP 1.2 (version {other:?})"
                    )));
                }
            }
            negotiate(ours, frame.get("heart-beat"))
        }
        // A broker refuses credentials, a virtual host or access with an
        // ERROR in answer to CONNECT.
        Command::Error => Err(BusError::Auth {
            endpoint: endpoint.to_string(),
            reason: error_text(frame),
        }),
        other => Err(BusError::Protocol(format!(
            "{endpoint} answered CONNECT with {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_the_spec() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // Both sides willing: the larger interval of each direction.
        let hb = negotiate(s(5), Some("1000,10000")).unwrap();
        assert_eq!(hb.send_every, Some(s(10)));
        assert_eq!(hb.expect_every, Some(s(5)));
        assert_eq!(hb.peer_timeout(), Some(s(15)), "three of its intervals");
        // Server cannot send or does not want any.
        let hb = negotiate(s(5), Some("0,0")).unwrap();
        assert_eq!(hb, HeartBeats::default());
        assert_eq!(negotiate(s(5), None).unwrap(), HeartBeats::default());
        // We disabled it.
        assert_eq!(
            negotiate(ms(0), Some("1000,1000")).unwrap(),
            HeartBeats::default()
        );
        assert!(negotiate(s(1), Some("x")).is_err());
        assert_eq!(heart_beat_header(ms(2500)), "2500,2500");
    }

    #[test]
    fn the_flavor_comes_from_the_url_or_the_server() {
        use StompFlavor::{ActiveMq, RabbitMq};
        let amq = Some("ActiveMQ/5.17.2");
        let rmq = Some("RabbitMQ/3.10.8");
        assert_eq!(resolve_flavor(None, amq, "h:1").unwrap(), ActiveMq);
        assert_eq!(resolve_flavor(None, rmq, "h:1").unwrap(), RabbitMq);
        assert_eq!(resolve_flavor(None, None, "h:1").unwrap(), RabbitMq);
        assert_eq!(
            resolve_flavor(None, Some("Other/1"), "h:1").unwrap(),
            RabbitMq
        );
        assert_eq!(
            resolve_flavor(Some(ActiveMq), None, "h:1").unwrap(),
            ActiveMq
        );
        assert_eq!(
            resolve_flavor(Some(ActiveMq), amq, "h:1").unwrap(),
            ActiveMq
        );
        let e = resolve_flavor(Some(RabbitMq), amq, "h:1").unwrap_err();
        assert!(matches!(e, BusError::Url { .. }), "{e}");
        assert!(!e.is_retryable());
        let text = e.to_string();
        assert!(
            text.contains("flavor=rabbitmq") && text.contains("ActiveMQ/5.17.2"),
            "{text}"
        );
        assert!(resolve_flavor(Some(ActiveMq), rmq, "h:1").is_err());
    }

    #[test]
    fn classifies_connect_answers() {
        let ok = Frame::new(Command::Connected)
            .header("version", "1.2")
            .header("heart-beat", "1000,1000");
        assert!(check_connected(&ok, "h:1", Duration::from_secs(1)).is_ok());
        let old = Frame::new(Command::Connected).header("version", "1.0");
        assert!(matches!(
            check_connected(&old, "h:1", Duration::ZERO),
            Err(BusError::Protocol(_))
        ));
        let refused = Frame::new(Command::Error)
            .header("message", "Bad CONNECT")
            .body(&b"Access refused for user 'guest'\n"[..]);
        match check_connected(&refused, "h:1", Duration::ZERO) {
            Err(BusError::Auth { reason, .. }) => {
                assert_eq!(reason, "Bad CONNECT: Access refused for user 'guest'")
            }
            other => panic!("{other:?}"),
        }
        let repeated = Frame::new(Command::Error)
            .header("message", "User x is not authorized")
            .body(&b"User x is not authorized"[..]);
        assert_eq!(error_text(&repeated), "User x is not authorized");
    }
}
