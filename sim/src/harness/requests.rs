//! The cloud as a file: the broker agent's `exec` handler (the seeds'
//! contract) runs a script that appends every request to a log, and a
//! scenario reads the log and acts like a cloud. Used where the broker agent
//! runs as its own process (the fault campaign, the SIGKILL tests), which
//! cannot be handed an in-process [`crate::fleet::SimCloud`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why the request log could not be used.
#[derive(Debug, Error)]
pub enum RequestLogError {
    /// The handler script could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line the script does not write.
    #[error("unexpected handler line {0:?}")]
    Line(String),
}

/// Writes the `event` script of an exec handler in `dir` that appends
/// `<event> <op> <node or -> <district>` to `log` and succeeds.
pub fn write_recording_handler(dir: &Path, log: &Path) -> Result<(), RequestLogError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RequestLogError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let script = dir.join("event");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$GEARSHIFT_EVENT $GEARSHIFT_OP ${{GEARSHIFT_NODE:--}} $GEARSHIFT_DISTRICT\" >> '{}'\n",
            log.display()
        ),
    )
    .map_err(io(&script))?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).map_err(io(&script))
}

/// One request the handler recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudRequest {
    /// `create-node`: boot a node for the operation.
    Create {
        /// The scale-up operation.
        op: String,
        /// Its district.
        district: String,
        /// True the first time the operation asks (a repeat must not boot
        /// a second node).
        first: bool,
    },
    /// `remove-node`: delete the node.
    Remove {
        /// The scale-down operation.
        op: String,
        /// The node.
        node: String,
    },
}

/// The handler's log, read from where the last read stopped, with every
/// request counted by operation.
#[derive(Debug)]
pub struct RequestLog {
    path: PathBuf,
    seen_lines: usize,
    /// `create-node` requests by operation.
    pub creates: BTreeMap<String, usize>,
    /// `remove-node` requests by operation.
    pub removes: BTreeMap<String, usize>,
    /// The node of every `remove-node` request, in order.
    pub removed_nodes: Vec<String>,
}

impl RequestLog {
    /// The log at `path` (it need not exist yet).
    pub fn new(path: &Path) -> RequestLog {
        RequestLog {
            path: path.to_path_buf(),
            seen_lines: 0,
            creates: BTreeMap::new(),
            removes: BTreeMap::new(),
            removed_nodes: vec![],
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The requests recorded since the last call.
    pub fn poll(&mut self) -> Result<Vec<CloudRequest>, RequestLogError> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let mut out = vec![];
        for line in lines.iter().skip(self.seen_lines) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            out.push(match parts.as_slice() {
                ["create-node", op, _node, district @ ..] => {
                    let n = self.creates.entry(op.to_string()).or_default();
                    *n += 1;
                    CloudRequest::Create {
                        op: op.to_string(),
                        district: district.first().unwrap_or(&"").to_string(),
                        first: *n == 1,
                    }
                }
                ["remove-node", op, node, ..] => {
                    *self.removes.entry(op.to_string()).or_default() += 1;
                    self.removed_nodes.push(node.to_string());
                    CloudRequest::Remove {
                        op: op.to_string(),
                        node: node.to_string(),
                    }
                }
                _ => return Err(RequestLogError::Line(line.to_string())),
            });
        }
        self.seen_lines = lines.len();
        Ok(out)
    }

    /// Operations that asked the cloud more than once, as `op xN`.
    pub fn repeated(&self) -> Vec<String> {
        self.creates
            .iter()
            .chain(self.removes.iter())
            .filter(|(_, n)| **n > 1)
            .map(|(op, n)| format!("{op} x{n}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_new_lines_and_counts_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests.log");
        let mut log = RequestLog::new(&path);
        assert!(log.poll().unwrap().is_empty(), "no file yet");
        std::fs::write(&path, "create-node op1 - d1\ncreate-node op1 - d1\n").unwrap();
        let r = log.poll().unwrap();
        assert_eq!(r.len(), 2);
        assert!(matches!(&r[0], CloudRequest::Create { first: true, .. }));
        assert!(matches!(&r[1], CloudRequest::Create { first: false, .. }));
        std::fs::write(
            &path,
            "create-node op1 - d1\ncreate-node op1 - d1\nremove-node op2 n3 d1\n",
        )
        .unwrap();
        assert_eq!(
            log.poll().unwrap(),
            vec![CloudRequest::Remove {
                op: "op2".into(),
                node: "n3".into()
            }]
        );
        assert_eq!(log.repeated(), vec!["op1 x2".to_string()]);
        std::fs::write(&path, "bogus\n").unwrap();
        let mut fresh = RequestLog::new(&path);
        assert!(fresh.poll().is_err());
    }
}
