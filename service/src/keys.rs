//! Key files: the agent's own signing key and the public keys it trusts.

use std::path::{Path, PathBuf};

use gearshift_proto::msg::Role;
use gearshift_proto::sign::{KeyPair, Keyring, public_from_pem};
use thiserror::Error;

/// Why keys could not be loaded or written.
#[derive(Debug, Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file does not hold a key of the expected form.
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

fn read(path: &Path) -> Result<String, KeyFileError> {
    std::fs::read_to_string(path).map_err(|e| KeyFileError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Reads a PKCS#8 PEM private key.
pub fn load_keypair(path: &Path) -> Result<KeyPair, KeyFileError> {
    KeyPair::from_pem(&read(path)?).map_err(|e| KeyFileError::Format {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Adds the public key in `path` (SubjectPublicKeyInfo PEM) to `ring` with `role`.
pub fn trust(ring: &mut Keyring, path: &Path, role: Role) -> Result<String, KeyFileError> {
    let key = public_from_pem(&read(path)?).map_err(|e| KeyFileError::Format {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(ring.add(key, role, path.display().to_string()))
}

/// Trusts every `*.pub` file of `dir` for `role` (in name order); returns
/// how many. A missing directory trusts nobody (and is logged).
pub fn trust_dir(ring: &mut Keyring, dir: &Path, role: Role) -> Result<usize, KeyFileError> {
    let paths = pub_files(dir, role)?;
    for p in &paths {
        trust(ring, p, role)?;
    }
    Ok(paths.len())
}

/// Trusts every `<sender>.pub` file of `dir` for `role`, each speaking only
/// for `<sender>` (`nodes.d/node-1.example.com.pub` signs only as
/// `node-1.example.com`); returns how many. A missing directory trusts
/// nobody (and is logged).
pub fn trust_dir_bound(ring: &mut Keyring, dir: &Path, role: Role) -> Result<usize, KeyFileError> {
    let paths = pub_files(dir, role)?;
    for p in &paths {
        let sender = p
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| KeyFileError::Format {
                path: p.clone(),
                reason: "the file name must be <sender>.pub".into(),
            })?;
        let key = public_from_pem(&read(p)?).map_err(|e| KeyFileError::Format {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        ring.add_bound(key, role, sender, p.display().to_string());
    }
    Ok(paths.len())
}

/// The `*.pub` files of `dir`, in name order (none when it is missing).
fn pub_files(dir: &Path, role: Role) -> Result<Vec<PathBuf>, KeyFileError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(dir = %dir.display(), %role, "no such key directory: no {role} key trusted from it");
            return Ok(vec![]);
        }
        Err(e) => {
            return Err(KeyFileError::Io {
                path: dir.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let mut paths: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pub"))
        .collect();
    paths.sort();
    Ok(paths)
}

/// Builds a keyring from `(role, path)` pairs.
pub fn load_keyring<'a>(
    entries: impl IntoIterator<Item = (Role, &'a Path)>,
) -> Result<Keyring, KeyFileError> {
    let mut ring = Keyring::new();
    for (role, path) in entries {
        trust(&mut ring, path, role)?;
    }
    Ok(ring)
}

/// Writes a new key pair as `<stem>.key` (mode 0600) and `<stem>.pub`;
/// refuses to overwrite an existing private key unless `force`.
pub fn write_keypair(
    dir: &Path,
    stem: &str,
    force: bool,
) -> Result<(PathBuf, PathBuf, KeyPair), KeyFileError> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let key_path = dir.join(format!("{stem}.key"));
    let pub_path = dir.join(format!("{stem}.pub"));
    let pair = new_private_key(&key_path, force)?;
    std::fs::write(&pub_path, pair.public_pem()).map_err(|e| io(&pub_path, e))?;
    Ok((key_path, pub_path, pair))
}

/// Generates a key pair and writes its private key to `path` (PKCS#8 PEM,
/// mode 0600, fsynced); refuses to overwrite an existing file unless `force`.
pub fn new_private_key(path: &Path, force: bool) -> Result<KeyPair, KeyFileError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    let pair = KeyPair::generate().map_err(|e| KeyFileError::Format {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(path).map_err(|e| io(path, e))?;
    f.write_all(pair.to_pem().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io(path, e))?;
    Ok(pair)
}

/// Writes `key` as `<dir>/<sender>.pub` atomically, the form
/// [`trust_dir_bound`] reads back (the broker agent enrolling a node).
/// `sender` must already be a valid host name: it becomes a file name.
pub fn write_bound_public(
    dir: &Path,
    sender: &str,
    key: &gearshift_proto::sign::VerifyingKey,
) -> Result<PathBuf, KeyFileError> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join(format!("{sender}.pub"));
    let pem = gearshift_proto::sign::public_to_pem(key);
    crate::atomic::write_atomic(&path, pem.as_bytes(), true).map_err(|e| io(&path, e))?;
    Ok(path)
}

/// The public key `<dir>/<sender>.pub` holds, if the file exists.
pub fn read_bound_public(
    dir: &Path,
    sender: &str,
) -> Result<Option<gearshift_proto::sign::VerifyingKey>, KeyFileError> {
    let path = dir.join(format!("{sender}.pub"));
    match std::fs::read_to_string(&path) {
        Ok(pem) => public_from_pem(&pem)
            .map(Some)
            .map_err(|e| KeyFileError::Format {
                path,
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path, e)),
    }
}

fn io(path: &Path, e: std::io::Error) -> KeyFileError {
    KeyFileError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_load() {
        let dir = tempfile::tempdir().unwrap();
        let (k, p, pair) = write_keypair(dir.path(), "broker", false).unwrap();
        assert_eq!(load_keypair(&k).unwrap().id(), pair.id());
        let ring = load_keyring([(Role::Broker, p.as_path())]).unwrap();
        assert!(ring.get(pair.id()).is_some());
        assert!(
            write_keypair(dir.path(), "broker", false).is_err(),
            "no silent overwrite"
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&k).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let e = load_keypair(&p).unwrap_err().to_string();
        assert!(e.contains("broker.pub"), "{e}");
    }

    #[test]
    fn an_enrolled_key_is_read_back_bound_to_its_host() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = dir.path().join("nodes.d");
        let pair = KeyPair::generate().unwrap();
        assert!(
            read_bound_public(&nodes, "n1.example.com")
                .unwrap()
                .is_none()
        );
        write_bound_public(&nodes, "n1.example.com", &pair.public()).unwrap();
        let back = read_bound_public(&nodes, "n1.example.com")
            .unwrap()
            .unwrap();
        assert_eq!(back, pair.public());
        let mut ring = Keyring::new();
        assert_eq!(trust_dir_bound(&mut ring, &nodes, Role::Node).unwrap(), 1);
        let k = ring.get(pair.id()).unwrap();
        assert_eq!(k.speaks_for.as_deref(), Some("n1.example.com"));
        std::fs::write(nodes.join("bad.pub"), "junk").unwrap();
        assert!(read_bound_public(&nodes, "bad").is_err());
    }

    #[test]
    fn a_directory_of_sender_keys_binds_each_to_its_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, a) = write_keypair(dir.path(), "node-1.example.com", false).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a key").unwrap();
        let mut ring = Keyring::new();
        assert_eq!(
            trust_dir_bound(&mut ring, dir.path(), Role::Node).unwrap(),
            1
        );
        let k = ring.get(a.id()).unwrap();
        assert_eq!(k.speaks_for.as_deref(), Some("node-1.example.com"));
        assert_eq!(k.role, Role::Node);
        let missing = dir.path().join("nope");
        assert_eq!(trust_dir_bound(&mut ring, &missing, Role::Node).unwrap(), 0);
    }
}
