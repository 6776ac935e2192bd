//! Resources of a stack listing, and finding one node's group member in it.
//!
//! Members of a group live in the group's **nested** stack (named
//! `<stack>-<group>-<12 random>`), not in the stack that declares the
//! group: a ResourceGroup names them `0`, `1`, ... (never reusing a
//! removed index), an AutoScalingGroup by 12 random letters and digits. A
//! member may itself be a provider template holding the server one level
//! deeper. `GET stacks/{top}/resources?nested_depth=2` lists all three
//! levels, each resource with a `stack` link naming the stack it lives in;
//! the group resource's `physical_resource_id` is its nested stack's id,
//! and so is a provider-template member's. [`find_member`] walks those ids
//! (names repeat across levels; ids do not).

use serde::Deserialize;
use serde_json::Value;

use super::StackId;
use crate::error::CloudError;

/// One resource from `GET .../resources`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Resource {
    /// Name within its stack (a group member's name is its index or id).
    pub resource_name: String,
    /// Type (`OS::Nova::Server`, `OS::Heat::AutoScalingGroup`, ...).
    #[serde(default)]
    pub resource_type: String,
    /// The underlying object's id (a Nova server id, a nested stack id, ...).
    #[serde(default)]
    pub physical_resource_id: String,
    /// `CREATE_COMPLETE`, `CHECK_FAILED`, ...
    #[serde(default)]
    pub resource_status: String,
    /// Reason for the status.
    #[serde(default)]
    pub resource_status_reason: Option<String>,
    /// Name of the resource in the parent stack that owns this resource's
    /// stack (set for resources of nested stacks).
    #[serde(default)]
    pub parent_resource: Option<String>,
    /// When Heat created it (`2026-11-25T13:01:12Z`); orders members
    /// oldest first, as Heat does when it picks whom to remove.
    #[serde(default)]
    pub creation_time: Option<String>,
    /// `self`, `stack` and (for nested stacks) `nested` links.
    #[serde(default)]
    pub links: Vec<Link>,
    /// Attribute values, with `with_detail=true`.
    #[serde(default)]
    pub attributes: Option<Value>,
}

/// A link in a Heat answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Link {
    /// URL.
    pub href: String,
    /// `self`, `stack`, `nested`, ...
    pub rel: String,
}

fn stack_of_link(href: &str) -> Option<StackId> {
    let path = url::Url::parse(href).ok()?.path().to_string();
    let mut parts = path.trim_end_matches('/').rsplit('/');
    let id = parts.next()?;
    let name = parts.next()?;
    let stacks = parts.next()?;
    (stacks == "stacks").then(|| StackId {
        name: percent_encoding::percent_decode_str(name)
            .decode_utf8_lossy()
            .into_owned(),
        id: id.to_string(),
    })
}

impl Resource {
    /// The stack this resource belongs to, from its `stack` link
    /// (`.../stacks/{name}/{id}`).
    pub fn owning_stack(&self) -> Option<StackId> {
        stack_of_link(&self.links.iter().find(|l| l.rel == "stack")?.href)
    }

    /// The nested stack this resource owns (a group, a provider template),
    /// from its `nested` link.
    pub fn nested_stack(&self) -> Option<StackId> {
        stack_of_link(&self.links.iter().find(|l| l.rel == "nested")?.href)
    }

    /// `CHECK_FAILED`, `CREATE_FAILED`, ...: Heat counts such a member out
    /// of the group's size and removes it first.
    pub fn is_failed(&self) -> bool {
        self.resource_status.ends_with("_FAILED")
    }

    fn in_stack(&self, id: &str) -> bool {
        self.owning_stack().is_some_and(|s| s.id == id)
    }
}

/// The group types whose members gearshift scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// `OS::Heat::ResourceGroup`: sized by `count`, exact removal by
    /// `removal_policies`.
    ResourceGroup,
    /// `OS::Heat::AutoScalingGroup` (or the CFN
    /// `AWS::AutoScaling::AutoScalingGroup`): sized by scaling policies.
    AutoScalingGroup,
}

impl GroupKind {
    /// The kind of a resource type, if it is a group.
    pub fn of_type(resource_type: &str) -> Option<Self> {
        match resource_type {
            "OS::Heat::ResourceGroup" => Some(GroupKind::ResourceGroup),
            "OS::Heat::AutoScalingGroup" | "AWS::AutoScaling::AutoScalingGroup" => {
                Some(GroupKind::AutoScalingGroup)
            }
            _ => None,
        }
    }
}

/// What identifies a node's member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKey<'a> {
    /// The physical id of the member or of a resource inside it (a Nova
    /// server's UUID, from the metadata service or the broker's records).
    PhysicalId(&'a str),
    /// The member's resource name in the group's nested stack.
    Name(&'a str),
}

impl std::fmt::Display for MemberKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberKey::PhysicalId(id) => write!(f, "physical id {id}"),
            MemberKey::Name(n) => write!(f, "member name {n}"),
        }
    }
}

/// A member found in a listing, with the stacks needed to act on it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRef {
    /// The group resource's name (`group`, `asg`).
    pub group: String,
    /// The group's type.
    pub kind: GroupKind,
    /// The stack that declares the group (the one to PATCH).
    pub group_stack: StackId,
    /// The group's nested stack, where the member lives (mark it there).
    pub nested: StackId,
    /// The member resource.
    pub member: Resource,
}

/// The groups of a listing: (group resource, its nested stack id).
fn groups<'r>(resources: &'r [Resource], only: Option<&str>) -> Vec<&'r Resource> {
    resources
        .iter()
        .filter(|r| GroupKind::of_type(&r.resource_type).is_some())
        .filter(|r| !r.physical_resource_id.is_empty())
        .filter(|r| only.is_none_or(|g| r.resource_name == g))
        .collect()
}

/// Heat's order of members (`grouputils`): by creation time, then by name
/// (creation times have whole seconds, so members created together tie;
/// ResourceGroup indexes compare as numbers).
pub fn oldest_first(a: &Resource, b: &Resource) -> std::cmp::Ordering {
    let index = |r: &Resource| r.resource_name.parse::<u64>().ok();
    a.creation_time
        .cmp(&b.creation_time)
        .then_with(|| match (index(a), index(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => a.resource_name.cmp(&b.resource_name),
        })
}

/// The members of group `g` in a listing, oldest first.
pub fn group_members<'r>(resources: &'r [Resource], g: &Resource) -> Vec<&'r Resource> {
    let mut out: Vec<&Resource> = resources
        .iter()
        .filter(|r| r.in_stack(&g.physical_resource_id))
        .collect();
    out.sort_by(|a, b| oldest_first(a, b));
    out
}

/// Finds the group member that `key` names in a `nested_depth=2` listing of
/// the stack declaring the group (`group`: only that group resource).
/// Errors are [`CloudError::Config`]: nothing matches, or several do.
pub fn find_member(
    resources: &[Resource],
    key: MemberKey<'_>,
    group: Option<&str>,
) -> Result<MemberRef, CloudError> {
    let gs = groups(resources, group);
    if gs.is_empty() {
        return Err(CloudError::Config(match group {
            Some(g) => format!("no ResourceGroup or AutoScalingGroup named {g:?} in the stack"),
            None => "the stack has no ResourceGroup or AutoScalingGroup".into(),
        }));
    }
    let mut found = Vec::new();
    for g in &gs {
        for m in group_members(resources, g) {
            let hit = match key {
                MemberKey::Name(n) => m.resource_name == n,
                MemberKey::PhysicalId(id) => {
                    m.physical_resource_id == id
                        || (!m.physical_resource_id.is_empty()
                            && resources.iter().any(|r| {
                                r.physical_resource_id == id && r.in_stack(&m.physical_resource_id)
                            }))
                }
            };
            if hit {
                found.push((*g, m));
            }
        }
    }
    match found.as_slice() {
        [(g, m)] => Ok(MemberRef {
            group: g.resource_name.clone(),
            kind: GroupKind::of_type(&g.resource_type).unwrap_or(GroupKind::AutoScalingGroup),
            group_stack: g.owning_stack().ok_or_else(|| {
                CloudError::Config(format!("group {} has no stack link", g.resource_name))
            })?,
            nested: m.owning_stack().ok_or_else(|| {
                CloudError::Config(format!("member {} has no stack link", m.resource_name))
            })?,
            member: (*m).clone(),
        }),
        [] => Err(CloudError::Config(format!(
            "no member of {} has {key}",
            gs.iter()
                .map(|g| g.resource_name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        _ => Err(CloudError::Config(format!(
            "{} group members match {key}; name the group resource",
            found.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const H: &str = "http://h:8004/v1/t/stacks";

    fn res(name: &str, ty: &str, phys: &str, stack: &str, nested: Option<&str>) -> Resource {
        let mut links = vec![json!({"href": format!("{H}/{stack}"), "rel": "stack"})];
        if let Some(n) = nested {
            links.push(json!({"href": format!("{H}/{n}"), "rel": "nested"}));
        }
        serde_json::from_value(json!({
            "resource_name": name, "resource_type": ty, "physical_resource_id": phys,
            "resource_status": "CREATE_COMPLETE", "links": links,
            "creation_time": format!("2026-11-25T13:00:0{}Z", name.len()),
        }))
        .unwrap()
    }

    /// A top stack with a ResourceGroup of provider-template members (each
    /// holding a server named `server`, like scenario `member_template`)
    /// and an AutoScalingGroup of plain members.
    fn listing() -> Vec<Resource> {
        vec![
            res(
                "group",
                "OS::Heat::ResourceGroup",
                "g1",
                "top/t1",
                Some("top-group-x/g1"),
            ),
            res(
                "0",
                "member.yaml",
                "m0",
                "top-group-x/g1",
                Some("top-group-x-0/m0"),
            ),
            res(
                "1",
                "member.yaml",
                "m1",
                "top-group-x/g1",
                Some("top-group-x-1/m1"),
            ),
            res(
                "server",
                "OS::Nova::Server",
                "uuid-0",
                "top-group-x-0/m0",
                None,
            ),
            res(
                "server",
                "OS::Nova::Server",
                "uuid-1",
                "top-group-x-1/m1",
                None,
            ),
            res(
                "asg",
                "OS::Heat::AutoScalingGroup",
                "a1",
                "top/t1",
                Some("top-asg-y/a1"),
            ),
            res(
                "abcdefghijkl",
                "OS::Nova::Server",
                "uuid-a",
                "top-asg-y/a1",
                None,
            ),
            res("scale_up", "OS::Heat::ScalingPolicy", "p1", "top/t1", None),
        ]
    }

    #[test]
    fn finds_members_by_server_id_through_provider_templates() {
        let l = listing();
        let m = find_member(&l, MemberKey::PhysicalId("uuid-1"), None).unwrap();
        assert_eq!(m.member.resource_name, "1");
        assert_eq!(
            (m.group.as_str(), m.kind),
            ("group", GroupKind::ResourceGroup)
        );
        assert_eq!(m.nested.to_string(), "top-group-x/g1");
        assert_eq!(m.group_stack.to_string(), "top/t1");
        let a = find_member(&l, MemberKey::PhysicalId("uuid-a"), None).unwrap();
        assert_eq!(
            (a.member.resource_name.as_str(), a.kind),
            ("abcdefghijkl", GroupKind::AutoScalingGroup)
        );
        assert_eq!(a.nested.to_string(), "top-asg-y/a1");
    }

    #[test]
    fn names_are_ambiguous_across_groups_without_the_group() {
        let l = listing();
        assert!(find_member(&l, MemberKey::Name("0"), Some("group")).is_ok());
        assert!(
            find_member(&l, MemberKey::Name("server"), None).is_err(),
            "not a member"
        );
        let e = find_member(&l, MemberKey::PhysicalId("nope"), None).unwrap_err();
        assert!(e.to_string().contains("no member of group, asg"), "{e}");
        assert!(find_member(&l, MemberKey::PhysicalId("uuid-a"), Some("group")).is_err());
        assert!(find_member(&l[7..], MemberKey::Name("0"), None).is_err());
    }

    #[test]
    fn members_are_ordered_oldest_first() {
        let l = listing();
        let g = &l[0];
        let names: Vec<&str> = group_members(&l, g)
            .iter()
            .map(|r| r.resource_name.as_str())
            .collect();
        assert_eq!(names, vec!["0", "1"]);
        assert_eq!(g.nested_stack().unwrap().to_string(), "top-group-x/g1");
    }
}
