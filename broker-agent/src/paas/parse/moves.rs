//! `oo-admin-move` for one gear (`broker-util/oo-admin-move`; the move
//! itself is `move_gear` and `resolve_destination` in
//! `plugins/msg-broker/mcollective/lib/openshift/mcollective_application_container_proxy.rb`,
//! "proxy" below).
//!
//! Without `--json` the tool prints the gear's `URL:`/`Login:`/`App UUID:`/
//! `Gear UUID:` header (`oo-admin-move:125-130`), the proxy's debug lines,
//! and on failure the exception's message as the last line (`:152-166`);
//! it exits 1 when any gear failed (`:108`, `:158`, `:165`, `:179`). An
//! exception it does not rescue (an `OOException`) ends Ruby with exit 1 and
//! the message on standard error. With `--json` the last line is
//! `{"<gear>": {"result": true|false, "message": ...}}` (`:178`).

use super::super::outcome::{Cause, Failure, Outcome};
use super::{Exit, common, detail};

/// A refusal or failure message of a move, or `None` when unknown.
fn classify(msg: &str) -> Option<Outcome> {
    let refused = |cause| Some(Outcome::refused(cause, msg.trim()));
    let has = |needle: &str| msg.contains(needle);
    if msg.starts_with("ERROR: Gear not found: ") {
        return refused(Cause::GearNotFound); // oo-admin-move:102
    }
    // proxy :2365 (with -i the source is the target) and :2060: the gear
    // is on the target already, as after a move that completed.
    if has("Error moving gear. Old and new servers are the same: ")
        || has("Error moving gear. Destination container same as source container.")
    {
        return Some(Outcome::AlreadyInState {
            detail: msg.trim().to_string(),
        });
    }
    let refusals = [
        (
            "Move gear only allowed from non-districted/districted node to districted node.",
            Cause::TargetNotDistricted, // proxy :2065
        ),
        (
            "Node execution failure (error getting facts).",
            Cause::NodeUnreachable,
        ), // proxy :3734
        (
            "Old and new servers must belong to the same region",
            Cause::RegionMismatch,
        ), // :2371
        (
            "Cannot change region for *scalable* app.",
            Cause::RegionMismatch,
        ), // :2042
        (
            "Destination container platform is not the same as the source container platform.",
            Cause::PlatformMismatch, // proxy :2053
        ),
        (
            "Cannot change node profile for *scalable* app.",
            Cause::ProfileMismatch,
        ), // :2075
        (
            "Cannot specify 'node_profile' for a gear belonging to a scalable application.",
            Cause::ProfileMismatch, // oo-admin-move:113
        ),
        ("Not enough disk space, node would be > ", Cause::TargetFull), // proxy :2417
        (
            "while gear exceeds profile quota limits.",
            Cause::QuotaExceeded,
        ), // :2100, :2125
        (
            "uid could not be reserved in target district '",
            Cause::UidUnavailable,
        ), // :273
    ];
    if let Some((_, cause)) = refusals.iter().find(|(needle, _)| has(needle)) {
        return refused(*cause);
    }
    // proxy :2439, :2452: the copy failed; the move was rolled back.
    if msg.starts_with("Error moving app '") || msg.starts_with("Error moving system components ") {
        return Some(Outcome::failed(Failure::CopyFailed, msg.trim()));
    }
    // oo-admin-move:71-81: the template's options are wrong.
    if msg.starts_with("ERROR: Timeout must be ")
        || msg.starts_with("ERROR: Please specify gear_uuid")
    {
        return Some(Outcome::failed(Failure::Usage, msg.trim()));
    }
    // proxy :2033-2035: a MongoDB update that did not apply.
    if msg.starts_with("Could not ") {
        return Some(Outcome::failed(Failure::StoreUpdate, msg.trim()));
    }
    None
}

/// The `--json` report's entry for `gear`, if the last line is one.
fn json_report(gear: &str, stdout: &str) -> Option<Outcome> {
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    if !last.starts_with('{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(last).ok()?;
    let entry = v.get(gear)?;
    if entry.get("result") == Some(&serde_json::Value::Bool(true)) {
        return Some(Outcome::Done);
    }
    let msg = entry
        .get("message")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("failed without a message");
    Some(classify(msg).unwrap_or_else(|| Outcome::failed(Failure::Unrecognized, msg)))
}

/// What `oo-admin-move` answered for `gear`.
pub fn parse(gear: &str, exit: &Exit) -> Outcome {
    let exit = &exit.without_cr();
    if let Some(o) = common(exit) {
        return o;
    }
    if let Some(o) = json_report(gear, &exit.stdout) {
        return o;
    }
    if exit.code == Some(0) {
        return Outcome::Done;
    }
    // The message is the last line printed; debug lines come before it.
    let lines = exit.stdout.lines().rev().chain(exit.stderr.lines().rev());
    let found = lines
        .filter(|l| !l.starts_with("DEBUG: ") && !l.starts_with("WARNING: "))
        .find_map(classify);
    found.unwrap_or_else(|| Outcome::failed(Failure::Unrecognized, detail(exit)))
}
