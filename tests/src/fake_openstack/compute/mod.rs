//! The fake Nova (`/compute/v2.1`), Cinder (`/volume/v3/{project}`),
//! Glance (`/image/v2/images`) and Neutron (`/network/v2.0/networks`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Answer, FakeOpenStack, PROJECT_ID, State, USER_ID};

mod cinder;
mod nova;
pub(crate) use cinder::{cinder, glance, neutron};
pub(crate) use nova::nova;

/// A Nova flavor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flavor {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// vCPUs.
    pub vcpus: u64,
    /// RAM in MiB.
    pub ram: u64,
    /// Root disk in GiB.
    pub disk: u64,
}

/// Nova's absolute limits (quota) for the project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `maxTotalInstances`.
    pub instances: u64,
    /// `maxTotalCores`.
    pub cores: u64,
    /// `maxTotalRAMSize` (MiB).
    pub ram: u64,
    /// Cinder volumes.
    pub volumes: u64,
    /// Cinder gigabytes.
    pub gigabytes: u64,
}

/// A server in the fake Nova.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeServer {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// `BUILD`, `ACTIVE`, `ERROR`.
    pub status: String,
    /// Flavor id.
    pub flavor: String,
    /// Image id.
    pub image: String,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// User data, decoded from base64.
    pub user_data: Option<String>,
    /// Key pair.
    pub key_name: Option<String>,
    /// Network ids.
    pub networks: Vec<String>,
    /// Security group names.
    pub security_groups: Vec<String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Attached volume ids.
    pub volumes: Vec<String>,
    /// The `POST /servers` body as sent (`None` for servers made by Heat).
    pub create_body: Option<Value>,
    polls_left: u32,
    fault: Option<String>,
}

/// A volume in the fake Cinder.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeVolume {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Size in GiB.
    pub size: u64,
    /// `creating`, `available`, `in-use`, `error`.
    pub status: String,
    /// Volume type.
    pub volume_type: Option<String>,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// The server it is attached to.
    pub attached_to: Option<String>,
    polls_left: u32,
}

pub(crate) struct ComputeState {
    flavors: Vec<Flavor>,
    images: BTreeMap<String, String>,
    networks: BTreeMap<String, String>,
    pub(crate) limits: Limits,
    pub(crate) servers: Vec<FakeServer>,
    volumes: Vec<FakeVolume>,
    build_polls: u32,
    volume_polls: u32,
    fail_next_boot: Option<String>,
}

/// The default image's name.
pub const IMAGE_NAME: &str = "openshift-node-image";
/// The default image's id.
pub const IMAGE_ID: &str = "70a599e0-31e7-49b7-b260-868f441e862b";
/// The default network's name.
pub const NETWORK_NAME: &str = "paas-net";
/// The default network's id.
pub const NETWORK_ID: &str = "3cb9bc59-5699-4588-a4b1-b87f96708bc6";

impl ComputeState {
    pub(crate) fn new() -> Self {
        let f = |id: &str, name: &str, vcpus, ram, disk| Flavor {
            id: id.into(),
            name: name.into(),
            vcpus,
            ram,
            disk,
        };
        ComputeState {
            flavors: vec![
                f("2", "m1.small", 1, 2048, 20),
                f("3", "m1.medium", 2, 4096, 40),
                f("4", "m1.large", 4, 8192, 80),
            ],
            images: [(IMAGE_NAME.to_string(), IMAGE_ID.to_string())]
                .into_iter()
                .collect(),
            networks: [(NETWORK_NAME.to_string(), NETWORK_ID.to_string())]
                .into_iter()
                .collect(),
            limits: Limits {
                instances: 10,
                cores: 20,
                ram: 51200,
                volumes: 10,
                gigabytes: 1000,
            },
            servers: Vec::new(),
            volumes: Vec::new(),
            build_polls: 1,
            volume_polls: 1,
            fail_next_boot: None,
        }
    }

    fn used(&self) -> (u64, u64, u64) {
        let mut cores = 0;
        let mut ram = 0;
        for s in &self.servers {
            if let Some(f) = self.flavors.iter().find(|f| f.id == s.flavor) {
                cores += f.vcpus;
                ram += f.ram;
            }
        }
        (self.servers.len() as u64, cores, ram)
    }
}

/// Creates an ACTIVE server (a Heat group member); returns its id.
pub(crate) fn spawn_server(s: &mut State, name: &str) -> String {
    let id = s.next_id("5e7c");
    s.nova.servers.push(FakeServer {
        id: id.clone(),
        name: name.into(),
        status: "ACTIVE".into(),
        flavor: "2".into(),
        image: IMAGE_ID.into(),
        availability_zone: Some("nova".into()),
        user_data: None,
        key_name: None,
        networks: vec![NETWORK_ID.into()],
        security_groups: vec!["default".into()],
        metadata: BTreeMap::new(),
        volumes: Vec::new(),
        create_body: None,
        polls_left: 0,
        fault: None,
    });
    id
}

/// Removes a server, detaching its volumes.
pub(crate) fn drop_server(s: &mut State, id: &str) {
    s.nova.servers.retain(|sv| sv.id != id);
    for v in s.nova.volumes.iter_mut() {
        if v.attached_to.as_deref() == Some(id) {
            v.attached_to = None;
            v.status = "available".into();
        }
    }
}

impl FakeOpenStack {
    /// Adds (or replaces) a flavor.
    pub fn add_flavor(&self, flavor: Flavor) {
        let mut s = self.lock();
        s.nova.flavors.retain(|f| f.id != flavor.id);
        s.nova.flavors.push(flavor);
    }

    /// Adds an image; returns its id.
    pub fn add_image(&self, name: &str) -> String {
        let mut s = self.lock();
        let id = s.next_id("1a6e");
        s.nova.images.insert(name.into(), id.clone());
        id
    }

    /// Adds a network; returns its id.
    pub fn add_network(&self, name: &str) -> String {
        let mut s = self.lock();
        let id = s.next_id("2b7f");
        s.nova.networks.insert(name.into(), id.clone());
        id
    }

    /// Sets the project's quota (Nova limits and Cinder quota).
    pub fn set_limits(&self, limits: Limits) {
        self.lock().nova.limits = limits;
    }

    /// The project's quota.
    pub fn limits(&self) -> Limits {
        self.lock().nova.limits
    }

    /// GETs of a new server that still see `BUILD` (default 1).
    pub fn set_build_polls(&self, n: u32) {
        self.lock().nova.build_polls = n;
    }

    /// GETs of a new volume that still see `creating` (default 1).
    pub fn set_volume_polls(&self, n: u32) {
        self.lock().nova.volume_polls = n;
    }

    /// The next server to boot ends in `ERROR` with this fault message.
    pub fn fail_next_boot(&self, fault: &str) {
        self.lock().nova.fail_next_boot = Some(fault.into());
    }

    /// Servers in the fake Nova, in creation order.
    pub fn servers(&self) -> Vec<FakeServer> {
        self.lock().nova.servers.clone()
    }

    /// Volumes in the fake Cinder, in creation order.
    pub fn volumes(&self) -> Vec<FakeVolume> {
        self.lock().nova.volumes.clone()
    }

    /// Adds an ACTIVE server as if created earlier by someone; returns its id.
    pub fn add_server(&self, name: &str, metadata: &[(&str, &str)]) -> String {
        let mut s = self.lock();
        let id = spawn_server(&mut s, name);
        let sv = s
            .nova
            .servers
            .iter_mut()
            .find(|sv| sv.id == id)
            .expect("server");
        sv.metadata = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        id
    }
}

fn nova_err(status: u16, name: &str, message: &str) -> Answer {
    Answer::json(
        status,
        json!({ name: {"code": status, "message": message} }),
    )
}

fn server_detail(sv: &FakeServer, base: &str) -> Value {
    let mut v = json!({
        "id": sv.id,
        "name": sv.name,
        "status": sv.status,
        "tenant_id": PROJECT_ID,
        "user_id": USER_ID,
        "metadata": sv.metadata,
        "hostId": "92154fab69d5883ba2c8622b7e65f745dd33257221c07af363c51b29",
        "image": {"id": sv.image, "links": [{"href": format!("{base}/images/{}", sv.image), "rel": "bookmark"}]},
        "flavor": {"id": sv.flavor, "links": [{"href": format!("{base}/flavors/{}", sv.flavor), "rel": "bookmark"}]},
        "created": "2024-05-01T10:00:00Z",
        "updated": "2024-05-01T10:00:05Z",
        "addresses": {},
        "accessIPv4": "",
        "accessIPv6": "",
        "links": [{"href": format!("{base}/compute/v2.1/servers/{}", sv.id), "rel": "self"}],
        "OS-DCF:diskConfig": "MANUAL",
        "OS-EXT-AZ:availability_zone": sv.availability_zone.clone().unwrap_or_else(|| "nova".into()),
        "config_drive": "",
        "key_name": sv.key_name,
        "OS-EXT-STS:task_state": if sv.status == "BUILD" { json!("spawning") } else { Value::Null },
        "OS-EXT-STS:vm_state": match sv.status.as_str() { "BUILD" => "building", "ERROR" => "error", _ => "active" },
        "OS-EXT-STS:power_state": if sv.status == "ACTIVE" { 1 } else { 0 },
        "os-extended-volumes:volumes_attached": sv.volumes.iter().map(|v| json!({"id": v})).collect::<Vec<_>>(),
        "security_groups": sv.security_groups.iter().map(|g| json!({"name": g})).collect::<Vec<_>>(),
        "progress": 0,
    });
    if let Some(f) = &sv.fault {
        v["fault"] = json!({"code": 500, "created": "2024-05-01T10:00:05Z", "message": f});
    }
    v
}

fn flavor_json(f: &Flavor, base: &str) -> Value {
    json!({
        "id": f.id, "name": f.name, "vcpus": f.vcpus, "ram": f.ram, "disk": f.disk,
        "OS-FLV-EXT-DATA:ephemeral": 0, "OS-FLV-DISABLED:disabled": false, "swap": "",
        "rxtx_factor": 1.0, "os-flavor-access:is_public": true,
        "links": [{"href": format!("{base}/compute/v2.1/flavors/{}", f.id), "rel": "self"}],
    })
}

fn advance_server(s: &mut State, i: usize) {
    let sv = &mut s.nova.servers[i];
    if sv.status != "BUILD" {
        return;
    }
    if sv.polls_left > 0 {
        sv.polls_left -= 1;
        return;
    }
    sv.status = if sv.fault.is_some() {
        "ERROR"
    } else {
        "ACTIVE"
    }
    .into();
}

/// Python's `re.search` for the simple patterns clients send: `^`, `$`,
/// escaped characters, literal text.
fn name_matches(pattern: &str, name: &str) -> bool {
    let anchored_start = pattern.starts_with('^');
    let anchored_end = pattern.ends_with('$') && !pattern.ends_with("\\$");
    let core = pattern.trim_start_matches('^');
    let core = if anchored_end {
        &core[..core.len() - 1]
    } else {
        core
    };
    let mut lit = String::new();
    let mut chars = core.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                lit.push(n);
            }
        } else {
            lit.push(c);
        }
    }
    match (anchored_start, anchored_end) {
        (true, true) => name == lit,
        (true, false) => name.starts_with(&lit),
        (false, true) => name.ends_with(&lit),
        (false, false) => name.contains(&lit),
    }
}
