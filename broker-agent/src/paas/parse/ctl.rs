//! `oo-admin-ctl-district` for one node (`broker-util/oo-admin-ctl-district`,
//! model in `controller/app/models/district.rb`).
//!
//! The tool collects each `-i` node's result in `collate_errors`
//! (`oo-admin-ctl-district:183-193`): `Success for node 'S'!` in the result,
//! or `Error for node 'S': MSG` in the errors, where `MSG` is the model's
//! `OOException` message. It prints the result, then `ERROR OUTPUT:` and the
//! errors, all on standard output (`:331-334`), and exits with the last
//! failure's code: 1 for the model's refusals, 143 for a node that does not
//! answer. With `-u`/`-n` the district's document follows the result
//! (`:318-321`, Ruby's `pretty_inspect`).

use super::super::Operation;
use super::super::outcome::{Cause, Failure, Outcome};
use super::{Exit, common, detail};

/// Splits standard output into the result and the `ERROR OUTPUT:` section.
fn sections(stdout: &str) -> (&str, &str) {
    const MARK: &str = "ERROR OUTPUT:\n";
    if let Some(rest) = stdout.strip_prefix(MARK) {
        return ("", rest);
    }
    match stdout.split_once(&format!("\n{MARK}")) {
        Some((result, errors)) => (result, errors),
        None => (stdout, ""),
    }
}

/// `MSG` of `Error for node 'S': MSG` (`oo-admin-ctl-district:189`).
fn node_error<'a>(errors: &'a str, host: &str) -> Option<&'a str> {
    let prefix = format!("Error for node '{host}': ");
    errors
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(str::trim_end)
}

/// What precedes `Success for node 'S'!` on its line (`oo-admin-ctl-district:187`).
/// add-node appends `Cannot add a node with platform 'K' to a district with
/// platform 'P'` to the result without a newline and still reports success
/// (`:239`), so the text before the marker matters.
fn success_prefix<'a>(result: &'a str, host: &str) -> Option<&'a str> {
    let mark = format!("Success for node '{host}'!");
    result
        .lines()
        .find_map(|l| l.trim_end().strip_suffix(mark.as_str()))
}

/// Whether the district document printed after the result lists `host`
/// among its servers (Ruby 1.9-2.x `"name"=>"S"`, Ruby 3.4 `"name" => "S"`).
fn district_lists(result: &str, host: &str) -> bool {
    let servers = ["\"servers\"=>", "\"servers\" => "]
        .iter()
        .find_map(|m| result.split_once(m).map(|(_, rest)| rest));
    servers.is_some_and(|rest| {
        rest.contains(&format!("\"name\"=>\"{host}\""))
            || rest.contains(&format!("\"name\" => \"{host}\""))
    })
}

/// One node's `MSG`, as the model raises it (`district.rb` lines).
fn node_refusal(op: Operation, host: &str, msg: &str, result: &str) -> Outcome {
    use Operation::*;
    let refused = |cause| Outcome::refused(cause, msg);
    let already = || Outcome::AlreadyInState {
        detail: msg.to_string(),
    };
    // :190 / :206: repeating deactivate / activate.
    if op == Deactivate && msg.ends_with(" is already deactivated") {
        return already();
    }
    if op == Activate && msg.ends_with(" is already active") {
        return already();
    }
    // :152, :187, :203 with -u/-n; oo-admin-ctl-district:197 without.
    if msg.contains(" doesn't belong to district: ") || msg.starts_with("District not found for ") {
        return if op == RemoveNode {
            already()
        } else {
            refused(Cause::NotInDistrict)
        };
    }
    // :124-126 checks every district, this one included: the document
    // printed after the result tells whether it is this one.
    if msg.ends_with(" already belongs to another district") {
        return if op == AddNode && district_lists(result, host) {
            already()
        } else {
            refused(Cause::InAnotherDistrict)
        };
    }
    // :171 (remove-node, node not answering), proxy :3734 (NodeException 143).
    if msg.contains("Node execution failure") || msg.contains(" might be unresponsive, run ") {
        return refused(Cause::NodeUnreachable);
    }
    if msg.ends_with(" must be deactivated before it can be removed") {
        return refused(Cause::NodeActive); // :156
    }
    if msg.ends_with(" already has gears on it") // :128
        || msg.ends_with(" because it still has apps on it") // :165-166
        || msg.ends_with(" because some apps in mongo are still using it.")
    // :160-161
    {
        return refused(Cause::NodeHasGears);
    }
    if msg.contains(" is of node profile '") && msg.contains("' and needs to be '") {
        return refused(Cause::ProfileMismatch); // :129-130
    }
    if msg.ends_with(" is unresponsive") {
        return refused(Cause::NodeUnresponsive); // :207
    }
    // :142, :174, :197, :212: the MongoDB update did not apply.
    if msg.starts_with("Could not ") {
        return Outcome::failed(Failure::StoreUpdate, msg);
    }
    Outcome::failed(Failure::Unrecognized, msg)
}

/// No line for the node: a check before (or around) the per-node loop.
fn tool_refusal(exit: &Exit) -> Outcome {
    let out = format!("{}\n{}", exit.stdout, exit.stderr);
    let line = |needles: &[&str]| {
        out.lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .map(|l| l.trim().to_string())
    };
    let refusals: [(&[&str], Cause); 5] = [
        (&["Cannot connect to node."], Cause::NodeUnreachable), // :229-233 (add-node)
        (&["Node profile must be one of: "], Cause::UnknownProfile), // :134-137
        (&["District '", "' not found"], Cause::UnknownDistrict), // :143-149
        (&["Invalid district name '"], Cause::UnknownDistrict), // district.rb:27
        (
            &["District creation disabled by the platform."],
            Cause::UnknownDistrict,
        ), // district.rb:34
    ];
    for (needles, cause) in refusals {
        if let Some(l) = line(needles) {
            return Outcome::refused(cause, l);
        }
    }
    // :154-161, :174-181: the template lacks an option the command needs.
    for needle in [
        " is required with command: ",
        "--name is required with create",
    ] {
        if let Some(l) = line(&[needle]) {
            return Outcome::failed(Failure::Usage, l);
        }
    }
    if exit.code == Some(0) {
        return Outcome::failed(
            Failure::UnexpectedOutput,
            format!("exited 0 without a result for the node: {}", detail(exit)),
        );
    }
    Outcome::failed(Failure::Unrecognized, detail(exit))
}

/// What `oo-admin-ctl-district` answered for `host` (`op` is one of the
/// district operations).
pub fn parse(op: Operation, host: &str, exit: &Exit) -> Outcome {
    let exit = &exit.without_cr();
    if let Some(o) = common(exit) {
        return o;
    }
    let (result, errors) = sections(&exit.stdout);
    if let Some(msg) = node_error(errors, host) {
        return node_refusal(op, host, msg, result);
    }
    if let Some(prefix) = success_prefix(result, host) {
        if let Some((_, platform)) = prefix.split_once("Cannot add a node with platform '") {
            return Outcome::refused(
                Cause::PlatformMismatch,
                format!("Cannot add a node with platform '{platform}"),
            );
        }
        if exit.code == Some(0) {
            return Outcome::Done;
        }
        return Outcome::failed(
            Failure::Unrecognized,
            format!(
                "exit {:?} after success for the node: {}",
                exit.code,
                detail(exit)
            ),
        );
    }
    tool_refusal(exit)
}
