use std::path::Path;
use std::time::Duration;

use serde::de::MapAccess;
use serde::{Deserialize, Serialize};

use super::*;
use crate::config::{ConfigError, Validate, load_str};

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Own {
    prefetch: u16,
    #[serde(with = "crate::config::duration")]
    linger: Duration,
}

impl Default for Own {
    fn default() -> Self {
        Own {
            prefetch: 16,
            linger: Duration::from_secs(1),
        }
    }
}

impl Part for Own {
    const KEYS: &'static [&'static str] = &["prefetch", "linger"];

    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "prefetch" => self.prefetch = map.next_value()?,
            "linger" => self.linger = map.next_value::<Human>()?.0,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self, section: &str) -> Result<(), Invalid> {
        crate::check::count_within(&format!("{section}.prefetch"), self.prefetch, 1, 100)
    }
}

impl BusPart for Own {
    const RECONNECT_MIN: Duration = Duration::from_millis(100);
    const RECONNECT_MAX: Duration = Duration::from_secs(2);
}

impl KeysPart for Own {
    const SIGNING_KEY: &'static str = "/etc/gearshift/test.key";
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Conf {
    bus: BusSection<Own>,
    keys: KeysSection<NoKeysPart>,
    log: LogSection,
    metrics: MetricsSection,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
struct NoKeysPart {}

impl Part for NoKeysPart {
    const KEYS: &'static [&'static str] = &[];

    fn read<'de, A: MapAccess<'de>>(&mut self, _: &str, _: &mut A) -> Result<bool, A::Error> {
        Ok(false)
    }
}

impl KeysPart for NoKeysPart {
    const SIGNING_KEY: &'static str = "/etc/gearshift/none.key";
}

impl Validate for Conf {
    fn validate(&self) -> Result<(), Invalid> {
        self.bus.check()?;
        self.keys.check()?;
        self.log.check()
    }
}

fn load(text: &str) -> Result<Conf, ConfigError> {
    load_str(text, Path::new("t.toml"), "GEARSHIFT_T", Vec::new())
}

#[test]
fn defaults_come_from_the_part() {
    let c = load("").unwrap();
    assert_eq!(c, Conf::default());
    assert_eq!(c.bus.reconnect_min, Duration::from_millis(100));
    assert_eq!(
        c.bus.prefetch, 16,
        "the part's keys are reached through the section"
    );
    assert_eq!(c.keys.signing_key, Path::new("/etc/gearshift/none.key"));
    assert_eq!(c.keys.time_window, Duration::from_secs(300));
    assert_eq!(c.log.level, "info");
    assert_eq!(c.metrics.listen, None);
}

#[test]
fn shared_and_own_keys_share_one_table() {
    let c = load(
        "[bus]\nurl = \"memory://x\"\nprefetch = 4\nlinger = \"3s\"\nreconnect_max = \"5s\"\nserver_name = \"mq\"\n",
    )
    .unwrap();
    assert_eq!(c.bus.url, "memory://x");
    assert_eq!(c.bus.prefetch, 4);
    assert_eq!(c.bus.linger, Duration::from_secs(3));
    assert_eq!(c.bus.reconnect_max, Duration::from_secs(5));
    let o = c.bus.connect_options("me".into());
    assert_eq!(o.tls.server_name.as_deref(), Some("mq"));
    assert_eq!(o.reconnect_max, Duration::from_secs(5));
}

#[test]
fn errors_name_the_key() {
    for (text, key, why) in [
        ("[bus]\nprefetch = \"x\"\n", "bus.prefetch", "invalid type"),
        ("[bus]\nprefetch = 0\n", "bus.prefetch", "outside"),
        ("[bus]\nlinger = \"soon\"\n", "bus.linger", "not a duration"),
        (
            "[bus]\nheartbeat = \"soon\"\n",
            "bus.heartbeat",
            "not a duration",
        ),
        (
            "[bus]\nrecconect_min = \"1s\"\n",
            "recconect_min",
            "unknown field",
        ),
        ("[bus]\nurl = \"http://x\"\n", "bus.url", "invalid bus URL"),
        (
            "[bus]\nreconnect_max = \"1ms\"\n",
            "bus.reconnect_max",
            "outside",
        ),
        ("[bus]\ncert_file = \"/c\"\n", "bus.cert_file", "together"),
        (
            "[keys]\ntime_windw = \"5m\"\n",
            "time_windw",
            "unknown field",
        ),
        (
            "[keys]\nsigning_key = \"\"\n",
            "keys.signing_key",
            "must name a file",
        ),
        (
            "[keys]\ntime_window = \"2d\"\n",
            "keys.time_window",
            "outside",
        ),
        (
            "[log]\nlevel = \"gearshift=loud\"\n",
            "log.level",
            "not a log filter",
        ),
    ] {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(why), "{text:?} gave {e}");
    }
}

#[test]
fn environment_overrides_reach_own_keys() {
    let c: Conf = load_str(
        "",
        Path::new("t.toml"),
        "GEARSHIFT_T",
        vec![
            ("GEARSHIFT_T_BUS__PREFETCH".to_string(), "8".to_string()),
            ("GEARSHIFT_T_BUS__OP_TIMEOUT".to_string(), "5s".to_string()),
        ],
    )
    .unwrap();
    assert_eq!(c.bus.prefetch, 8);
    assert_eq!(c.bus.op_timeout, Duration::from_secs(5));
}

#[test]
fn round_trips_through_toml() {
    let mut c = load("").unwrap();
    c.bus.prefetch = 3;
    c.bus.ca_file = Some("/ca.pem".into());
    c.keys.signing_key = "/k".into();
    c.metrics.listen = Some("127.0.0.1:9100".parse().unwrap());
    let text = toml::to_string(&c).unwrap();
    assert_eq!(load(&text).unwrap(), c, "{text}");
}
