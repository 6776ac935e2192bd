//! The example alert rules (`docs/prometheus/gearshift-alerts.yml`) pass
//! `promtool check rules`. promtool comes with Debian's `prometheus`
//! package, which `scripts/test-deps` installs.

use std::process::Command;

#[test]
fn the_alert_rules_pass_promtool() {
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/prometheus/gearshift-alerts.yml"
    );
    let out = match Command::new("promtool")
        .args(["check", "rules", rules])
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!(
            "promtool is not installed ({e}): run scripts/test-deps (it installs Debian's prometheus package)"
        ),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check rules failed:\n{text}");
    assert!(text.contains("SUCCESS: 5 rules found"), "{text}");
}
