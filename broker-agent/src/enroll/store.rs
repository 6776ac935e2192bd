//! The ledger in the state directory: `enroll-ledger.json`, rewritten
//! atomically after every use it records (enrollments are rare).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::Ledger;

/// File name in the state directory.
pub const FILE: &str = "enroll-ledger.json";

/// The ledger and where it is kept.
#[derive(Debug)]
pub struct Stored {
    /// The uses.
    pub ledger: Ledger,
    path: PathBuf,
}

impl Stored {
    /// The ledger in `dir`, without the tokens expired at `now`. A missing
    /// file is an empty ledger; an unreadable one too, and that is logged:
    /// tokens in use could then enroll more hosts than they allow, so the
    /// operator must know (and a file that cannot be read is kept aside).
    pub fn open(dir: &Path, now: DateTime<Utc>) -> Stored {
        let path = dir.join(FILE);
        let ledger = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Ledger>(&bytes).unwrap_or_else(|e| {
                let aside = path.with_extension("json.unreadable");
                let _ = std::fs::rename(&path, &aside);
                tracing::error!(path = %path.display(), aside = %aside.display(), error = %e,
                    "enrollment ledger unreadable: token uses start from zero");
                Ledger::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ledger::default(),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e,
                    "enrollment ledger unreadable: token uses start from zero");
                Ledger::default()
            }
        };
        let mut s = Stored { ledger, path };
        s.ledger.expire(now);
        s
    }

    /// Writes the ledger (temporary file, fsync, rename).
    pub fn save(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&self.ledger).map_err(std::io::Error::other)?;
        gearshift_service::atomic::write_atomic(&self.path, &bytes, true)
    }
}
