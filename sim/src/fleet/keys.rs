//! The key files of a simulated installation, written the way
//! `gearshift-broker keygen` and `gearshift-node keygen` write them and laid
//! out the way an operator installs them for the broker agent's binary.

use std::path::{Path, PathBuf};

use gearshift_broker::cli::OperatorKeys;
use gearshift_broker::config::BrokerConfig;
use gearshift_proto::msg::Role;
use gearshift_proto::{KeyPair, Keyring};
use gearshift_service::keys::KeyFileError;

/// One broker key, one key shared by the simulated nodes (new nodes join
/// without a broker restart), one operator key.
///
/// Files in [`Keys::dir`]: `broker.key`/`.pub`, `node.key`/`.pub`,
/// `operator.key`/`.pub`, and the broker agent's trust directories
/// `nodes.d/` (keys bound to one node each, added by [`Keys::trust_node`])
/// and `operators.d/`. The shared node key is trusted as a fleet-wide key
/// (`[[keys.trust]]`), which speaks for any node.
#[derive(Debug, Clone)]
pub struct Keys {
    /// Directory of the key files.
    pub dir: PathBuf,
    /// The broker agent's key.
    pub broker: KeyPair,
    /// The nodes' key.
    pub node: KeyPair,
    /// An operator's key (for `gearshift-broker status --key`).
    pub operator: KeyPair,
}

const STEMS: [&str; 3] = ["broker", "node", "operator"];

impl Keys {
    /// Writes fresh key pairs into `dir`.
    pub fn generate(dir: &Path) -> Result<Keys, KeyFileError> {
        let w = |stem: &str| gearshift_service::keys::write_keypair(dir, stem, true).map(|x| x.2);
        let keys = Keys {
            dir: dir.to_path_buf(),
            broker: w("broker")?,
            node: w("node")?,
            operator: w("operator")?,
        };
        keys.write_trust_dirs()?;
        Ok(keys)
    }

    /// The key pairs in `dir` when all three exist there, else fresh ones
    /// written there (keys kept across demo runs for an outside watcher).
    pub fn open_or_generate(dir: &Path) -> Result<Keys, KeyFileError> {
        if !STEMS.iter().all(|s| dir.join(format!("{s}.key")).is_file()) {
            return Keys::generate(dir);
        }
        let load =
            |stem: &str| gearshift_service::keys::load_keypair(&dir.join(format!("{stem}.key")));
        let keys = Keys {
            dir: dir.to_path_buf(),
            broker: load("broker")?,
            node: load("node")?,
            operator: load("operator")?,
        };
        keys.write_trust_dirs()?;
        Ok(keys)
    }

    fn write_trust_dirs(&self) -> Result<(), KeyFileError> {
        let nodes = self.nodes_dir();
        std::fs::create_dir_all(&nodes).map_err(|e| KeyFileError::Io {
            path: nodes.clone(),
            reason: e.to_string(),
        })?;
        write_file(
            &self.dir.join("operators.d").join("operator.pub"),
            &self.operator.public_pem(),
        )
    }

    /// Path of `<stem>.key` or `<stem>.pub`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The broker agent's `keys.node_keys_dir`.
    pub fn nodes_dir(&self) -> PathBuf {
        self.dir.join("nodes.d")
    }

    /// Trusts one more node key (a node with a key of its own), as an
    /// operator drops its public key into `nodes.d/`: it speaks only for
    /// `name`.
    pub fn trust_node(&self, name: &str, key: &KeyPair) -> Result<(), KeyFileError> {
        write_file(
            &self.nodes_dir().join(format!("{name}.pub")),
            &key.public_pem(),
        )
    }

    /// Points the broker configuration's `[keys]` at these files.
    pub fn configure_broker(&self, cfg: &mut BrokerConfig) {
        cfg.keys.signing_key = self.path("broker.key");
        cfg.keys.node_keys_dir = self.nodes_dir();
        cfg.keys.operator_keys_dir = self.dir.join("operators.d");
        let shared = self.path("node.pub");
        if !cfg.keys.trust.iter().any(|t| t.path == shared) {
            cfg.keys.trust.push(gearshift_broker::config::TrustEntry {
                role: Role::Node,
                path: shared,
            });
        }
    }

    /// What the broker agent trusts: itself, the nodes' key, the operator,
    /// loaded from the public key files as `gearshift-broker run` loads them.
    pub fn broker_keyring(&self) -> Result<Keyring, KeyFileError> {
        let mut ring = Keyring::new();
        ring.add(self.broker.public(), Role::Broker, "own key");
        gearshift_service::keys::trust(&mut ring, &self.path("node.pub"), Role::Node)?;
        gearshift_service::keys::trust(&mut ring, &self.path("operator.pub"), Role::Operator)?;
        Ok(ring)
    }

    /// Only the broker agent's key: what a node or a watcher of decisions
    /// obeys.
    pub fn broker_only(&self) -> Keyring {
        let mut ring = Keyring::new();
        ring.add(self.broker.public(), Role::Broker, "broker");
        ring
    }

    /// The operator's signer with the broker's key, for admin requests.
    pub fn operator_keys(&self) -> OperatorKeys {
        OperatorKeys {
            signer: self.operator.clone(),
            brokers: self.broker_only(),
        }
    }
}

/// Writes a private key PEM with mode 0600 (as `keygen` does).
pub fn write_private(path: &Path, pem: &str) -> Result<(), KeyFileError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| KeyFileError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    f.write_all(pem.as_bytes()).map_err(io)
}

fn write_file(path: &Path, text: &str) -> Result<(), KeyFileError> {
    let io = |e: std::io::Error| KeyFileError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}
