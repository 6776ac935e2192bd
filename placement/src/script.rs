//! The `script` strategy: an operator's Rhai script, sandboxed.
//!
//! The script defines `fn place(input)`. It sees only what it is given (no
//! files, no modules, no `eval`) and is stopped after `max_operations`
//! operations, `timeout` of wall-clock time, `max_call_depth` nested calls,
//! or when it builds a string, array or map beyond its limit.
//!
//! ```rhai
//! fn place(input) {
//!     if input.user.login == "slowpoke" { throw "slowpoke is on vacation"; }
//!     let best = ();
//!     for n in input.nodes {
//!         if best == () || n.node_consumed_capacity < best.node_consumed_capacity { best = n; }
//!     }
//!     best.name
//! }
//! ```

use std::cell::Cell;
use std::time::{Duration, Instant};

use rhai::{AST, Dynamic, Engine, EvalAltResult, Scope};

use crate::config::ScriptConfig;
use crate::error::ScriptError;

/// What a script (or a command) decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This node (a name still to be checked against the candidates).
    Node(String),
    /// No preference: place with the `default` strategy.
    Delegate,
    /// A deliberate refusal with the script's reason.
    Refuse(String),
}

thread_local! {
    // The deadline of the script call running on this thread; the progress
    // callback is shared by every call, so the per-call deadline lives here.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How often (in operations) the progress callback looks at the clock.
const CLOCK_EVERY: u64 = 256;

/// A compiled script with its sandboxed engine.
pub struct ScriptStrategy {
    engine: Engine,
    ast: AST,
    timeout: Duration,
    max_operations: u64,
}

impl std::fmt::Debug for ScriptStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptStrategy")
            .field("timeout", &self.timeout)
            .field("max_operations", &self.max_operations)
            .finish_non_exhaustive()
    }
}

impl ScriptStrategy {
    /// Reads (when `path` is set) and compiles the script; checks that it
    /// defines `fn place(input)`.
    pub fn new(cfg: &ScriptConfig) -> Result<ScriptStrategy, ScriptError> {
        let text = match (&cfg.path, &cfg.inline) {
            (Some(p), _) => std::fs::read_to_string(p).map_err(|e| ScriptError::Read {
                path: p.clone(),
                reason: e.to_string(),
            })?,
            (None, Some(s)) => s.clone(),
            (None, None) => {
                return Err(ScriptError::Compile {
                    reason: "no script given (script.path or script.inline)".into(),
                });
            }
        };
        Self::compile(&text, cfg)
    }

    /// Compiles script text with the limits of `cfg`.
    pub fn compile(text: &str, cfg: &ScriptConfig) -> Result<ScriptStrategy, ScriptError> {
        let engine = sandboxed_engine(cfg);
        let ast = engine.compile(text).map_err(|e| ScriptError::Compile {
            reason: e.to_string(),
        })?;
        if !ast
            .iter_functions()
            .any(|f| f.name == "place" && f.params.len() == 1)
        {
            return Err(ScriptError::NoPlaceFunction);
        }
        Ok(ScriptStrategy {
            engine,
            ast,
            timeout: cfg.timeout,
            max_operations: cfg.max_operations,
        })
    }

    /// Runs `place(input)`. A `throw` becomes [`Verdict::Refuse`] with the
    /// thrown value as the reason; every other failure is a [`ScriptError`].
    pub fn decide(&self, input: &serde_json::Value) -> Result<Verdict, ScriptError> {
        let input: Dynamic = rhai::serde::to_dynamic(input).map_err(|e| ScriptError::Runtime {
            reason: format!("cannot hand the input to the script: {e}"),
        })?;
        let mut scope = Scope::new();
        DEADLINE.with(|d| d.set(Some(Instant::now() + self.timeout)));
        let r = self
            .engine
            .call_fn::<Dynamic>(&mut scope, &self.ast, "place", (input,));
        DEADLINE.with(|d| d.set(None));
        match r {
            Ok(v) if v.is_unit() => Ok(Verdict::Delegate),
            Ok(v) if v.is_string() => Ok(Verdict::Node(v.into_string().unwrap_or_default())),
            Ok(v) => Err(ScriptError::BadReturn {
                got: v.type_name().to_string(),
            }),
            Err(e) => self.classify(&e),
        }
    }

    fn classify(&self, e: &EvalAltResult) -> Result<Verdict, ScriptError> {
        Err(match e.unwrap_inner() {
            EvalAltResult::ErrorRuntime(v, _) => {
                let reason = if v.is_string() {
                    v.clone().into_string().unwrap_or_default()
                } else if v.is_unit() {
                    "refused by the script".to_string()
                } else {
                    v.to_string()
                };
                return Ok(Verdict::Refuse(truncate(&reason, 1024)));
            }
            EvalAltResult::ErrorTooManyOperations(_) => ScriptError::TooManyOperations {
                limit: self.max_operations,
            },
            EvalAltResult::ErrorTerminated(..) => ScriptError::Timeout {
                after: self.timeout,
            },
            other => ScriptError::Runtime {
                reason: truncate(&other.to_string(), 1024),
            },
        })
    }
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn sandboxed_engine(cfg: &ScriptConfig) -> Engine {
    let mut engine = Engine::new();
    // No file access: `import` resolves nothing, and `eval` cannot build code.
    engine.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    engine.disable_symbol("eval");
    engine.set_max_operations(cfg.max_operations);
    engine.set_max_call_levels(cfg.max_call_depth);
    engine.set_max_string_size(cfg.max_string_size);
    engine.set_max_array_size(cfg.max_array_size);
    engine.set_max_map_size(cfg.max_map_size);
    engine.set_max_expr_depths(64, 64);
    engine.set_max_modules(0);
    engine.on_print(
        |s| tracing::info!(target: "gearshift_placement::script", "{}", truncate(s, 1024)),
    );
    engine.on_debug(|s, _src, pos| {
        tracing::debug!(target: "gearshift_placement::script", %pos, "{}", truncate(s, 1024))
    });
    engine.on_progress(|ops| {
        if ops % CLOCK_EVERY == 0 {
            let late = DEADLINE.with(|d| d.get().is_some_and(|t| Instant::now() >= t));
            if late {
                return Some(Dynamic::from("timeout"));
            }
        }
        None
    });
    engine
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> ScriptConfig {
        ScriptConfig::default()
    }

    fn input() -> serde_json::Value {
        json!({"nodes": [{"name": "a", "node_consumed_capacity": 50.0},
                         {"name": "b", "node_consumed_capacity": 10.0}],
               "user": {"login": "bob"}})
    }

    #[test]
    fn returns_a_name() {
        let s = ScriptStrategy::compile(
            r#"fn place(input) {
                let best = ();
                for n in input.nodes {
                    if best == () || n.node_consumed_capacity < best.node_consumed_capacity { best = n; }
                }
                best.name
            }"#,
            &cfg(),
        )
        .unwrap();
        assert_eq!(s.decide(&input()).unwrap(), Verdict::Node("b".into()));
    }

    #[test]
    fn throw_is_a_refusal_and_unit_delegates() {
        let s = ScriptStrategy::compile(
            r#"fn place(input) { if input.user.login == "bob" { throw "bob is banned"; } }"#,
            &cfg(),
        )
        .unwrap();
        assert_eq!(
            s.decide(&input()).unwrap(),
            Verdict::Refuse("bob is banned".into())
        );
        let mut other = input();
        other["user"]["login"] = json!("alice");
        assert_eq!(s.decide(&other).unwrap(), Verdict::Delegate);
    }

    #[test]
    fn nested_throw_is_still_a_refusal() {
        let s = ScriptStrategy::compile(
            r#"fn check(u) { if u == "bob" { throw "no bob"; } }
               fn place(input) { check(input.user.login); "a" }"#,
            &cfg(),
        )
        .unwrap();
        assert_eq!(
            s.decide(&input()).unwrap(),
            Verdict::Refuse("no bob".into())
        );
    }

    #[test]
    fn compile_errors_and_missing_function() {
        let e = ScriptStrategy::compile("fn place(input) { let = ; }", &cfg()).unwrap_err();
        assert!(
            matches!(e, ScriptError::Compile { ref reason } if reason.contains("line 1")),
            "{e}"
        );
        let e = ScriptStrategy::compile("fn choose(input) { 1 }", &cfg()).unwrap_err();
        assert_eq!(e, ScriptError::NoPlaceFunction);
        let e = ScriptStrategy::compile("fn place() { 1 }", &cfg()).unwrap_err();
        assert_eq!(e, ScriptError::NoPlaceFunction);
    }

    #[test]
    fn runaway_scripts_are_stopped() {
        let mut c = cfg();
        c.max_operations = 10_000;
        let s = ScriptStrategy::compile("fn place(input) { loop { } }", &c).unwrap();
        assert_eq!(
            s.decide(&input()).unwrap_err(),
            ScriptError::TooManyOperations { limit: 10_000 }
        );

        let mut c = cfg();
        c.max_operations = u64::MAX;
        c.timeout = Duration::from_millis(50);
        let s = ScriptStrategy::compile("fn place(input) { loop { } }", &c).unwrap();
        let t = Instant::now();
        assert_eq!(
            s.decide(&input()).unwrap_err(),
            ScriptError::Timeout {
                after: Duration::from_millis(50)
            }
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn recursion_and_big_strings_are_bounded() {
        let s = ScriptStrategy::compile("fn f(x) { f(x + 1) } fn place(input) { f(0) }", &cfg())
            .unwrap();
        let e = s.decide(&input()).unwrap_err();
        assert!(
            matches!(e, ScriptError::Runtime { ref reason } if reason.contains("tack")),
            "{e}"
        );

        let s = ScriptStrategy::compile(
            r#"fn place(input) { let s = "x"; loop { s += s; } }"#,
            &cfg(),
        )
        .unwrap();
        let e = s.decide(&input()).unwrap_err();
        assert!(
            matches!(e, ScriptError::Runtime { ref reason } if reason.contains("too large") || reason.contains("Length")),
            "{e}"
        );
    }

    #[test]
    fn no_file_access() {
        let s = ScriptStrategy::compile(
            r#"import "/etc/passwd" as p; fn place(input) { "a" }"#,
            &cfg(),
        );
        // Either refused at compile time or when run: never reads the file.
        if let Ok(s) = s {
            let e = s.decide(&input()).unwrap_err();
            assert!(matches!(e, ScriptError::Runtime { .. }), "{e}");
        }
        let e = ScriptStrategy::compile(r#"fn place(input) { eval("40 + 2") }"#, &cfg());
        match e {
            Err(ScriptError::Compile { .. }) => {}
            Ok(s) => assert!(s.decide(&input()).is_err()),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn bad_return_type() {
        let s = ScriptStrategy::compile("fn place(input) { 42 }", &cfg()).unwrap();
        assert!(matches!(
            s.decide(&input()).unwrap_err(),
            ScriptError::BadReturn { .. }
        ));
    }
}
