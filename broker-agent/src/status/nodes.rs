//! The status document's node list: one slice per group, each shared (not
//! copied) between the documents built while its group did not change, so
//! that a document of 100,000 nodes costs the groups that changed, not
//! 100,000 copies. On the wire it is one flat JSON array.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::NodeStatus;

/// Every node of a status document, group by group.
#[derive(Debug, Clone, Default)]
pub struct NodeList {
    parts: Vec<Arc<[NodeStatus]>>,
    len: usize,
}

impl NodeList {
    /// Appends one group's nodes (shared, not copied).
    pub(crate) fn push_part(&mut self, part: Arc<[NodeStatus]>) {
        self.len += part.len();
        if !part.is_empty() {
            self.parts.push(part);
        }
    }

    /// Every node, in order.
    pub fn iter(&self) -> impl Iterator<Item = &NodeStatus> + '_ {
        self.parts.iter().flat_map(|p| p.iter())
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no node.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl From<Vec<NodeStatus>> for NodeList {
    fn from(v: Vec<NodeStatus>) -> Self {
        let mut l = NodeList::default();
        l.push_part(v.into());
        l
    }
}

impl<'a> IntoIterator for &'a NodeList {
    type Item = &'a NodeStatus;
    type IntoIter = Box<dyn Iterator<Item = &'a NodeStatus> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// The same nodes in the same order, however they are split in groups.
impl PartialEq for NodeList {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Serialize for NodeList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for NodeList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<NodeStatus>::deserialize(d).map(NodeList::from)
    }
}
