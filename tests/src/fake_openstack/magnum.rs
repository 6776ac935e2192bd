//! The fake Magnum (`/magnum/v1`): clusters with node groups, resize.

use axum::http::Method;
use serde_json::{Value, json};

use super::{Answer, FakeOpenStack, Req, State, violation};

/// A node group to create in a [`FakeCluster`].
#[derive(Debug, Clone)]
pub struct FakeNodegroup {
    /// Name (`default-worker`, ...).
    pub name: String,
    /// `worker` or `master`.
    pub role: String,
    /// Nodes at creation (servers named `<cluster>-<name>-<index>`).
    pub node_count: u32,
    /// `min_node_count`.
    pub min_node_count: u32,
    /// `max_node_count` (none: unlimited).
    pub max_node_count: Option<u32>,
}

/// A cluster to create in the fake.
#[derive(Debug, Clone)]
pub struct FakeCluster {
    /// Name.
    pub name: String,
    /// Node groups; the first worker group is the default one.
    pub nodegroups: Vec<FakeNodegroup>,
}

impl FakeCluster {
    /// A cluster with `default-master` (1) and `default-worker` (`workers`).
    pub fn new(name: &str, workers: u32) -> Self {
        FakeCluster {
            name: name.into(),
            nodegroups: vec![
                FakeNodegroup {
                    name: "default-master".into(),
                    role: "master".into(),
                    node_count: 1,
                    min_node_count: 1,
                    max_node_count: None,
                },
                FakeNodegroup {
                    name: "default-worker".into(),
                    role: "worker".into(),
                    node_count: workers,
                    min_node_count: 1,
                    max_node_count: None,
                },
            ],
        }
    }
}

#[derive(Debug)]
struct NgState {
    uuid: String,
    spec: FakeNodegroup,
    nodes: Vec<(String, String)>, // (server id, server name)
    next_index: u32,
    status: String,
    reason: String,
}

#[derive(Debug)]
struct ClusterState {
    uuid: String,
    name: String,
    status: String,
    reason: String,
    stack_id: String,
    nodegroups: Vec<NgState>,
    polls_left: u32,
    pending: Option<(usize, u32, Vec<String>)>,
}

#[derive(Debug, Default)]
pub(crate) struct MagnumState {
    clusters: Vec<ClusterState>,
    update_polls: u32,
    fail_next: Option<String>,
}

impl FakeOpenStack {
    /// Creates a cluster (`CREATE_COMPLETE`); returns its uuid.
    pub fn add_cluster(&self, spec: FakeCluster) -> String {
        let mut s = self.lock();
        let uuid = s.next_id("c1a5");
        let stack_id = s.next_id("57ac");
        let mut ngs = Vec::new();
        for ng in spec.nodegroups {
            let ng_uuid = s.next_id("b0d3");
            let mut st = NgState {
                uuid: ng_uuid,
                spec: ng.clone(),
                nodes: Vec::new(),
                next_index: 0,
                status: "CREATE_COMPLETE".into(),
                reason: String::new(),
            };
            for _ in 0..ng.node_count {
                add_node(&mut s, &spec.name, &mut st);
            }
            ngs.push(st);
        }
        s.magnum.clusters.push(ClusterState {
            uuid: uuid.clone(),
            name: spec.name,
            status: "CREATE_COMPLETE".into(),
            reason: "Stack CREATE completed successfully".into(),
            stack_id,
            nodegroups: ngs,
            polls_left: 0,
            pending: None,
        });
        uuid
    }

    /// A cluster's `(status, status_reason)`.
    pub fn cluster_status(&self, ident: &str) -> (String, String) {
        let s = self.lock();
        let c = s
            .magnum
            .clusters
            .iter()
            .find(|c| c.uuid == ident || c.name == ident)
            .expect("cluster");
        (c.status.clone(), c.reason.clone())
    }

    /// Forces a cluster's status.
    pub fn set_cluster_status(&self, ident: &str, status: &str, reason: &str) {
        let mut s = self.lock();
        let c = s
            .magnum
            .clusters
            .iter_mut()
            .find(|c| c.uuid == ident || c.name == ident)
            .expect("cluster");
        c.status = status.into();
        c.reason = reason.into();
    }

    /// The `(server id, server name)` nodes of a cluster's node group.
    pub fn nodegroup_nodes(&self, ident: &str, nodegroup: &str) -> Vec<(String, String)> {
        let s = self.lock();
        let c = s
            .magnum
            .clusters
            .iter()
            .find(|c| c.uuid == ident || c.name == ident)
            .expect("cluster");
        let ng = c
            .nodegroups
            .iter()
            .find(|n| n.spec.name == nodegroup || n.uuid == nodegroup)
            .expect("nodegroup");
        ng.nodes.clone()
    }

    /// GETs of a resizing cluster that still see `UPDATE_IN_PROGRESS` (default 0).
    pub fn set_cluster_update_polls(&self, n: u32) {
        self.lock().magnum.update_polls = n;
    }

    /// The next resize ends `UPDATE_FAILED` with `reason`.
    pub fn fail_next_cluster_update(&self, reason: &str) {
        self.lock().magnum.fail_next = Some(reason.into());
    }
}

fn add_node(s: &mut State, cluster: &str, ng: &mut NgState) {
    let name = format!("{cluster}-{}-{}", ng.spec.name, ng.next_index);
    ng.next_index += 1;
    let id = super::compute::spawn_server(s, &name);
    ng.nodes.push((id, name));
}

fn errors(status: u16, title: &str, detail: &str) -> Answer {
    Answer::json(
        status,
        json!({"errors": [{"request_id": "req-4f3d1b3c", "code": if status >= 500 { "server" } else { "client" }, "status": status, "title": title, "detail": detail, "links": []}]}),
    )
}

fn ng_json(c: &ClusterState, ng: &NgState) -> Value {
    json!({
        "uuid": ng.uuid, "name": ng.spec.name, "cluster_id": c.uuid, "project_id": super::PROJECT_ID,
        "docker_volume_size": null, "labels": {}, "flavor_id": "m1.small", "image_id": "fedora-coreos",
        "node_addresses": [], "node_count": ng.nodes.len(), "role": ng.spec.role,
        "max_node_count": ng.spec.max_node_count, "min_node_count": ng.spec.min_node_count,
        "is_default": ng.spec.name.starts_with("default-"), "stack_id": c.stack_id,
        "status": ng.status, "status_reason": ng.reason, "version": null,
        "created_at": "2024-05-01T10:00:00+00:00", "updated_at": null, "links": [],
    })
}

fn cluster_json(c: &ClusterState) -> Value {
    let workers: usize = c
        .nodegroups
        .iter()
        .filter(|n| n.spec.role != "master")
        .map(|n| n.nodes.len())
        .sum();
    let masters: usize = c
        .nodegroups
        .iter()
        .filter(|n| n.spec.role == "master")
        .map(|n| n.nodes.len())
        .sum();
    json!({
        "uuid": c.uuid, "name": c.name, "status": c.status, "status_reason": c.reason,
        "node_count": workers, "master_count": masters, "stack_id": c.stack_id,
        "cluster_template_id": "0562d357-8641-4759-8fed-8173f02c9633", "keypair": "k",
        "create_timeout": 60, "discovery_url": null, "api_address": null, "coe_version": null,
        "container_version": null, "health_status": "HEALTHY", "health_status_reason": {},
        "labels": {}, "node_addresses": [], "master_addresses": [], "project_id": super::PROJECT_ID,
        "created_at": "2024-05-01T10:00:00+00:00", "updated_at": null, "links": [],
    })
}

fn api_version_ok(req: &Req, min_minor: u32) -> bool {
    req.header("openstack-api-version")
        .and_then(|v| v.trim().strip_prefix("container-infra "))
        .map(str::trim)
        .is_some_and(|v| {
            v == "latest"
                || v.strip_prefix("1.")
                    .and_then(|m| m.parse::<u32>().ok())
                    .is_some_and(|m| m >= min_minor)
        })
}

fn advance(s: &mut State, ci: usize) {
    let c = &mut s.magnum.clusters[ci];
    if c.pending.is_none() {
        return;
    }
    if c.polls_left > 0 {
        c.polls_left -= 1;
        return;
    }
    let (ngi, count, remove) = c.pending.take().expect("pending");
    if let Some(reason) = s.magnum.fail_next.take() {
        let c = &mut s.magnum.clusters[ci];
        c.status = "UPDATE_FAILED".into();
        c.reason = reason.clone();
        c.nodegroups[ngi].status = "UPDATE_FAILED".into();
        c.nodegroups[ngi].reason = reason;
        return;
    }
    let cname = s.magnum.clusters[ci].name.clone();
    let mut ng = std::mem::replace(
        &mut s.magnum.clusters[ci].nodegroups[ngi],
        NgState {
            uuid: String::new(),
            spec: FakeNodegroup {
                name: String::new(),
                role: String::new(),
                node_count: 0,
                min_node_count: 0,
                max_node_count: None,
            },
            nodes: Vec::new(),
            next_index: 0,
            status: String::new(),
            reason: String::new(),
        },
    );
    for r in &remove {
        if let Some(i) = ng.nodes.iter().position(|(id, name)| id == r || name == r) {
            let (id, _) = ng.nodes.remove(i);
            super::compute::drop_server(s, &id);
        }
    }
    while ng.nodes.len() > count as usize {
        let (id, _) = ng.nodes.pop().expect("node");
        super::compute::drop_server(s, &id);
    }
    let mut failed = None;
    while ng.nodes.len() < count as usize {
        let l = s.nova.limits;
        if s.nova.servers.len() as u64 >= l.instances {
            failed = Some(format!(
                "Resource CREATE failed: Forbidden: resources.kube_minions.resources[{}].resources.kube-minion: Quota exceeded for instances: Requested 1, but already used {} of {} instances (HTTP 403)",
                ng.next_index,
                s.nova.servers.len(),
                l.instances
            ));
            break;
        }
        add_node(s, &cname, &mut ng);
    }
    ng.status = if failed.is_some() {
        "UPDATE_FAILED"
    } else {
        "UPDATE_COMPLETE"
    }
    .into();
    ng.reason = failed.clone().unwrap_or_default();
    let c = &mut s.magnum.clusters[ci];
    c.nodegroups[ngi] = ng;
    match failed {
        Some(r) => {
            c.status = "UPDATE_FAILED".into();
            c.reason = r;
        }
        None => {
            c.status = "UPDATE_COMPLETE".into();
            c.reason = "Stack UPDATE completed successfully".into();
        }
    }
}

pub(crate) fn route(s: &mut State, req: &mut Req) -> Answer {
    let segs = req.segments("/magnum/v1/");
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (req.method.clone(), segs.as_slice()) {
        (Method::GET, ["clusters", ident]) => {
            let Some(ci) = find_cluster(s, ident) else {
                return no_cluster(ident);
            };
            advance(s, ci);
            Answer::json(200, cluster_json(&s.magnum.clusters[ci]))
        }
        (Method::GET, ["clusters", ident, "nodegroups"]) => nodegroups(s, req, ident, None),
        (Method::GET, ["clusters", ident, "nodegroups", ng]) => nodegroups(s, req, ident, Some(ng)),
        (Method::POST, ["clusters", ident, "actions", "resize"]) => resize(s, req, ident),
        _ => violation(s, req, "no such Magnum API call"),
    }
}

fn find_cluster(s: &State, ident: &str) -> Option<usize> {
    s.magnum
        .clusters
        .iter()
        .position(|c| c.uuid == ident || c.name == ident)
}

fn no_cluster(ident: &str) -> Answer {
    errors(
        404,
        "Not Found",
        &format!("Cluster {ident} could not be found."),
    )
}

fn no_nodegroup(ng: &str) -> Answer {
    errors(
        404,
        "Not Found",
        &format!("Nodegroup {ng} could not be found."),
    )
}

/// `GET /clusters/{ident}/nodegroups[/{ng}]` (API 1.9 or later).
fn nodegroups(s: &mut State, req: &Req, ident: &str, ng: Option<&str>) -> Answer {
    if !api_version_ok(req, 9) {
        return violation(
            s,
            req,
            "node groups need OpenStack-API-Version: container-infra 1.9 or later",
        );
    }
    let Some(ci) = find_cluster(s, ident) else {
        return no_cluster(ident);
    };
    advance(s, ci);
    let c = &s.magnum.clusters[ci];
    let Some(ng) = ng else {
        let list: Vec<Value> = c.nodegroups.iter().map(|n| ng_json(c, n)).collect();
        return Answer::json(200, json!({ "nodegroups": list }));
    };
    match c
        .nodegroups
        .iter()
        .find(|n| n.spec.name == ng || n.uuid == ng)
    {
        Some(n) => Answer::json(200, ng_json(c, n)),
        None => no_nodegroup(ng),
    }
}

/// A resize request's fields: the new count and the servers to remove.
fn resize_fields(s: &mut State, req: &Req) -> Result<(u64, Vec<String>), Answer> {
    let body = req.body.clone().unwrap_or(Value::Null);
    let Some(obj) = body.as_object() else {
        return Err(violation(s, req, "resize needs a JSON object body"));
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !["node_count", "nodes_to_remove", "nodegroup"].contains(&k.as_str()))
    {
        return Err(violation(s, req, format!("unknown resize field {k:?}")));
    }
    let min = if obj.contains_key("nodegroup") { 9 } else { 7 };
    if !api_version_ok(req, min) {
        return Err(violation(
            s,
            req,
            format!("resize needs OpenStack-API-Version: container-infra 1.{min} or later"),
        ));
    }
    let Some(count) = obj.get("node_count").and_then(Value::as_u64) else {
        return Err(violation(
            s,
            req,
            "node_count must be a non-negative integer",
        ));
    };
    let remove: Vec<String> = match obj.get("nodes_to_remove") {
        None => Vec::new(),
        Some(Value::Array(l)) if l.iter().all(Value::is_string) => l
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect(),
        Some(_) => {
            return Err(violation(
                s,
                req,
                "nodes_to_remove must be a list of server ids",
            ));
        }
    };
    Ok((count, remove))
}

/// The node group a resize names, or the default worker group.
fn resize_group(s: &mut State, req: &Req, ci: usize) -> Result<usize, Answer> {
    let body = req.body.clone().unwrap_or(Value::Null);
    let c = &s.magnum.clusters[ci];
    match body.get("nodegroup") {
        Some(Value::String(n)) => c
            .nodegroups
            .iter()
            .position(|g| g.spec.name == *n || g.uuid == *n)
            .ok_or_else(|| no_nodegroup(n)),
        Some(_) => Err(violation(s, req, "nodegroup must be a string")),
        None => c
            .nodegroups
            .iter()
            .position(|g| g.spec.role == "worker")
            .ok_or_else(|| errors(400, "Bad Request", "no default worker node group")),
    }
}

/// `POST /clusters/{ident}/actions/resize`.
fn resize(s: &mut State, req: &Req, ident: &str) -> Answer {
    let (count, remove) = match resize_fields(s, req) {
        Ok(x) => x,
        Err(a) => return a,
    };
    let Some(ci) = find_cluster(s, ident) else {
        return no_cluster(ident);
    };
    let ngi = match resize_group(s, req, ci) {
        Ok(i) => i,
        Err(a) => return a,
    };
    let c = &s.magnum.clusters[ci];
    if c.status.ends_with("_IN_PROGRESS") {
        return errors(
            409,
            "Conflict",
            &format!(
                "Cluster {} is in {} status, can not be resized.",
                c.name, c.status
            ),
        );
    }
    let ng = &c.nodegroups[ngi];
    if ng.spec.role == "master" {
        return errors(
            400,
            "Bad Request",
            "Resizing a master nodegroup is not supported.",
        );
    }
    if (count as u32) < ng.spec.min_node_count
        || ng.spec.max_node_count.is_some_and(|m| count as u32 > m)
    {
        return errors(
            400,
            "Bad Request",
            &format!(
                "Resizing {} outside the allowed range {}..{:?}",
                ng.spec.name, ng.spec.min_node_count, ng.spec.max_node_count
            ),
        );
    }
    if let Some(r) = remove
        .iter()
        .find(|r| !ng.nodes.iter().any(|(id, _)| id == *r))
    {
        let why = format!(
            "nodes_to_remove entry {r:?} is not a server of node group {}",
            ng.spec.name
        );
        return violation(s, req, why);
    }
    let uuid = c.uuid.clone();
    let polls = s.magnum.update_polls;
    let c = &mut s.magnum.clusters[ci];
    c.status = "UPDATE_IN_PROGRESS".into();
    c.reason = String::new();
    c.nodegroups[ngi].status = "UPDATE_IN_PROGRESS".into();
    c.pending = Some((ngi, count as u32, remove));
    c.polls_left = polls;
    Answer::json(202, json!({ "uuid": uuid }))
}
