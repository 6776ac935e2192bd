//! The fake Nova (`/compute/v2.1`), Cinder (`/volume/v3/{project}`),
//! Glance (`/image/v2/images`) and Neutron (`/network/v2.0/networks`).

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use serde_json::{Value, json};

use super::{Answer, FakeOpenStack, PROJECT_ID, Req, State, USER_ID, violation};

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

pub(crate) fn nova(s: &mut State, req: &mut Req) -> Answer {
    let segs = req.segments("/compute/v2.1/");
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let base = s.base.clone();
    match (req.method.clone(), segs.as_slice()) {
        (Method::POST, ["servers"]) => create_server(s, req),
        (Method::GET, ["servers", "detail"]) | (Method::GET, ["servers"]) => {
            let detail = segs.len() == 2;
            for (k, _) in req.params() {
                if !["name", "status", "limit", "marker", "all_tenants"].contains(&k.as_str()) {
                    return violation(s, req, format!("unsupported server list filter {k:?}"));
                }
            }
            let name = req.param("name");
            let list: Vec<Value> = s
                .nova
                .servers
                .iter()
                .filter(|sv| name.as_deref().is_none_or(|p| name_matches(p, &sv.name)))
                .map(|sv| {
                    if detail {
                        server_detail(sv, &base)
                    } else {
                        json!({"id": sv.id, "name": sv.name, "links": []})
                    }
                })
                .collect();
            Answer::json(200, json!({ "servers": list }))
        }
        (Method::GET, ["servers", id]) => {
            let Some(i) = s.nova.servers.iter().position(|sv| sv.id == *id) else {
                return nova_err(
                    404,
                    "itemNotFound",
                    &format!("Instance {id} could not be found."),
                );
            };
            advance_server(s, i);
            Answer::json(
                200,
                json!({ "server": server_detail(&s.nova.servers[i], &base) }),
            )
        }
        (Method::DELETE, ["servers", id]) => {
            if !s.nova.servers.iter().any(|sv| sv.id == *id) {
                return nova_err(
                    404,
                    "itemNotFound",
                    &format!("Instance {id} could not be found."),
                );
            }
            let id = id.to_string();
            drop_server(s, &id);
            Answer::empty(204)
        }
        (Method::POST, ["servers", id, "os-volume_attachments"]) => {
            let body = req.body.clone().unwrap_or(Value::Null);
            let att = &body["volumeAttachment"];
            let ok = body.as_object().is_some_and(|o| o.len() == 1)
                && att.as_object().is_some_and(|o| {
                    o.keys().all(|k| {
                        ["volumeId", "device", "tag", "delete_on_termination"].contains(&k.as_str())
                    })
                })
                && att["volumeId"].is_string();
            if !ok {
                return violation(
                    s,
                    req,
                    "body must be {\"volumeAttachment\": {\"volumeId\": id, \"device\"?}}",
                );
            }
            let vol_id = att["volumeId"].as_str().unwrap_or("").to_string();
            let Some(si) = s.nova.servers.iter().position(|sv| sv.id == *id) else {
                return nova_err(
                    404,
                    "itemNotFound",
                    &format!("Instance {id} could not be found."),
                );
            };
            if s.nova.servers[si].status != "ACTIVE" {
                return nova_err(
                    409,
                    "conflictingRequest",
                    &format!(
                        "Cannot 'attach_volume' instance {id} while it is in vm_state building"
                    ),
                );
            }
            let Some(vi) = s.nova.volumes.iter().position(|v| v.id == vol_id) else {
                return nova_err(
                    404,
                    "itemNotFound",
                    &format!("Volume {vol_id} could not be found."),
                );
            };
            if s.nova.volumes[vi].status != "available" {
                return nova_err(
                    400,
                    "badRequest",
                    &format!("Invalid volume: volume {vol_id} status must be 'available'"),
                );
            }
            s.nova.volumes[vi].status = "in-use".into();
            s.nova.volumes[vi].attached_to = Some(id.to_string());
            s.nova.servers[si].volumes.push(vol_id.clone());
            let device = att["device"].as_str().unwrap_or("/dev/vdb").to_string();
            Answer::json(
                200,
                json!({"volumeAttachment": {"device": device, "id": vol_id, "serverId": id, "volumeId": vol_id}}),
            )
        }
        (Method::GET, ["limits"]) => {
            let l = s.nova.limits;
            let (n, cores, ram) = s.nova.used();
            Answer::json(
                200,
                json!({"limits": {"rate": [], "absolute": {
                    "maxTotalInstances": l.instances, "totalInstancesUsed": n,
                    "maxTotalCores": l.cores, "totalCoresUsed": cores,
                    "maxTotalRAMSize": l.ram, "totalRAMUsed": ram,
                    "maxServerMeta": 128, "maxImageMeta": 128, "maxPersonality": 5,
                    "maxPersonalitySize": 10240, "maxTotalKeypairs": 100,
                    "maxServerGroups": 10, "maxServerGroupMembers": 10,
                    "totalServerGroupsUsed": 0, "maxSecurityGroups": 10,
                    "maxSecurityGroupRules": 20, "totalSecurityGroupsUsed": 0,
                    "maxTotalFloatingIps": 10, "totalFloatingIpsUsed": 0,
                }}}),
            )
        }
        (Method::GET, ["flavors", "detail"]) => {
            let list: Vec<Value> = s
                .nova
                .flavors
                .iter()
                .map(|f| flavor_json(f, &base))
                .collect();
            Answer::json(200, json!({ "flavors": list }))
        }
        (Method::GET, ["flavors", id]) => match s.nova.flavors.iter().find(|f| f.id == *id) {
            Some(f) => Answer::json(200, json!({ "flavor": flavor_json(f, &base) })),
            None => nova_err(
                404,
                "itemNotFound",
                &format!("Flavor {id} could not be found."),
            ),
        },
        _ => violation(s, req, "no such Nova API call"),
    }
}

fn create_server(s: &mut State, req: &mut Req) -> Answer {
    let body = req.body.clone().unwrap_or(Value::Null);
    let Some(outer) = body.as_object() else {
        return violation(s, req, "body must be {\"server\": {...}}");
    };
    if outer
        .keys()
        .any(|k| k != "server" && k != "OS-SCH-HNT:scheduler_hints")
    {
        return violation(s, req, "unknown top-level key in server create");
    }
    let Some(sv) = body["server"].as_object().cloned() else {
        return violation(s, req, "body must be {\"server\": {...}}");
    };
    let allowed = [
        "name",
        "flavorRef",
        "imageRef",
        "availability_zone",
        "user_data",
        "key_name",
        "networks",
        "security_groups",
        "metadata",
        "min_count",
        "max_count",
        "config_drive",
        "block_device_mapping_v2",
        "description",
    ];
    if let Some(k) = sv.keys().find(|k| !allowed.contains(&k.as_str())) {
        return violation(s, req, format!("unknown server attribute {k:?}"));
    }
    let Some(name) = sv
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty() && n.len() <= 255)
    else {
        return violation(s, req, "server.name must be a string of 1..=255 characters");
    };
    let Some(flavor) = sv.get("flavorRef").and_then(Value::as_str) else {
        return violation(s, req, "server.flavorRef must be a flavor id string");
    };
    let Some(image) = sv.get("imageRef").and_then(Value::as_str) else {
        return violation(s, req, "server.imageRef must be an image id string");
    };
    if !s.nova.images.values().any(|i| i == image) {
        return nova_err(400, "badRequest", "Can not find requested image");
    }
    let Some(fl) = s.nova.flavors.iter().find(|f| f.id == flavor).cloned() else {
        return nova_err(
            400,
            "badRequest",
            &format!("Flavor {flavor} could not be found."),
        );
    };
    let user_data = match sv.get("user_data") {
        None => None,
        Some(Value::String(b64)) => {
            if b64.len() > 65535 {
                return violation(s, req, "user_data longer than 65535 bytes");
            }
            match base64::engine::general_purpose::STANDARD.decode(b64) {
                Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
                Err(_) => return violation(s, req, "user_data must be base64"),
            }
        }
        Some(_) => return violation(s, req, "user_data must be a base64 string"),
    };
    let mut networks = Vec::new();
    if let Some(n) = sv.get("networks") {
        let Some(list) = n.as_array() else {
            return violation(s, req, "networks must be a list of {\"uuid\": id}");
        };
        for e in list {
            let Some(uuid) = e.get("uuid").and_then(Value::as_str) else {
                return violation(s, req, "networks entries must be {\"uuid\": id}");
            };
            if !s.nova.networks.values().any(|id| id == uuid) {
                return nova_err(
                    400,
                    "badRequest",
                    &format!("Network {uuid} could not be found."),
                );
            }
            networks.push(uuid.to_string());
        }
    }
    let mut security_groups = Vec::new();
    if let Some(g) = sv.get("security_groups") {
        let Some(list) = g.as_array() else {
            return violation(s, req, "security_groups must be a list of {\"name\": name}");
        };
        for e in list {
            let Some(n) = e.get("name").and_then(Value::as_str) else {
                return violation(s, req, "security_groups entries must be {\"name\": name}");
            };
            security_groups.push(n.to_string());
        }
    }
    let mut metadata = BTreeMap::new();
    if let Some(m) = sv.get("metadata") {
        let Some(obj) = m.as_object() else {
            return violation(s, req, "metadata must be an object of strings");
        };
        if obj.len() > 128 {
            return nova_err(
                403,
                "forbidden",
                "Quota exceeded for metadata_items: Requested 129, but already used 0 of 128 metadata_items",
            );
        }
        for (k, v) in obj {
            let Some(v) = v.as_str() else {
                return violation(s, req, format!("metadata value of {k:?} must be a string"));
            };
            if k.is_empty() || k.len() > 255 || v.len() > 255 {
                return violation(
                    s,
                    req,
                    "metadata keys and values must be 1..=255 characters",
                );
            }
            metadata.insert(k.clone(), v.to_string());
        }
    }
    // Quota, as Nova checks it: instances, then cores, then RAM.
    let l = s.nova.limits;
    let (n, cores, ram) = s.nova.used();
    let over = |what: &str, req_n: u64, used: u64, max: u64| {
        nova_err(
            403,
            "forbidden",
            &format!(
                "Quota exceeded for {what}: Requested {req_n}, but already used {used} of {max} {what}"
            ),
        )
    };
    if n + 1 > l.instances {
        return over("instances", 1, n, l.instances);
    }
    if cores + fl.vcpus > l.cores {
        return over("cores", fl.vcpus, cores, l.cores);
    }
    if ram + fl.ram > l.ram {
        return over("ram", fl.ram, ram, l.ram);
    }
    let id = s.next_id("9c4e");
    let fault = s.nova.fail_next_boot.take();
    let polls = s.nova.build_polls;
    s.nova.servers.push(FakeServer {
        id: id.clone(),
        name: name.into(),
        status: "BUILD".into(),
        flavor: flavor.into(),
        image: image.into(),
        availability_zone: sv
            .get("availability_zone")
            .and_then(Value::as_str)
            .map(str::to_string),
        user_data,
        key_name: sv
            .get("key_name")
            .and_then(Value::as_str)
            .map(str::to_string),
        networks,
        security_groups: if security_groups.is_empty() {
            vec!["default".into()]
        } else {
            security_groups
        },
        metadata,
        volumes: Vec::new(),
        create_body: Some(body.clone()),
        polls_left: polls,
        fault,
    });
    let base = s.base.clone();
    Answer(
        StatusCode::ACCEPTED,
        vec![(
            "location".into(),
            format!("{base}/compute/v2.1/servers/{id}"),
        )],
        Some(json!({"server": {
            "id": id,
            "links": [{"href": format!("{base}/compute/v2.1/servers/{id}"), "rel": "self"}],
            "OS-DCF:diskConfig": "MANUAL",
            "security_groups": [{"name": "default"}],
            "adminPass": "6NpUwoz2QDRN",
        }})),
    )
}

fn volume_json(v: &FakeVolume) -> Value {
    json!({
        "id": v.id, "name": v.name, "size": v.size, "status": v.status,
        "volume_type": v.volume_type.clone().unwrap_or_else(|| "__DEFAULT__".into()),
        "availability_zone": v.availability_zone.clone().unwrap_or_else(|| "nova".into()),
        "metadata": v.metadata, "bootable": "false", "encrypted": false, "multiattach": false,
        "attachments": v.attached_to.iter().map(|sid| json!({"server_id": sid, "attachment_id": format!("att-{}", v.id), "volume_id": v.id, "device": "/dev/vdb"})).collect::<Vec<_>>(),
        "created_at": "2024-05-01T10:00:00.000000", "updated_at": null,
        "os-vol-tenant-attr:tenant_id": PROJECT_ID, "user_id": USER_ID,
        "links": [],
    })
}

pub(crate) fn cinder(s: &mut State, req: &mut Req) -> Answer {
    let prefix = format!("/volume/v3/{PROJECT_ID}/");
    if !req.path.starts_with(&prefix) {
        return violation(
            s,
            req,
            "the project id in the Cinder URL is not the project's",
        );
    }
    let segs = req.segments(&prefix);
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (req.method.clone(), segs.as_slice()) {
        (Method::POST, ["volumes"]) => {
            let body = req.body.clone().unwrap_or(Value::Null);
            let Some(v) = body["volume"].as_object().cloned() else {
                return violation(s, req, "body must be {\"volume\": {...}}");
            };
            let allowed = [
                "size",
                "name",
                "description",
                "volume_type",
                "availability_zone",
                "metadata",
                "snapshot_id",
                "source_volid",
                "imageRef",
                "multiattach",
                "consistencygroup_id",
                "backup_id",
            ];
            if let Some(k) = v.keys().find(|k| !allowed.contains(&k.as_str())) {
                return violation(s, req, format!("unknown volume attribute {k:?}"));
            }
            let Some(size) = v.get("size").and_then(Value::as_u64).filter(|n| *n > 0) else {
                return violation(s, req, "volume.size must be a positive integer (GiB)");
            };
            let l = s.nova.limits;
            let count = s.nova.volumes.len() as u64;
            let gb: u64 = s.nova.volumes.iter().map(|v| v.size).sum();
            if count + 1 > l.volumes {
                return nova_err(
                    413,
                    "overLimit",
                    &format!(
                        "VolumeLimitExceeded: Maximum number of volumes allowed ({}) exceeded for quota 'volumes'.",
                        l.volumes
                    ),
                );
            }
            if gb + size > l.gigabytes {
                return nova_err(
                    413,
                    "overLimit",
                    &format!(
                        "VolumeSizeExceedsAvailableQuota: Requested volume or snapshot exceeds allowed gigabytes quota. Requested {size}G, quota is {}G and {gb}G has been consumed.",
                        l.gigabytes
                    ),
                );
            }
            let metadata = match v.get("metadata") {
                None => BTreeMap::new(),
                Some(m) => match m.as_object() {
                    Some(o) if o.values().all(Value::is_string) => o
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect(),
                    _ => return violation(s, req, "volume.metadata must be an object of strings"),
                },
            };
            let id = s.next_id("6d2a");
            let polls = s.nova.volume_polls;
            let vol = FakeVolume {
                id,
                name: v
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                size,
                status: "creating".into(),
                volume_type: v
                    .get("volume_type")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                availability_zone: v
                    .get("availability_zone")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                metadata,
                attached_to: None,
                polls_left: polls,
            };
            let j = volume_json(&vol);
            s.nova.volumes.push(vol);
            Answer::json(202, json!({ "volume": j }))
        }
        (Method::GET, ["volumes", "detail"]) => {
            let name = req.param("name");
            let list: Vec<Value> = s
                .nova
                .volumes
                .iter()
                .filter(|v| name.as_deref().is_none_or(|n| v.name == n))
                .map(volume_json)
                .collect();
            Answer::json(200, json!({ "volumes": list }))
        }
        (Method::GET, ["volumes", id]) => {
            let Some(i) = s.nova.volumes.iter().position(|v| v.id == *id) else {
                return nova_err(
                    404,
                    "itemNotFound",
                    &format!("Volume {id} could not be found."),
                );
            };
            let v = &mut s.nova.volumes[i];
            if v.status == "creating" {
                if v.polls_left > 0 {
                    v.polls_left -= 1;
                } else {
                    v.status = "available".into();
                }
            }
            Answer::json(200, json!({ "volume": volume_json(v) }))
        }
        (Method::DELETE, ["volumes", id]) => {
            let Some(i) = s.nova.volumes.iter().position(|v| v.id == *id) else {
                return nova_err(
                    404,
                    "itemNotFound",
                    &format!("Volume {id} could not be found."),
                );
            };
            if s.nova.volumes[i].status == "in-use" || s.nova.volumes[i].attached_to.is_some() {
                return nova_err(
                    400,
                    "badRequest",
                    "Invalid volume: Volume status must be available or error or error_restoring or error_extending or error_managing and must not be migrating, attached, belong to a group, have snapshots or be disassociated from snapshots after volume transfer.",
                );
            }
            s.nova.volumes.remove(i);
            Answer::empty(202)
        }
        _ => violation(s, req, "no such Cinder API call"),
    }
}

pub(crate) fn glance(s: &mut State, req: &mut Req) -> Answer {
    if req.method != Method::GET || req.path != "/image/v2/images" {
        return violation(s, req, "only GET /v2/images?name= is served");
    }
    let name = req.param("name");
    let list: Vec<Value> = s
        .nova
        .images
        .iter()
        .filter(|(n, _)| name.as_deref().is_none_or(|q| q == n.as_str()))
        .map(|(n, id)| json!({"id": id, "name": n, "status": "active", "visibility": "private", "disk_format": "qcow2", "container_format": "bare", "min_disk": 0, "min_ram": 0, "self": format!("/v2/images/{id}"), "schema": "/v2/schemas/image"}))
        .collect();
    Answer::json(
        200,
        json!({"images": list, "first": "/v2/images", "schema": "/v2/schemas/images"}),
    )
}

pub(crate) fn neutron(s: &mut State, req: &mut Req) -> Answer {
    if req.method != Method::GET || req.path != "/network/v2.0/networks" {
        return violation(s, req, "only GET /v2.0/networks?name= is served");
    }
    let name = req.param("name");
    let list: Vec<Value> = s
        .nova
        .networks
        .iter()
        .filter(|(n, _)| name.as_deref().is_none_or(|q| q == n.as_str()))
        .map(|(n, id)| json!({"id": id, "name": n, "status": "ACTIVE", "admin_state_up": true, "shared": false, "subnets": [], "project_id": PROJECT_ID, "tenant_id": PROJECT_ID}))
        .collect();
    Answer::json(200, json!({ "networks": list }))
}
