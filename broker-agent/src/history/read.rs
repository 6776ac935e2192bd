//! Reading the history back: every file, oldest first, filtered by time
//! and group; and the lines `gearshift-broker history` prints.

use std::path::Path;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;

use super::writer::path_of;
use super::{Event, Record};

/// Which records to read.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only records at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only records about this group (and those about the whole fleet).
    pub group: Option<GroupKey>,
    /// At most this many (the newest); none: all.
    pub limit: Option<usize>,
}

impl Filter {
    fn keeps(&self, r: &Record) -> bool {
        self.since.is_none_or(|t| r.at >= t)
            && match (&self.group, r.event.group()) {
                (Some(want), Some(g)) => *want == g,
                _ => true,
            }
    }
}

/// The records of the history in `dir` that `filter` keeps, oldest first.
/// Files modified before `filter.since` are skipped unread; lines that do
/// not decode (a torn last line, a newer version's record) are skipped.
pub fn read(dir: &Path, filter: &Filter) -> std::io::Result<Vec<Record>> {
    let mut files = vec![];
    let mut n = 0;
    loop {
        let p = path_of(dir, n);
        match std::fs::metadata(&p) {
            Ok(m) => files.push((p, m)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && n > 0 => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        n += 1;
    }
    let mut out = vec![];
    for (p, m) in files.into_iter().rev() {
        let modified: Option<DateTime<Utc>> = m.modified().ok().map(Into::into);
        if let (Some(since), Some(t)) = (filter.since, modified)
            && t < since
        {
            continue;
        }
        let text = std::fs::read_to_string(&p)?;
        out.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Record>(l).ok())
                .filter(|r| filter.keeps(r)),
        );
    }
    if let Some(limit) = filter.limit
        && out.len() > limit
    {
        out.drain(..out.len() - limit);
    }
    Ok(out)
}

/// One record as a line for people.
pub fn render(r: &Record) -> String {
    let t = r.at.format("%Y-%m-%d %H:%M:%S");
    match &r.event {
        Event::Decision(d) => format!(
            "{t} DECISION {} {}/{}{}{}: {}",
            d.decision.as_str(),
            d.district,
            d.profile,
            d.op.as_ref().map(|o| format!(" {o}")).unwrap_or_default(),
            d.node
                .as_ref()
                .map(|n| format!(" node={n}"))
                .unwrap_or_default(),
            d.reason
        ),
        Event::Explanation(x) => format!(
            "{t} explain {}/{} {:?}: {}",
            x.district, x.profile, x.outcome, x.summary
        ),
        Event::Saga(s) => format!(
            "{t} saga {} {} {}/{}{}: {} -> {}",
            s.op,
            s.kind,
            s.district,
            s.profile,
            s.node
                .as_ref()
                .map(|n| format!(" node={n}"))
                .unwrap_or_default(),
            s.from.as_deref().unwrap_or("(new)"),
            s.to
        ),
        Event::Operator(o) => format!(
            "{t} operator {} {}: {}{}",
            o.by,
            serde_json::to_string(&o.request).unwrap_or_default(),
            if o.ok { "" } else { "REFUSED " },
            o.message
        ),
    }
}
