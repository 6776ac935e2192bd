//! `[keys]`: the agent's signing key, whom it trusts, and the clock skew
//! it accepts.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde::de::MapAccess;

use super::{Fields, Human, Part};
use crate::check;
use crate::config::{Invalid, duration};

/// An agent's own `[keys]` keys (where its trusted keys come from), and
/// its signing key's default path.
pub trait KeysPart: Part {
    /// `signing_key` when the file does not set it.
    const SIGNING_KEY: &'static str;
}

/// `[keys]`: the keys both agents have, plus the agent's own (`X`, reached
/// by `Deref`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeysSection<X> {
    /// The agent's private key (PKCS#8 PEM, written by `keygen`). Default:
    /// `/etc/gearshift/node.key` on a node, `/etc/gearshift/broker.key`
    /// for the broker agent.
    pub signing_key: PathBuf,
    /// Messages whose `ts` is further than this from our clock are refused.
    /// Default `5m`.
    #[serde(with = "duration")]
    pub time_window: Duration,
    /// The agent's own keys.
    #[serde(flatten)]
    pub own: X,
}

const KEYS: &[&str] = &["signing_key", "time_window"];

impl<X: KeysPart> Default for KeysSection<X> {
    fn default() -> Self {
        KeysSection {
            signing_key: X::SIGNING_KEY.into(),
            time_window: Duration::from_secs(300),
            own: X::default(),
        }
    }
}

impl<X: KeysPart> Fields for KeysSection<X> {
    type Own = X;

    const SHARED: &'static [&'static str] = KEYS;

    fn read_shared<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "signing_key" => self.signing_key = map.next_value()?,
            "time_window" => self.time_window = map.next_value::<Human>()?.0,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn own_mut(&mut self) -> &mut X {
        &mut self.own
    }
}

super::section_with_part!(KeysSection, KeysPart);

impl<X: KeysPart> KeysSection<X> {
    /// Checks the section (no files read).
    pub fn check(&self) -> Result<(), Invalid> {
        check::names_a_path("keys.signing_key", &self.signing_key, "file")?;
        check::within(
            "keys.time_window",
            self.time_window,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        self.own.check("keys")
    }
}
