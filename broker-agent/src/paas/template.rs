//! Command templates: the argv of one operation with `{placeholder}`s,
//! parsed when the configuration loads and filled in without a shell.
//!
//! In the file a template is either one string, split at white space
//! (`"oo-admin-ctl-district -c deactivate-node -u {district} -i {host}"`),
//! or an array with one element per argument (for an argument holding
//! spaces). A placeholder is a whole argument (`{host}`) or part of one
//! (`--gear_uuid={gear}`); `{{` and `}}` stand for literal braces. The
//! program (the first argument) is never a placeholder.

use std::collections::BTreeSet;
use std::fmt;

use gearshift_service::config::Invalid;
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::PaasError;
use super::names::{Placeholder, Values};

/// One piece of an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Value(Placeholder),
}

/// One argument: its text as written and its pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Arg {
    raw: String,
    parts: Vec<Part>,
}

/// A parsed command template (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    args: Vec<Arg>,
}

fn parse_arg(raw: &str) -> Result<Arg, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(format!(
                    "{raw:?}: '}}' without '{{' (write '}}}}' for a brace)"
                ));
            }
            '{' => {
                let mut name = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    name.push(c);
                }
                if !closed {
                    return Err(format!(
                        "{raw:?}: '{{' without '}}' (write '{{{{' for a brace)"
                    ));
                }
                let p = Placeholder::from_name(&name).ok_or_else(|| {
                    let known: Vec<String> =
                        Placeholder::ALL.iter().map(ToString::to_string).collect();
                    format!(
                        "{raw:?}: unknown placeholder {{{name}}} (known: {})",
                        known.join(", ")
                    )
                })?;
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Value(p));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() || parts.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(Arg {
        raw: raw.to_string(),
        parts,
    })
}

impl Template {
    /// Parses a template from its arguments.
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Template, String> {
        let args = args
            .iter()
            .map(|a| parse_arg(a.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        match args.first() {
            None => return Err("is empty: name the program to run".into()),
            Some(a) if a.raw.is_empty() => return Err("the program name is empty".into()),
            Some(a) if a.parts.iter().any(|p| matches!(p, Part::Value(_))) => {
                return Err(format!("{:?}: the program cannot be a placeholder", a.raw));
            }
            Some(_) => {}
        }
        Ok(Template { args })
    }

    /// Parses a template written as one line, split at white space.
    pub fn from_line(line: &str) -> Result<Template, String> {
        Template::from_args(&line.split_whitespace().collect::<Vec<_>>())
    }

    /// The program to run (`argv[0]`).
    pub fn program(&self) -> &str {
        &self.args[0].raw
    }

    /// The placeholders the template uses.
    pub fn placeholders(&self) -> BTreeSet<Placeholder> {
        self.args
            .iter()
            .flat_map(|a| &a.parts)
            .filter_map(|p| match p {
                Part::Value(v) => Some(*v),
                Part::Text(_) => None,
            })
            .collect()
    }

    /// Checks the template of one operation: it uses only `allowed`
    /// placeholders and every one of `required`. Keys in errors are `key`.
    pub fn check(
        &self,
        key: &str,
        allowed: &[Placeholder],
        required: &[Placeholder],
    ) -> Result<(), Invalid> {
        let used = self.placeholders();
        let list = |ps: &[Placeholder]| {
            ps.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(p) = used.iter().find(|p| !allowed.contains(p)) {
            return Err(Invalid::new(
                key,
                format!(
                    "{p} has no value in this operation (it has {})",
                    list(allowed)
                ),
            ));
        }
        if let Some(p) = required.iter().find(|p| !used.contains(p)) {
            return Err(Invalid::new(
                key,
                format!("must use {p} (this operation needs {})", list(required)),
            ));
        }
        Ok(())
    }

    /// The argv with every placeholder replaced by its value.
    pub fn render(&self, values: &Values) -> Result<Vec<String>, PaasError> {
        self.args
            .iter()
            .map(|a| {
                let mut out = String::new();
                for p in &a.parts {
                    match p {
                        Part::Text(t) => out.push_str(t),
                        Part::Value(v) => {
                            out.push_str(values.get(*v).ok_or(PaasError::BadValue {
                                placeholder: *v,
                                value: String::new(),
                                reason: "has no value in this operation".into(),
                            })?)
                        }
                    }
                }
                Ok(out)
            })
            .collect()
    }

    /// The arguments as written.
    fn raw(&self) -> impl Iterator<Item = &str> {
        self.args.iter().map(|a| a.raw.as_str())
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw().collect::<Vec<_>>().join(" "))
    }
}

impl Serialize for Template {
    /// One line when no argument holds white space (or is empty), else an array.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let plain = self
            .raw()
            .all(|a| !a.is_empty() && !a.contains(char::is_whitespace));
        if plain {
            s.serialize_str(&self.to_string())
        } else {
            s.collect_seq(self.raw())
        }
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Template, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Template;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a command line or an array of arguments")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Template, E> {
                Template::from_line(s).map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Template, A::Error> {
                let mut args: Vec<String> = Vec::new();
                while let Some(a) = seq.next_element()? {
                    args.push(a);
                }
                Template::from_args(&args).map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Placeholder::*;

    fn values() -> Values {
        Values::new()
            .with(District, "5fd7b2c1a9e04d1f8b3e6a2c9d0f1e2a")
            .unwrap()
            .with(Host, "node-1.example.com")
            .unwrap()
    }

    #[test]
    fn whole_and_partial_placeholders_become_arguments() {
        let t = Template::from_line(
            "sudo -n oo-admin-ctl-district -c deactivate-node -u {district} --server_identity={host}",
        )
        .unwrap();
        assert_eq!(t.program(), "sudo");
        assert_eq!(t.placeholders(), BTreeSet::from([District, Host]));
        assert_eq!(
            t.render(&values()).unwrap(),
            [
                "sudo",
                "-n",
                "oo-admin-ctl-district",
                "-c",
                "deactivate-node",
                "-u",
                "5fd7b2c1a9e04d1f8b3e6a2c9d0f1e2a",
                "--server_identity=node-1.example.com"
            ]
        );
    }

    #[test]
    fn array_form_keeps_spaces_and_braces_escape() {
        let t = Template::from_args(&["/opt/tool", "a b", "{{{host}}}", "x}}y"]).unwrap();
        assert_eq!(
            t.render(&values()).unwrap(),
            ["/opt/tool", "a b", "{node-1.example.com}", "x}y"]
        );
        // White space inside one argument: written back as an array.
        let text = toml::to_string(&std::collections::BTreeMap::from([("t", &t)])).unwrap();
        assert!(text.contains("[\"/opt/tool\", \"a b\""), "{text}");
        let back: std::collections::BTreeMap<String, Template> = toml::from_str(&text).unwrap();
        assert_eq!(back["t"], t);
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        for (line, why) in [
            ("", "is empty"),
            ("tool {hots}", "unknown placeholder {hots}"),
            ("tool {host", "'{' without '}'"),
            ("tool {host}x{host", "'{' without '}'"),
            ("tool host}", "'}' without '{'"),
            ("{host} -c x", "program cannot be a placeholder"),
            ("tool {}", "unknown placeholder {}"),
        ] {
            let e = Template::from_line(line).unwrap_err();
            assert!(e.contains(why), "{line:?}: {e}");
        }
        assert!(
            Template::from_args(&["", "x"])
                .unwrap_err()
                .contains("empty")
        );
        let e = toml::from_str::<std::collections::BTreeMap<String, Template>>("t = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a command line or an array"), "{e}");
    }

    #[test]
    fn each_operation_names_its_placeholders() {
        let t = Template::from_line("tool -i {host} --gear {gear}").unwrap();
        let e = t
            .check("paas.deactivate", &[District, Host], &[Host])
            .unwrap_err();
        assert_eq!(e.key, "paas.deactivate");
        assert!(e.reason.contains("{gear} has no value"), "{e}");
        let t = Template::from_line("tool -u {district}").unwrap();
        let e = t
            .check("paas.remove_node", &[District, Host], &[Host])
            .unwrap_err();
        assert!(e.reason.contains("must use {host}"), "{e}");
        assert!(
            Template::from_line("tool {host}")
                .unwrap()
                .check("k", &[District, Host], &[Host])
                .is_ok()
        );
    }

    #[test]
    fn rendering_needs_every_value() {
        let t = Template::from_line("tool {gear}").unwrap();
        let e = t.render(&values()).unwrap_err().to_string();
        assert!(e.contains("{gear}"), "{e}");
    }
}
