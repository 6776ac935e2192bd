//! The operator controls' side of the CLI: `pause`, `resume`, `cordon`,
//! `uncordon`, `activate`, `drain [--keep]` build their signed requests
//! here (the binary sends them with [`super::admin_on`] on the configured
//! admin key), and `history` reads the state directory's history files
//! without the bus.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::AdminRequest;

use super::CliError;
use crate::history::{self, Filter};

/// `D/P` as a group.
pub fn parse_group(s: &str) -> Result<GroupKey, CliError> {
    match s.split_once('/') {
        Some((d, p)) if !d.is_empty() && !p.is_empty() && !p.contains('/') => Ok(GroupKey {
            district: d.to_string(),
            profile: p.to_string(),
        }),
        _ => Err(CliError::Usage(format!(
            "{s:?}: a group is DISTRICT/PROFILE"
        ))),
    }
}

fn scope(group: Option<&str>) -> Result<(Option<String>, Option<String>), CliError> {
    Ok(match group.map(parse_group).transpose()? {
        Some(g) => (Some(g.district), Some(g.profile)),
        None => (None, None),
    })
}

/// `pause [D/P] --reason R [--for D | --until T]`: the fleet without a group.
pub fn pause(
    group: Option<&str>,
    reason: &str,
    for_: Option<Duration>,
    until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<AdminRequest, CliError> {
    let (district, profile) = scope(group)?;
    let until = match (for_, until) {
        (Some(_), Some(_)) => {
            return Err(CliError::Usage(
                "--for and --until exclude each other".into(),
            ));
        }
        (Some(d), None) => Some(now + crate::core::dur(d)),
        (None, u) => u,
    };
    Ok(AdminRequest::Pause {
        district,
        profile,
        reason: reason.to_string(),
        until,
    })
}

/// `resume [D/P]`.
pub fn resume(group: Option<&str>) -> Result<AdminRequest, CliError> {
    let (district, profile) = scope(group)?;
    Ok(AdminRequest::Resume { district, profile })
}

/// `cordon NODE --reason R` (`on`) or `uncordon NODE`.
pub fn cordon(node: &str, on: bool, reason: &str) -> AdminRequest {
    AdminRequest::Cordon {
        node: node.to_string(),
        on,
        reason: reason.to_string(),
    }
}

/// `activate NODE`.
pub fn activate(node: &str) -> AdminRequest {
    AdminRequest::Activate {
        node: node.to_string(),
    }
}

/// `drain [--keep] NODE`: with `--keep`, a maintenance drain; without, as `evacuate`.
pub fn drain(node: &str, keep: bool) -> AdminRequest {
    AdminRequest::Drain {
        node: node.to_string(),
        keep,
    }
}

/// `history [--since D] [--group D/P] [--json]`: the lines to print, oldest
/// first, from the history files in `state_dir`.
pub fn history(
    state_dir: &Path,
    since: Duration,
    group: Option<&str>,
    json: bool,
    now: DateTime<Utc>,
) -> Result<Vec<String>, CliError> {
    let filter = Filter {
        since: Some(now - crate::core::dur(since)),
        group: group.map(parse_group).transpose()?,
        limit: None,
    };
    let records = history::read(state_dir, &filter).map_err(|e| {
        CliError::Usage(format!(
            "cannot read the history in {}: {e}",
            state_dir.display()
        ))
    })?;
    Ok(records
        .iter()
        .map(|r| {
            if json {
                serde_json::to_string(r).unwrap_or_default()
            } else {
                history::read::render(r)
            }
        })
        .collect())
}

/// [`history()`] of the state directory `state_dir`, or else the one the
/// configuration file `config` names.
pub fn history_of(
    config: &Path,
    state_dir: Option<&Path>,
    since: Duration,
    group: Option<&str>,
    json: bool,
) -> Result<Vec<String>, CliError> {
    let dir = match state_dir {
        Some(d) => d.to_path_buf(),
        None => {
            crate::config::load(config)
                .map_err(|e| CliError::Usage(e.to_string()))?
                .agent
                .state_dir
        }
    };
    history(&dir, since, group, json, Utc::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, Record, SagaStep, Writer};

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    #[test]
    fn requests_are_built_from_the_arguments() {
        let p = pause(
            Some("d1/small"),
            "upgrade",
            Some(Duration::from_secs(3600)),
            None,
            t0(),
        )
        .unwrap();
        assert_eq!(
            p,
            AdminRequest::Pause {
                district: Some("d1".into()),
                profile: Some("small".into()),
                reason: "upgrade".into(),
                until: Some(t0() + chrono::Duration::hours(1)),
            }
        );
        assert!(matches!(
            pause(None, "", None, None, t0()),
            Ok(AdminRequest::Pause {
                district: None,
                until: None,
                ..
            })
        ));
        assert!(pause(Some("d1"), "", None, None, t0()).is_err());
        assert!(pause(None, "", Some(Duration::from_secs(1)), Some(t0()), t0()).is_err());
        assert_eq!(
            resume(None).unwrap(),
            AdminRequest::Resume {
                district: None,
                profile: None
            }
        );
        assert!(matches!(
            drain("n", true),
            AdminRequest::Drain { keep: true, .. }
        ));
        assert!(matches!(
            cordon("n", false, ""),
            AdminRequest::Cordon { on: false, .. }
        ));
        assert!(matches!(activate("n"), AdminRequest::Activate { .. }));
    }

    #[test]
    fn history_reads_the_files_without_the_bus() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(dir.path(), &Default::default());
        for (i, d) in ["d1", "d2"].iter().enumerate() {
            w.append(&Record {
                at: Utc::now() - chrono::Duration::hours(i as i64),
                event: Event::Saga(SagaStep {
                    op: format!("op-{i}"),
                    kind: "scale_down".into(),
                    district: (*d).into(),
                    profile: "small".into(),
                    node: Some("n".into()),
                    from: None,
                    to: "deactivating".into(),
                }),
            })
            .unwrap();
        }
        let now = Utc::now();
        let all = history(dir.path(), Duration::from_secs(86_400), None, false, now).unwrap();
        assert_eq!(all.len(), 2);
        assert!(
            all[0].contains("saga op-0 scale_down d1/small node=n: (new) -> deactivating"),
            "{all:?}"
        );
        let d2 = history(
            dir.path(),
            Duration::from_secs(86_400),
            Some("d2/small"),
            true,
            now,
        )
        .unwrap();
        assert_eq!(d2.len(), 1);
        assert!(d2[0].starts_with("{\"at\":") && d2[0].contains("\"op\":\"op-1\""));
        let recent = history(dir.path(), Duration::from_secs(1800), None, false, now).unwrap();
        assert_eq!(recent.len(), 1);
    }
}
