//! What a stack's template (`GET stacks/{name}/{id}/template`, HOT or
//! CFN, as Heat stores it) and its current parameters say about a group
//! and its scaling policies: the sizes Heat will enforce and the stack
//! parameters that feed them. Pure functions of (template, parameters).
//!
//! Why gearshift reads it (measured on Heat 27, `docs/openstack-conformance.md`):
//! - every stack update resizes an AutoScalingGroup to its
//!   `desired_capacity` when the template sets one (else to its healthy
//!   members), so removing a marked member needs that property's parameter;
//! - a signal at `max_size` / `min_size` is answered 200 and ignored;
//! - a ResourceGroup's exact removal needs `count` and `removal_policies`
//!   to come from parameters.

use std::collections::BTreeMap;

use serde_json::Value;

use super::members::GroupKind;
use crate::error::CloudError;

/// Where a size (or list) property of the template comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Size {
    /// Not set in the template.
    Absent,
    /// A number written in the template.
    Literal(i64),
    /// A stack parameter (`{get_param: x}`, CFN `{Ref: x}`), with its
    /// current value when it is a number.
    Param {
        /// The parameter's name.
        name: String,
        /// Its current value, if numeric.
        value: Option<i64>,
    },
    /// Some other intrinsic function: gearshift cannot tell.
    Unknown,
}

impl Size {
    /// The number, when known.
    pub fn value(&self) -> Option<i64> {
        match self {
            Size::Literal(n) => Some(*n),
            Size::Param { value, .. } => *value,
            _ => None,
        }
    }

    /// The parameter's name, when it comes from one.
    pub fn param(&self) -> Option<&str> {
        match self {
            Size::Param { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A group's sizing, from the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// Which group type.
    pub kind: GroupKind,
    /// AutoScalingGroup `min_size` (CFN `MinSize`).
    pub min_size: Size,
    /// AutoScalingGroup `max_size` (CFN `MaxSize`).
    pub max_size: Size,
    /// AutoScalingGroup `desired_capacity` (CFN `DesiredCapacity`).
    pub desired: Size,
    /// ResourceGroup `count` (default 1 when absent).
    pub count: Size,
    /// ResourceGroup `removal_policies`.
    pub removal_policies: Size,
}

/// A scaling policy, from the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// The group it scales (`auto_scaling_group_id: {get_resource: g}`,
    /// CFN `AutoScalingGroupName: {Ref: g}`), when the template says so.
    pub group: Option<String>,
    /// `scaling_adjustment` (CFN `ScalingAdjustment`).
    pub adjustment: Size,
    /// `change_in_capacity`, `exact_capacity`, `percent_change_in_capacity`
    /// (CFN `ChangeInCapacity`, ...), lower-cased without underscores.
    pub adjustment_type: String,
    /// `cooldown` in seconds (CFN `Cooldown`).
    pub cooldown: Size,
}

impl PolicySpec {
    /// +1 when the policy grows the group, -1 when it shrinks it, 0 when
    /// that depends on the current size (exact capacity) or is unknown.
    pub fn direction(&self) -> i64 {
        if self.adjustment_type.contains("exact") {
            return 0;
        }
        self.adjustment.value().map(i64::signum).unwrap_or(0)
    }
}

/// A template with the stack's current parameter values.
#[derive(Debug, Clone, Copy)]
pub struct Template<'a> {
    template: &'a Value,
    params: &'a BTreeMap<String, Value>,
}

fn key<'v>(obj: &'v Value, hot: &str, cfn: &str) -> Option<&'v Value> {
    obj.get(hot).or_else(|| obj.get(cfn))
}

fn number(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

impl<'a> Template<'a> {
    /// `template` as `GET .../template` returns it; `params` the stack's
    /// `parameters` (all strings in Heat's answer).
    pub fn new(template: &'a Value, params: &'a BTreeMap<String, Value>) -> Self {
        Template { template, params }
    }

    fn resource(&self, name: &str) -> Result<(&'a str, &'a Value), CloudError> {
        let r = key(self.template, "resources", "Resources")
            .and_then(|rs| rs.get(name))
            .ok_or_else(|| CloudError::Config(format!("the template has no resource {name:?}")))?;
        let ty = key(r, "type", "Type").and_then(Value::as_str).unwrap_or("");
        Ok((
            ty,
            key(r, "properties", "Properties").unwrap_or(&Value::Null),
        ))
    }

    fn size(&self, props: &Value, hot: &str, cfn: &str) -> Size {
        let Some(v) = key(props, hot, cfn) else {
            return Size::Absent;
        };
        if let Some(n) = number(v) {
            return Size::Literal(n);
        }
        let param = v
            .get("get_param")
            .or_else(|| v.get("Ref"))
            .and_then(|p| p.as_str().or_else(|| p.get(0).and_then(Value::as_str)));
        match param {
            Some(name) => Size::Param {
                name: name.to_string(),
                value: self.params.get(name).and_then(number),
            },
            None => Size::Unknown,
        }
    }

    /// The sizing of group resource `name`.
    pub fn group(&self, name: &str) -> Result<GroupSpec, CloudError> {
        let (ty, p) = self.resource(name)?;
        let kind = GroupKind::of_type(ty).ok_or_else(|| {
            CloudError::Config(format!(
                "resource {name:?} is a {ty}, not a ResourceGroup or AutoScalingGroup"
            ))
        })?;
        let count = match self.size(p, "count", "Count") {
            Size::Absent if kind == GroupKind::ResourceGroup => Size::Literal(1),
            other => other,
        };
        let removal_policies = match key(p, "removal_policies", "RemovalPolicies") {
            Some(v) if v.is_array() => Size::Unknown,
            _ => self.size(p, "removal_policies", "RemovalPolicies"),
        };
        Ok(GroupSpec {
            kind,
            min_size: self.size(p, "min_size", "MinSize"),
            max_size: self.size(p, "max_size", "MaxSize"),
            desired: self.size(p, "desired_capacity", "DesiredCapacity"),
            count,
            removal_policies,
        })
    }

    /// The group a scaling policy resource scales; `None` when `name` is
    /// not a scaling policy or names its group otherwise.
    pub fn policy_group(&self, name: &str) -> Option<String> {
        let (ty, _) = self.resource(name).ok()?;
        if !matches!(
            ty,
            "OS::Heat::ScalingPolicy" | "AWS::AutoScaling::ScalingPolicy"
        ) {
            return None;
        }
        self.policy(name).ok()?.group
    }

    /// The scaling policy resource `name`.
    pub fn policy(&self, name: &str) -> Result<PolicySpec, CloudError> {
        let (_, p) = self.resource(name)?;
        let group = key(p, "auto_scaling_group_id", "AutoScalingGroupName")
            .and_then(|g| g.get("get_resource").or_else(|| g.get("Ref")))
            .and_then(Value::as_str)
            .map(str::to_string);
        let adjustment_type = key(p, "adjustment_type", "AdjustmentType")
            .and_then(Value::as_str)
            .unwrap_or("change_in_capacity")
            .to_ascii_lowercase()
            .replace('_', "");
        Ok(PolicySpec {
            group,
            adjustment: self.size(p, "scaling_adjustment", "ScalingAdjustment"),
            adjustment_type,
            cooldown: self.size(p, "cooldown", "Cooldown"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params() -> BTreeMap<String, Value> {
        [("count", "3"), ("asg_max", "4"), ("desired", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect()
    }

    #[test]
    fn hot_groups_and_policies() {
        // As heat-api 27 returns the probes' template (docs/openstack-transcripts).
        let t = json!({"heat_template_version": "2018-08-31", "resources": {
            "group": {"type": "OS::Heat::ResourceGroup", "properties": {
                "count": {"get_param": "count"}, "removal_policies": {"get_param": "removal_policies"}}},
            "asg": {"type": "OS::Heat::AutoScalingGroup", "properties": {
                "min_size": 1, "max_size": {"get_param": "asg_max"}, "desired_capacity": {"get_param": "desired"}}},
            "plain": {"type": "OS::Heat::ResourceGroup", "properties": {"removal_policies": [{"resource_list": ["0"]}]}},
            "scale_down": {"type": "OS::Heat::ScalingPolicy", "properties": {
                "adjustment_type": "change_in_capacity", "auto_scaling_group_id": {"get_resource": "asg"},
                "scaling_adjustment": -1, "cooldown": 0}}}});
        let p = params();
        let tpl = Template::new(&t, &p);
        let g = tpl.group("group").unwrap();
        assert_eq!(
            (g.kind, g.count.value(), g.count.param()),
            (GroupKind::ResourceGroup, Some(3), Some("count"))
        );
        assert_eq!(g.removal_policies.param(), Some("removal_policies"));
        let a = tpl.group("asg").unwrap();
        assert_eq!(
            (a.min_size.value(), a.max_size.value(), a.desired.param()),
            (Some(1), Some(4), Some("desired"))
        );
        let plain = tpl.group("plain").unwrap();
        assert_eq!(
            (plain.count.clone(), plain.removal_policies.clone()),
            (Size::Literal(1), Size::Unknown)
        );
        let pol = tpl.policy("scale_down").unwrap();
        assert_eq!(
            (pol.group.as_deref(), pol.direction(), pol.cooldown.value()),
            (Some("asg"), -1, Some(0))
        );
        assert!(tpl.group("scale_down").is_err());
        assert_eq!(tpl.policy_group("scale_down").as_deref(), Some("asg"));
        assert_eq!(tpl.policy_group("group"), None);
        assert!(tpl.group("nope").is_err());
    }

    #[test]
    fn cfn_groups_and_policies() {
        let t = json!({"AWSTemplateFormatVersion": "2010-09-09", "Resources": {
            "Nodes": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {"MinSize": "1", "MaxSize": {"Ref": "asg_max"}}},
            "NodeScaleUp": {"Type": "AWS::AutoScaling::ScalingPolicy", "Properties": {
                "AdjustmentType": "ChangeInCapacity", "AutoScalingGroupName": {"Ref": "Nodes"},
                "ScalingAdjustment": "1", "Cooldown": "60"}}}});
        let p = params();
        let tpl = Template::new(&t, &p);
        let g = tpl.group("Nodes").unwrap();
        assert_eq!(
            (
                g.kind,
                g.min_size.value(),
                g.max_size.value(),
                g.desired.clone()
            ),
            (GroupKind::AutoScalingGroup, Some(1), Some(4), Size::Absent)
        );
        let pol = tpl.policy("NodeScaleUp").unwrap();
        assert_eq!(
            (
                pol.group.as_deref(),
                pol.direction(),
                pol.adjustment_type.as_str()
            ),
            (Some("Nodes"), 1, "changeincapacity")
        );
    }
}
