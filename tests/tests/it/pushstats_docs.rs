//! The CloudWatch-era Heat template in `docs/heat/` passes cfn-lint (AWS's
//! own CloudFormation linter, from the test virtualenv) without errors:
//! resource types, properties, references and dependencies are checked by
//! a tool that knows the AWS resource specifications. (Warnings remain by
//! design: Heat takes image names where AWS wants AMI ids, and Heat still
//! implements launch configurations.) The HOT template and both templates'
//! agreement with the code are checked in `pushstats/tests/it/heat_templates.rs`.

use std::path::Path;
use std::time::Duration;

use gearshift_tests::{python, repo_root};

const LINT: &str = "import sys\nfrom cfnlint.runner import main\nsys.argv = ['cfn-lint', '--format', 'parseable'] + sys.argv[1:]\nsys.exit(main())\n";

/// Runs cfn-lint on `file`: (exit code, error lines).
async fn cfn_lint(file: &Path) -> (i32, Vec<String>) {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python())
            .args(["-c", LINT])
            .arg(file)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("cfn-lint finished within 120 s")
    .expect("run cfn-lint (installed with moto by scripts/test-deps)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let code = out.status.code().expect("cfn-lint exit code");
    assert!(
        code & !0b1110 == 0,
        "cfn-lint failed to run ({code}): {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // parseable: file:line:col:eline:ecol:RULE:message; E rules are errors.
    let errors = stdout
        .lines()
        .filter(|l| {
            l.split(':')
                .nth(5)
                .is_some_and(|rule| rule.starts_with('E'))
        })
        .map(str::to_string)
        .collect();
    (code, errors)
}

#[tokio::test]
async fn cloudwatch_era_template_passes_cfn_lint() {
    let file = repo_root().join("docs/heat/gearshift-autoscaling-cfn.yaml");
    let (code, errors) = cfn_lint(&file).await;
    assert!(errors.is_empty(), "cfn-lint errors:\n{}", errors.join("\n"));
    assert_eq!(code & 2, 0, "cfn-lint reported errors (exit {code})");
}

#[tokio::test]
async fn cfn_lint_does_catch_a_broken_template() {
    // The same template with the launch configuration naming the alarms
    // (which depend on the group, which depends on it): a dependency loop.
    let text = std::fs::read_to_string(repo_root().join("docs/heat/gearshift-autoscaling-cfn.yaml"))
        .unwrap()
        .replace(
            "              - \"credential_file = \\\"/etc/cfn/cfn-credentials\\\"\\n\"\n",
            "              - \"credential_file = \\\"/etc/cfn/cfn-credentials\\\"\\n\"\n              - Ref: NodeAlarmHigh\n",
        );
    assert!(text.contains("- Ref: NodeAlarmHigh\n"), "the edit applied");
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, text).unwrap();
    let (code, errors) = cfn_lint(&broken).await;
    assert!(
        errors.iter().any(|e| e.contains(":E3004:")),
        "no circular-dependency error: {errors:?}"
    );
    assert_ne!(code & 2, 0);
}
