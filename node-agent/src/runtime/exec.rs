//! The `exec` runtime: operator commands list and move gears.
//!
//! `list_command` prints JSON on its standard output, either an array of
//! gears or an object with `gears` and optional facts that override the
//! configured ones:
//!
//! ```json
//! {"profile": "small", "max_active_gears": 100,
//!  "district": {"uuid": "d1", "active": true, "first_uid": 1000, "max_uid": 6999},
//!  "gears": [{"id": "g1", "state": "started", "app": "shop", "uid": 1001,
//!             "do_not_disrupt": false}]}
//! ```
//!
//! Only `id` is required; `state` defaults to `started` and is read as an
//! OpenShift state file would be (anything unknown is `unknown`, which
//! counts as active). `move_command` is run with `{gear}` and `{target}`
//! substituted in its arguments (no shell is involved) and must exit 0 only
//! once the gear left this node.

use std::time::Duration;

use async_trait::async_trait;
use gearshift_proto::msg::{DistrictInfo, GearInfo, GearState};
use serde::Deserialize;

use super::command;
use super::{
    GearRuntime, Inventory, MoveCtx, MoveOutcome, NodeFacts, RuntimeError, check_gear_id,
    check_target,
};
use crate::config::ExecSection;

/// Largest gear list accepted (bytes of JSON).
const MAX_LIST_OUTPUT: usize = 64 * 1024 * 1024;

/// Gears listed and moved by operator commands.
#[derive(Debug, Clone)]
pub struct ExecRuntime {
    list_command: Vec<String>,
    move_command: Vec<String>,
    list_timeout: Duration,
    move_timeout: Duration,
    facts: NodeFacts,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ListOutput {
    Gears(Vec<ExecGear>),
    Full(FullOutput),
}

#[derive(Debug, Deserialize)]
struct FullOutput {
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    max_active_gears: Option<u32>,
    #[serde(default)]
    district: Option<DistrictInfo>,
    gears: Vec<ExecGear>,
}

#[derive(Debug, Deserialize)]
struct ExecGear {
    id: String,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    app: Option<String>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    do_not_disrupt: bool,
}

/// Parses a list command's output; `defaults` supplies facts it does not give.
pub fn parse_list(bytes: &[u8], defaults: &NodeFacts) -> Result<Inventory, RuntimeError> {
    let bad = |reason: String| RuntimeError::Parse {
        what: "gear list".into(),
        reason,
    };
    let out: ListOutput = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let (facts, gears) = match out {
        ListOutput::Gears(g) => (defaults.clone(), g),
        ListOutput::Full(f) => (
            NodeFacts {
                profile: f.profile.unwrap_or_else(|| defaults.profile.clone()),
                max_active_gears: f.max_active_gears.unwrap_or(defaults.max_active_gears),
                district: f.district.or_else(|| defaults.district.clone()),
            },
            f.gears,
        ),
    };
    if gears.len() > gearshift_proto::msg::MAX_LIST {
        return Err(bad(format!("{} gears", gears.len())));
    }
    let mut seen = std::collections::HashSet::new();
    let mut list = Vec::with_capacity(gears.len());
    for g in gears {
        check_gear_id(&g.id).map_err(|e| bad(e.to_string()))?;
        if !seen.insert(g.id.clone()) {
            return Err(bad(format!("gear {} listed twice", g.id)));
        }
        list.push(GearInfo {
            id: g.id,
            app: g.app.filter(|a| !a.is_empty() && a.len() <= 255),
            state: g
                .state
                .as_deref()
                .map_or(GearState::Started, GearState::parse_lenient),
            uid: g.uid,
            bytes: g.bytes,
            do_not_disrupt: g.do_not_disrupt,
        });
    }
    list.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Inventory { facts, gears: list })
}

impl ExecRuntime {
    /// A runtime running the commands in `cfg`; `facts` are the defaults.
    pub fn new(cfg: &ExecSection, facts: NodeFacts) -> Self {
        ExecRuntime {
            list_command: cfg.list_command.clone(),
            move_command: cfg.move_command.clone(),
            list_timeout: cfg.list_timeout,
            move_timeout: cfg.move_timeout,
            facts,
        }
    }

    async fn present(&self, gear: &str) -> Result<bool, RuntimeError> {
        Ok(self.inventory().await?.gears.iter().any(|g| g.id == gear))
    }
}

#[async_trait]
impl GearRuntime for ExecRuntime {
    fn kind(&self) -> &'static str {
        "exec"
    }

    async fn inventory(&self) -> Result<Inventory, RuntimeError> {
        let out =
            command::run(&self.list_command, self.list_timeout, None, MAX_LIST_OUTPUT).await?;
        parse_list(&out, &self.facts)
    }

    async fn move_gear(
        &self,
        gear: &str,
        target: &str,
        ctx: &MoveCtx,
    ) -> Result<MoveOutcome, RuntimeError> {
        check_gear_id(gear)?;
        check_target(target)?;
        let gone = if ctx.resumed {
            MoveOutcome::AlreadyMoved
        } else {
            MoveOutcome::Missing
        };
        if ctx.resumed && !self.present(gear).await? {
            return Ok(gone);
        }
        let argv = command::substitute(&self.move_command, &[("gear", gear), ("target", target)]);
        match command::run(&argv, self.move_timeout, Some(&ctx.cancel), 1024 * 1024).await {
            Ok(_) => Ok(MoveOutcome::Moved),
            Err(e @ RuntimeError::Interrupted) => Err(e),
            Err(e) => {
                // The move failed: was the gear here at all?
                match self.present(gear).await {
                    Ok(false) => Ok(gone),
                    _ => Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> NodeFacts {
        NodeFacts {
            profile: "small".into(),
            max_active_gears: 100,
            district: None,
        }
    }

    #[test]
    fn parses_both_shapes() {
        let inv = parse_list(br#"[{"id":"b","state":"idle"},{"id":"a"}]"#, &defaults()).unwrap();
        assert_eq!(inv.facts, defaults());
        assert_eq!(inv.gears[0].id, "a");
        assert_eq!(inv.gears[0].state, GearState::Started);
        assert_eq!(inv.gears[1].state, GearState::Idle);
        let inv = parse_list(
            br#"{"profile":"large","district":{"uuid":"d1","active":true,"first_uid":1000,"max_uid":1999},
                 "gears":[{"id":"g1","state":"weird","uid":1001,"do_not_disrupt":true}]}"#,
            &defaults(),
        )
        .unwrap();
        assert_eq!(inv.facts.profile, "large");
        assert_eq!(inv.facts.max_active_gears, 100);
        assert_eq!(inv.facts.district.as_ref().unwrap().capacity(), 1000);
        assert_eq!(inv.gears[0].state, GearState::Unknown);
        assert_eq!(inv.pinned(), 1);
    }

    #[test]
    fn refuses_bad_lists() {
        for bad in [
            &b"not json"[..],
            br#"[{"state":"idle"}]"#,
            br#"[{"id":"../x"}]"#,
            br#"[{"id":"a"},{"id":"a"}]"#,
            br#"{"gears":"x"}"#,
        ] {
            assert!(
                parse_list(bad, &defaults()).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[tokio::test]
    async fn lists_and_moves_with_commands() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("gears");
        std::fs::write(&list, "g1\ng2\n").unwrap();
        let l = list.display().to_string();
        let cfg = ExecSection {
            list_command: vec![
                "sh".into(),
                "-c".into(),
                format!("printf '['; sed 's/.*/{{\"id\":\"&\"}}/' {l} | paste -sd, -; printf ']'"),
            ],
            move_command: vec![
                "sh".into(),
                "-c".into(),
                format!("grep -qx \"$1\" {l} && sed -i \"/^$1$/d\" {l}"),
                "mv".into(),
                "{gear}".into(),
                "{target}".into(),
            ],
            ..ExecSection::default()
        };
        let rt = ExecRuntime::new(&cfg, defaults());
        assert_eq!(rt.inventory().await.unwrap().gears.len(), 2);
        let ctx = MoveCtx::default();
        assert_eq!(
            rt.move_gear("g1", "n2", &ctx).await.unwrap(),
            MoveOutcome::Moved
        );
        assert_eq!(rt.inventory().await.unwrap().gears.len(), 1);
        assert_eq!(
            rt.move_gear("g1", "n2", &ctx).await.unwrap(),
            MoveOutcome::Missing
        );
        let resumed = MoveCtx {
            resumed: true,
            ..MoveCtx::default()
        };
        assert_eq!(
            rt.move_gear("g1", "n2", &resumed).await.unwrap(),
            MoveOutcome::AlreadyMoved
        );
    }
}
