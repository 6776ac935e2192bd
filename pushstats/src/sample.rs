//! [`Sample`]: one figure to push, and [`Unit`], CloudWatch's units.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::PushError;

/// Longest metric or dimension name (CloudWatch's limit).
pub const MAX_NAME: usize = 255;
/// Longest dimension value (CloudWatch's limit).
pub const MAX_DIMENSION_VALUE: usize = 1024;
/// Most dimensions on one datum (CloudWatch's limit).
pub const MAX_DIMENSIONS: usize = 30;
/// Largest magnitude CloudWatch accepts (it rejects values above about 1.17e108).
pub const MAX_ABS_VALUE: f64 = 1e108;

/// A CloudWatch unit (`StandardUnit`), plus Heat's legacy `Counter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unit(&'static str);

/// Every unit CloudWatch's `StandardUnit` lists, in its spelling.
pub const STANDARD_UNITS: &[&str] = &[
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
];

impl Unit {
    /// `Percent`.
    pub const PERCENT: Unit = Unit("Percent");
    /// `Count`.
    pub const COUNT: Unit = Unit("Count");
    /// `Megabytes`.
    pub const MEGABYTES: Unit = Unit("Megabytes");
    /// `None` (no unit).
    pub const NONE: Unit = Unit("None");
    /// `Counter`: what heat-cfntools' `cfn-push-stats` sent for `Heartbeat`
    /// and `ServiceFailure`. Heat's CloudWatch API stored any unit; AWS
    /// CloudWatch only takes [`STANDARD_UNITS`] (use `Count` there).
    pub const COUNTER: Unit = Unit("Counter");

    /// Parses a unit name, case-insensitively (cfn-push-stats users wrote
    /// `megabytes`); returns the canonical spelling.
    pub fn parse(s: &str) -> Result<Unit, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("Counter") {
            return Ok(Unit::COUNTER);
        }
        STANDARD_UNITS
            .iter()
            .find(|u| u.eq_ignore_ascii_case(t))
            .map(|u| Unit(u))
            .ok_or_else(|| {
                format!(
                    "unknown unit {t:?}: expected one of {} (or Counter)",
                    STANDARD_UNITS.join(", ")
                )
            })
    }

    /// The canonical spelling.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Whether AWS CloudWatch itself accepts this unit.
    pub fn is_standard(self) -> bool {
        self.0 != "Counter"
    }
}

impl Default for Unit {
    fn default() -> Self {
        Unit::NONE
    }
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Unit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Unit::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One figure to push.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The CloudWatch metric name, for example `NodeUtilization`. Gnocchi
    /// gets `<prefix><snake_case name>` (see [`Sample::gnocchi_name`]).
    pub name: String,
    /// The value (finite).
    pub value: f64,
    /// Its unit.
    pub unit: Unit,
    /// CloudWatch dimensions (Gnocchi has none: see `resource`).
    pub dimensions: BTreeMap<String, String>,
    /// The Gnocchi resource it belongs to; `None` means the target's
    /// configured resource (the node's own).
    pub resource: Option<String>,
    /// When it was measured; `None` means "when the batch is formed".
    pub timestamp: Option<DateTime<Utc>>,
}

impl Sample {
    /// A sample without dimensions or timestamp.
    pub fn new(name: impl Into<String>, value: f64, unit: Unit) -> Self {
        Sample {
            name: name.into(),
            value,
            unit,
            dimensions: BTreeMap::new(),
            resource: None,
            timestamp: None,
        }
    }

    /// cfn-push-stats' `--heartbeat`: `Heartbeat` = 1, unit `Counter`.
    pub fn heartbeat(unit: Unit) -> Self {
        Sample::new("Heartbeat", 1.0, unit)
    }

    /// cfn-push-stats' `--service-failure`: `ServiceFailure` = 1, unit `Counter`.
    pub fn service_failure(unit: Unit) -> Self {
        Sample::new("ServiceFailure", 1.0, unit)
    }

    /// Adds a dimension.
    pub fn with_dimension(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.dimensions.insert(name.into(), value.into());
        self
    }

    /// Sets the Gnocchi resource.
    pub fn with_resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    /// The Gnocchi metric name: `prefix` + the name in snake case
    /// (`NodeUtilization` with `gearshift.` gives `gearshift.node_utilization`).
    pub fn gnocchi_name(&self, prefix: &str) -> String {
        format!("{prefix}{}", snake_case(&self.name))
    }

    /// Checks the limits both APIs share.
    pub fn validate(&self) -> Result<(), PushError> {
        let bad = |reason: String| PushError::InvalidSample {
            name: self.name.clone(),
            reason,
        };
        check_name("metric name", &self.name).map_err(bad)?;
        if !self.value.is_finite() || self.value.abs() > MAX_ABS_VALUE {
            return Err(bad(format!(
                "value {} is not a finite number within ±1e108",
                self.value
            )));
        }
        if self.dimensions.len() > MAX_DIMENSIONS {
            return Err(bad(format!(
                "{} dimensions, at most {MAX_DIMENSIONS}",
                self.dimensions.len()
            )));
        }
        for (k, v) in &self.dimensions {
            check_name("dimension name", k).map_err(bad)?;
            check_dimension_value(k, v).map_err(bad)?;
        }
        if let Some(r) = &self.resource {
            check_name("resource id", r).map_err(bad)?;
        }
        Ok(())
    }

    /// The identity of this sample for change detection: everything but
    /// the timestamp.
    pub(crate) fn same_figure(&self, other: &Sample) -> bool {
        self.name == other.name
            && self.unit == other.unit
            && self.dimensions == other.dimensions
            && self.resource == other.resource
            && self.value.to_bits() == other.value.to_bits()
    }
}

/// Checks a metric or dimension name: 1 to 255 printable characters.
pub fn check_name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(format!("{what} {s:?} must have 1 to {MAX_NAME} bytes"));
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{what} {s:?} holds a control character"));
    }
    Ok(())
}

/// Checks a dimension value: 1 to 1024 printable characters.
pub fn check_dimension_value(name: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > MAX_DIMENSION_VALUE {
        return Err(format!(
            "dimension {name} value must have 1 to {MAX_DIMENSION_VALUE} bytes"
        ));
    }
    if v.chars().any(char::is_control) {
        return Err(format!("dimension {name} value holds a control character"));
    }
    Ok(())
}

/// `NodeUtilization` -> `node_utilization`; `ASGName` -> `asg_name`.
pub fn snake_case(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev = i.checked_sub(1).map(|j| chars[j]);
            let next = chars.get(i + 1).copied();
            let boundary = match prev {
                None => false,
                Some(p) if p.is_ascii_lowercase() || p.is_ascii_digit() => true,
                Some(p) if p.is_ascii_uppercase() => next.is_some_and(|n| n.is_ascii_lowercase()),
                Some(_) => false,
            };
            if boundary && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c == '-' || c == ' ' || c == '/' {
            out.push('_');
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether two sample lists carry the same figures (timestamps aside).
pub(crate) fn same_figures(a: &[Sample], b: &[Sample]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_figure(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(Unit::parse("megabytes").unwrap(), Unit::MEGABYTES);
        assert_eq!(
            Unit::parse("count/second").unwrap().as_str(),
            "Count/Second"
        );
        assert_eq!(Unit::parse("Counter").unwrap(), Unit::COUNTER);
        assert!(!Unit::COUNTER.is_standard());
        let e = Unit::parse("furlongs").unwrap_err();
        assert!(e.contains("furlongs") && e.contains("Percent"), "{e}");
        let u: Unit = serde_json::from_str("\"percent\"").unwrap();
        assert_eq!(serde_json::to_string(&u).unwrap(), "\"Percent\"");
    }

    #[test]
    fn snake() {
        assert_eq!(snake_case("NodeUtilization"), "node_utilization");
        assert_eq!(snake_case("Heartbeat"), "heartbeat");
        assert_eq!(snake_case("ASGName"), "asg_name");
        assert_eq!(snake_case("GearsIdle"), "gears_idle");
        assert_eq!(snake_case("Mem2Free"), "mem2_free");
        assert_eq!(
            Sample::new("AvailableActiveGears", 1.0, Unit::COUNT).gnocchi_name("gearshift."),
            "gearshift.available_active_gears"
        );
    }

    #[test]
    fn validation() {
        assert!(Sample::new("A", 1.0, Unit::COUNT).validate().is_ok());
        assert!(Sample::new("A", f64::NAN, Unit::COUNT).validate().is_err());
        assert!(
            Sample::new("A", f64::INFINITY, Unit::COUNT)
                .validate()
                .is_err()
        );
        assert!(Sample::new("A", 2e108, Unit::COUNT).validate().is_err());
        assert!(Sample::new("", 1.0, Unit::COUNT).validate().is_err());
        assert!(
            Sample::new("x".repeat(256), 1.0, Unit::COUNT)
                .validate()
                .is_err()
        );
        assert!(
            Sample::new("A", 1.0, Unit::COUNT)
                .with_dimension("K", "")
                .validate()
                .is_err()
        );
        assert!(
            Sample::new("A", 1.0, Unit::COUNT)
                .with_dimension("K", "a\nb")
                .validate()
                .is_err()
        );
        let mut s = Sample::new("A", 1.0, Unit::COUNT);
        for i in 0..31 {
            s = s.with_dimension(format!("D{i}"), "v");
        }
        assert!(s.validate().is_err());
    }

    #[test]
    fn change_detection_ignores_time() {
        let a = Sample::new("A", 1.0, Unit::COUNT);
        let mut b = a.clone();
        b.timestamp = Some(Utc::now());
        assert!(same_figures(
            std::slice::from_ref(&a),
            std::slice::from_ref(&b)
        ));
        b.value = 2.0;
        assert!(!same_figures(std::slice::from_ref(&a), &[b]));
        assert!(!same_figures(
            std::slice::from_ref(&a),
            &[a.clone(), a.clone()]
        ));
    }
}
