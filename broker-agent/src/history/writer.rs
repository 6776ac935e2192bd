//! The rotating appender: one JSON line per record; when the current file
//! would pass `max_file_bytes`, `history.jsonl.N-1` becomes `.N` (the
//! oldest beyond `rotated_files` is deleted), ..., the current file becomes
//! `.1`, and a new one starts.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{HistoryConfig, Record};

/// The current history file's name in the state directory.
pub const FILE: &str = "history.jsonl";

/// Why a history write failed (the agent logs it and carries on).
#[derive(Debug, Error)]
pub enum HistoryError {
    /// The file could not be opened, written or rotated.
    #[error("history {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The `n`th rotated file (0: the current one).
pub fn path_of(dir: &Path, n: u32) -> PathBuf {
    if n == 0 {
        dir.join(FILE)
    } else {
        dir.join(format!("{FILE}.{n}"))
    }
}

/// Appends records to the history of one state directory.
#[derive(Debug)]
pub struct Writer {
    dir: PathBuf,
    max_bytes: u64,
    rotated: u32,
    file: Option<File>,
    size: u64,
}

impl Writer {
    /// A writer for `dir` (the file is opened on the first append).
    pub fn new(dir: &Path, cfg: &HistoryConfig) -> Writer {
        Writer {
            dir: dir.to_path_buf(),
            max_bytes: cfg.max_file_bytes,
            rotated: cfg.rotated_files,
            file: None,
            size: 0,
        }
    }

    fn io(&self, n: u32, source: std::io::Error) -> HistoryError {
        HistoryError::Io {
            path: path_of(&self.dir, n),
            source,
        }
    }

    /// Appends one record (rotating first when it would not fit).
    pub fn append(&mut self, r: &Record) -> Result<(), HistoryError> {
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        if self.file.is_none() {
            self.open()?;
        }
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let file = match self.file.as_mut() {
            Some(f) => f,
            None => return Ok(()),
        };
        if let Err(e) = file.write_all(&line) {
            self.file = None;
            return Err(self.io(0, e));
        }
        self.size += line.len() as u64;
        Ok(())
    }

    fn open(&mut self) -> Result<(), HistoryError> {
        let path = path_of(&self.dir, 0);
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| self.io(0, e))?;
        self.size = f.metadata().map(|m| m.len()).unwrap_or(0);
        self.file = Some(f);
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), HistoryError> {
        self.file = None;
        if self.rotated == 0 {
            std::fs::remove_file(path_of(&self.dir, 0)).map_err(|e| self.io(0, e))?;
        } else {
            for n in (1..=self.rotated).rev() {
                let from = path_of(&self.dir, n - 1);
                if from.exists() {
                    std::fs::rename(&from, path_of(&self.dir, n)).map_err(|e| self.io(n, e))?;
                }
            }
        }
        self.open()
    }
}

/// What the agent appends to: the writer, the explanation filter, and a
/// warning logged once per failure streak (the agent carries on).
#[derive(Debug)]
pub struct Sink {
    writer: Writer,
    explanations: super::ExplanationFilter,
    failing: bool,
}

impl Sink {
    /// The history of `dir`, or none when `[history]` disables it.
    pub fn open(dir: &Path, cfg: &HistoryConfig) -> Option<Sink> {
        cfg.enabled.then(|| Sink {
            writer: Writer::new(dir, cfg),
            explanations: super::ExplanationFilter::default(),
            failing: false,
        })
    }

    /// Appends `r`; an explanation only when its meaning changed.
    pub fn append(&mut self, r: Record) {
        if let super::Event::Explanation(x) = &r.event
            && !self.explanations.changed(x)
        {
            return;
        }
        match self.writer.append(&r) {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(error = %e, "cannot write the history; carrying on without it");
            }
            Err(_) => {}
        }
    }
}
