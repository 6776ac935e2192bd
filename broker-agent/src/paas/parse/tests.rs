//! The parsers on the texts origin-server's tools print (7fd1910). Each
//! case builds standard output as the tool does: `puts "#{result}\n"`, then
//! `puts "ERROR OUTPUT:\n#{errors}\n"` (`oo-admin-ctl-district:332-333`).

use super::super::Operation::{self, *};
use super::super::outcome::{Cause, Failure, Outcome};
use super::{Exit, ctl, moves};

const HOST: &str = "node-1.example.com";
const UUID: &str = "5fd7b2c1a9e04d1f8b3e6a2c";

/// The district's document as `append_district` prints it after the
/// result (`oo-admin-ctl-district:49-52`, Mongoid attributes through
/// `pretty_inspect`), listing `servers`.
fn district_doc(servers: &[&str]) -> String {
    let servers: Vec<String> = servers
        .iter()
        .map(|s| {
            format!(
                "{{\"_id\"=>\"5fd7b2c1a9e04d1f8b3e6a2d\", \"name\"=>\"{s}\", \"active\"=>true, \"unresponsive\"=>false}}"
            )
        })
        .collect();
    format!(
        "\n\n{{\"_id\"=>\"{UUID}\",\n \"name\"=>\"d1\",\n \"uuid\"=>\"{UUID}\",\n \"gear_size\"=>\"small\",\n \"available_uids\"=>\"<5998 uids hidden>\",\n \"servers\"=>\n  [{}],\n \"max_uid\"=>6999}}\n",
        servers.join(",\n   ")
    )
}

fn ctl_exit(code: i32, result: &str, errors: &str) -> Exit {
    let mut stdout = String::new();
    if !result.is_empty() {
        stdout.push_str(result);
        stdout.push('\n');
    }
    if !errors.is_empty() {
        stdout.push_str(&format!("ERROR OUTPUT:\n{errors}\n"));
    }
    Exit {
        code: Some(code),
        stdout,
        ..Exit::default()
    }
}

/// `Error for node 'S': MSG` (`oo-admin-ctl-district:189`) with the
/// district document in the result, exit 1.
fn node_error(msg: &str) -> Exit {
    ctl_exit(
        1,
        &district_doc(&[]),
        &format!("Error for node '{HOST}': {msg}\n"),
    )
}

fn ctl(op: Operation, exit: &Exit) -> Outcome {
    ctl::parse(op, HOST, exit)
}

fn refused(o: &Outcome) -> Cause {
    match o {
        Outcome::Refused { cause, .. } => *cause,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn failure(o: &Outcome) -> (Failure, bool) {
    match o {
        Outcome::Failed {
            failure, retryable, ..
        } => (*failure, *retryable),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn success_line_is_done() {
    // :187, then the district document (:318-321).
    let result = format!("Success for node '{HOST}'!\n{}", district_doc(&[HOST]));
    for op in [Deactivate, Activate, AddNode, RemoveNode] {
        assert_eq!(ctl(op, &ctl_exit(0, &result, "")), Outcome::Done, "{op}");
    }
    // Another node's line is not this node's ("node-1" is a prefix of "node-10").
    let other = ctl_exit(0, "Success for node 'node-1.example.com.other'!\n", "");
    assert_eq!(
        failure(&ctl(Deactivate, &other)).0,
        Failure::UnexpectedOutput
    );
}

#[test]
fn repeats_are_already_in_state() {
    // district.rb:190, :206.
    let o = ctl(
        Deactivate,
        &node_error(&format!(
            "Node with server identity: {HOST} is already deactivated"
        )),
    );
    assert!(
        matches!(&o, Outcome::AlreadyInState { detail } if detail.ends_with("is already deactivated")),
        "{o:?}"
    );
    let o = ctl(
        Activate,
        &node_error(&format!(
            "Node with server identity: {HOST} is already active"
        )),
    );
    assert!(matches!(o, Outcome::AlreadyInState { .. }), "{o:?}");
    // district.rb:152 with -u, oo-admin-ctl-district:197 without: removed already.
    let gone = format!("Node with server identity: {HOST} doesn't belong to district: {UUID}");
    assert!(ctl(RemoveNode, &node_error(&gone)).is_success());
    assert_eq!(
        refused(&ctl(Deactivate, &node_error(&gone))),
        Cause::NotInDistrict
    );
    assert_eq!(
        refused(&ctl(Activate, &node_error(&gone))),
        Cause::NotInDistrict
    );
    let none = format!("District not found for {HOST}");
    assert!(ctl(RemoveNode, &node_error(&none)).is_success());
    assert_eq!(
        refused(&ctl(Deactivate, &node_error(&none))),
        Cause::NotInDistrict
    );
}

#[test]
fn output_through_a_terminal_reads_the_same() {
    // sudo's use_pty: every "\n" arrives as "\r\n".
    let crlf = |e: Exit| Exit {
        stdout: e.stdout.replace('\n', "\r\n"),
        ..e
    };
    let e = node_error(&format!(
        "Node with server identity: {HOST} is already deactivated"
    ));
    assert!(matches!(
        ctl(Deactivate, &crlf(e)),
        Outcome::AlreadyInState { .. }
    ));
    let e = node_error(&format!(
        "Node with server identity: {HOST} from district: {UUID} must be deactivated before it can be removed"
    ));
    assert_eq!(refused(&ctl(RemoveNode, &crlf(e))), Cause::NodeActive);
    let e = move_exit(
        1,
        "Error moving gear. Old and new servers are the same: n2\n",
    );
    assert!(moves::parse(GEAR, &crlf(e)).is_success());
}

#[test]
fn add_node_repeated_into_the_same_district_is_already_in_state() {
    // district.rb:124-126 refuses a node of any district, this one included;
    // the district document printed after the result says which.
    let msg = format!("Node with server identity: {HOST} already belongs to another district");
    let errors = format!("Error for node '{HOST}': {msg}\n");
    let here = ctl_exit(1, &district_doc(&["node-2.example.com", HOST]), &errors);
    assert!(matches!(
        ctl(AddNode, &here),
        Outcome::AlreadyInState { .. }
    ));
    let elsewhere = ctl_exit(1, &district_doc(&["node-2.example.com"]), &errors);
    assert_eq!(refused(&ctl(AddNode, &elsewhere)), Cause::InAnotherDistrict);
    // Ruby 3.4 prints `"name" => "S"`.
    let spaced = district_doc(&[HOST]).replace("=>", " => ");
    assert!(ctl(AddNode, &ctl_exit(1, &spaced, &errors)).is_success());
}

#[test]
fn model_refusals_name_their_cause() {
    let h = HOST;
    let cases = [
        // district.rb:128, :165-166, :160-161
        (
            AddNode,
            format!("Node with server identity: {h} already has gears on it"),
            Cause::NodeHasGears,
        ),
        (
            RemoveNode,
            format!(
                "Node with server identity: {h} could not be removed from district: {UUID} because it still has apps on it"
            ),
            Cause::NodeHasGears,
        ),
        (
            RemoveNode,
            format!(
                "Node with server identity: {h} could not be removed from district: {UUID} because some apps in mongo are still using it."
            ),
            Cause::NodeHasGears,
        ),
        // :156
        (
            RemoveNode,
            format!(
                "Node with server identity: {h} from district: {UUID} must be deactivated before it can be removed"
            ),
            Cause::NodeActive,
        ),
        // :129-130
        (
            AddNode,
            format!(
                "Node with server identity: {h} is of node profile 'medium' and needs to be 'small' to add to district 'd1'"
            ),
            Cause::ProfileMismatch,
        ),
        // :207
        (
            Activate,
            format!("Node with server identity: {h} is unresponsive"),
            Cause::NodeUnresponsive,
        ),
        // :171 around proxy :3734's NodeException
        (
            RemoveNode,
            format!(
                "Error: Node execution failure (error getting facts).. Node with server identity: {h} might be unresponsive, run oo-admin-repair --removed-nodes and retry the current operation."
            ),
            Cause::NodeUnreachable,
        ),
        // proxy :3734 through collate_errors: exit 143
        (
            AddNode,
            "Node execution failure (error getting facts).".to_string(),
            Cause::NodeUnreachable,
        ),
    ];
    for (op, msg, cause) in cases {
        let o = ctl(op, &node_error(&msg));
        assert_eq!(refused(&o), cause, "{msg}");
        assert_eq!(o.is_retryable(), cause == Cause::NodeUnreachable, "{msg}");
        assert!(matches!(&o, Outcome::Refused { detail, .. } if *detail == msg));
    }
}

#[test]
fn add_node_platform_and_connection_refusals() {
    // :239 appends its text to the result without a newline and still
    // reports success, exit 0.
    let result = format!(
        "Cannot add a node with platform 'Windows' to a district with platform 'Linux'Success for node '{HOST}'!\n{}",
        district_doc(&[])
    );
    let o = ctl(AddNode, &ctl_exit(0, &result, ""));
    assert_eq!(refused(&o), Cause::PlatformMismatch);
    // :229-233: no line for the node, exit 1.
    let o = ctl(
        AddNode,
        &ctl_exit(1, &district_doc(&[]), "Cannot connect to node.\n"),
    );
    assert_eq!(refused(&o), Cause::NodeUnreachable);
    assert!(o.is_retryable());
}

#[test]
fn checks_before_the_node_loop() {
    // :147, :144, :135: printed with puts, exit 1.
    let plain = |text: &str, code| Exit {
        code: Some(code),
        stdout: format!("{text}\n"),
        ..Exit::default()
    };
    let o = ctl(
        Deactivate,
        &plain(&format!("District '{UUID}' not found."), 1),
    );
    assert_eq!(refused(&o), Cause::UnknownDistrict);
    let o = ctl(
        AddNode,
        &plain(
            &format!("District '{UUID}' not found, and no profile given to auto-create."),
            1,
        ),
    );
    assert_eq!(refused(&o), Cause::UnknownDistrict);
    let o = ctl(
        AddNode,
        &plain("Node profile must be one of: (small(default)|medium)", 1),
    );
    assert_eq!(refused(&o), Cause::UnknownProfile);
    // district.rb:27 through :322-328 (add-node with -u and -p for a missing district).
    let o = ctl(AddNode, &ctl_exit(1, "", "Invalid district name ''"));
    assert_eq!(refused(&o), Cause::UnknownDistrict);
    // :155, :121, :126 and GetoptLong (:88-93): the template is wrong.
    for (text, code) in [
        (
            "--server_identity is required with command: deactivate-node",
            1,
        ),
        ("Error: --command is required with any arguments", 255),
        (
            "Command must be one of: list|nodes-available|create|add-node",
            255,
        ),
    ] {
        let (f, again) = failure(&ctl(Deactivate, &plain(text, code)));
        assert_eq!((f, again), (Failure::Usage, false), "{text}");
    }
    let getopt = Exit {
        code: Some(255),
        stdout: "== Synopsis\n\noo-admin-ctl-district: Control districts\n".into(),
        stderr: "oo-admin-ctl-district: unrecognized option `--bogus'\n".into(),
        ..Exit::default()
    };
    let o = ctl(Deactivate, &getopt);
    assert!(
        matches!(&o, Outcome::Failed { failure: Failure::Usage, detail, .. } if detail.contains("--bogus")),
        "{o:?}"
    );
}

#[test]
fn failures_are_typed_with_their_retry() {
    // district.rb:197: the MongoDB update did not apply.
    let o = ctl(
        Deactivate,
        &node_error(&format!("Could not deactivate node {HOST}")),
    );
    assert_eq!(failure(&o), (Failure::StoreUpdate, true));
    // An exception the tool does not rescue (tool:130 loads the broker).
    let crash = Exit {
        code: Some(1),
        stderr: "/opt/rh/ruby193/root/usr/share/gems/gems/moped-1.5.2/lib/moped/node.rb:74:in `block in ensure_primary': Could not connect to a primary node for replica set #<Moped::Cluster nodes=[<Moped::Node resolved_address=\"127.0.0.1:27017\">]> (Moped::Errors::ConnectionFailure)\n".into(),
        ..Exit::default()
    };
    let o = ctl(Deactivate, &crash);
    assert_eq!(failure(&o), (Failure::Unrecognized, true));
    assert!(o.to_string().contains("ConnectionFailure"), "{o}");
    // Exit 0 without this node's line: not trusted.
    assert_eq!(
        failure(&ctl(Deactivate, &ctl_exit(0, "", ""))),
        (Failure::UnexpectedOutput, false)
    );
    // sudo in front of the tool.
    for (stderr, f) in [
        ("sudo: a password is required\n", Failure::NotPermitted),
        (
            "sudo: sorry, you must have a tty to run sudo\n",
            Failure::NotPermitted,
        ),
        (
            "Sorry, user gearshift is not allowed to execute '/usr/sbin/oo-admin-ctl-district -c deactivate-node' as root on broker.\n",
            Failure::NotPermitted,
        ),
        (
            "sudo: oo-admin-ctl-district: command not found\n",
            Failure::NotExecutable,
        ),
    ] {
        let e = Exit {
            code: Some(1),
            stderr: stderr.into(),
            ..Exit::default()
        };
        assert_eq!(failure(&ctl(Deactivate, &e)), (f, false), "{stderr}");
    }
    let e = Exit {
        code: Some(127),
        stderr: "env: 'oo-admin-ctl-district': No such file or directory\n".into(),
        ..Exit::default()
    };
    assert_eq!(
        failure(&ctl(Deactivate, &e)),
        (Failure::NotExecutable, false)
    );
    let killed = Exit {
        code: None,
        signal: Some(9),
        ..Exit::default()
    };
    assert_eq!(
        failure(&ctl(Deactivate, &killed)),
        (Failure::Signaled, true)
    );
}

const GEAR: &str = "0f8a5e0ad9b54ab2a0be1b1c02a3b9f8";

/// oo-admin-move's header (`oo-admin-move:125-130`) and the proxy's debug
/// lines (`log_debug`, proxy :2360-2361), then `tail`.
fn move_exit(code: i32, tail: &str) -> Exit {
    Exit {
        code: Some(code),
        stdout: format!(
            "URL: http://app-ns.example.com\nLogin: user\nApp UUID: {GEAR}\nGear UUID: {GEAR}\nDEBUG: Source district uuid: {UUID}\nDEBUG: Destination district uuid: {UUID}\n{tail}"
        ),
        ..Exit::default()
    }
}

#[test]
fn a_move_that_exits_0_is_done() {
    // proxy :2261.
    let ok = move_exit(
        0,
        &format!(
            "Successfully moved gear with uuid '{GEAR}' of app 'app' from 'node-1.example.com' to 'node-2.example.com'\n"
        ),
    );
    assert_eq!(moves::parse(GEAR, &ok), Outcome::Done);
}

#[test]
fn move_refusals_name_their_cause() {
    let cases = [
        (format!("ERROR: Gear not found: {GEAR}"), Cause::GearNotFound), // tool:102
        ("Error moving gear. Move gear only allowed from non-districted/districted node to districted node.".to_string(), Cause::TargetNotDistricted), // :2065
        ("Node execution failure (error getting facts).".to_string(), Cause::NodeUnreachable), // :3734
        ("Error moving gear. Old and new servers must belong to the same region, source region: r1 destination region: r2".to_string(), Cause::RegionMismatch), // :2371
        ("Error moving gear. Destination container platform is not the same as the source container platform.".to_string(), Cause::PlatformMismatch), // :2053
        ("Error moving gear. Cannot change node profile for *scalable* app.".to_string(), Cause::ProfileMismatch), // :2075
        (format!("Gear '{GEAR}' cannot be moved to 'node-2.example.com'.  Not enough disk space, node would be > 95% full after move."), Cause::TargetFull), // :2417
        ("Error moving gear. Cannot move gear to medium node profile while gear exceeds profile quota limits.".to_string(), Cause::QuotaExceeded), // :2100
    ];
    for (msg, cause) in cases {
        let o = moves::parse(GEAR, &move_exit(1, &format!("{msg}\n")));
        assert_eq!(refused(&o), cause, "{msg}");
    }
}

#[test]
fn a_gear_already_on_the_target_is_already_in_state() {
    // proxy :2364-2366: with -i, source and destination are the target.
    let o = moves::parse(
        GEAR,
        &move_exit(
            1,
            "Error moving gear. Old and new servers are the same: node-2.example.com\n",
        ),
    );
    assert!(matches!(o, Outcome::AlreadyInState { .. }), "{o:?}");
}

#[test]
fn move_failures_and_crashes() {
    // proxy :2439: the copy failed, the move was rolled back (:2208-2252).
    let o = moves::parse(
        GEAR,
        &move_exit(
            1,
            &format!(
                "DEBUG: Moving failed.  Rolling back gear '{GEAR}' in 'app' with delete on 'node-2.example.com'\nError moving app 'app', platform 'linux', gear '{GEAR}' from node-1.example.com to node-2.example.com\n"
            ),
        ),
    );
    assert_eq!(failure(&o), (Failure::CopyFailed, true));
    // proxy :273: an OOException oo-admin-move does not rescue.
    let mut crash = move_exit(1, "DEBUG: Gear platform is 'linux'\n");
    crash.stderr = "/var/www/openshift/broker/../mcollective_application_container_proxy.rb:273:in `reserve_uid': uid could not be reserved in target district 'd2'.  Please ensure the target district has available capacity or does not contain a conflicting uid. (OpenShift::OOException)\n\tfrom /usr/sbin/oo-admin-move:147:in `block in <main>'\n".into();
    assert_eq!(refused(&moves::parse(GEAR, &crash)), Cause::UidUnavailable);
    // tool:72-74.
    let o = moves::parse(
        GEAR,
        &Exit {
            code: Some(1),
            stdout: "ERROR: Timeout must be a positive integer\n".into(),
            ..Exit::default()
        },
    );
    assert_eq!(failure(&o), (Failure::Usage, false));
    let o = moves::parse(GEAR, &move_exit(1, "something new\n"));
    assert_eq!(failure(&o), (Failure::Unrecognized, true));
}

#[test]
fn move_json_report() {
    // tool:134-166, 178.
    let ok = Exit {
        code: Some(0),
        stdout: format!(
            "{{\"{GEAR}\":{{\"login\":\"user\",\"app_uuid\":\"a\",\"gear_uuid\":\"{GEAR}\",\"result\":true,\"destination\":\"node-2.example.com\"}}}}\n"
        ),
        ..Exit::default()
    };
    assert_eq!(moves::parse(GEAR, &ok), Outcome::Done);
    let no = Exit {
        code: Some(1),
        stdout: format!(
            "{{\"{GEAR}\":{{\"result\":false,\"message\":\"Error moving gear. Move gear only allowed from non-districted/districted node to districted node.\",\"trace\":[]}}}}\n"
        ),
        ..Exit::default()
    };
    assert_eq!(
        refused(&moves::parse(GEAR, &no)),
        Cause::TargetNotDistricted
    );
}
