//! The fake Nova: servers (create, list, show, delete, attach a volume),
//! flavors and limits, under `/compute/v2.1`.

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::{
    FakeServer, Flavor, advance_server, drop_server, flavor_json, name_matches, nova_err,
    server_detail,
};
use crate::fake_openstack::{Answer, Req, State, violation};

pub(crate) fn nova(s: &mut State, req: &mut Req) -> Answer {
    let segs = req.segments("/compute/v2.1/");
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let base = s.base.clone();
    match (req.method.clone(), segs.as_slice()) {
        (Method::POST, ["servers"]) => create_server(s, req),
        (Method::GET, ["servers", "detail"]) => list_servers(s, req, true),
        (Method::GET, ["servers"]) => list_servers(s, req, false),
        (Method::GET, ["servers", id]) => {
            let Some(i) = s.nova.servers.iter().position(|sv| sv.id == *id) else {
                return no_instance(id);
            };
            advance_server(s, i);
            Answer::json(
                200,
                json!({ "server": server_detail(&s.nova.servers[i], &base) }),
            )
        }
        (Method::DELETE, ["servers", id]) => {
            if !s.nova.servers.iter().any(|sv| sv.id == *id) {
                return no_instance(id);
            }
            let id = id.to_string();
            drop_server(s, &id);
            Answer::empty(204)
        }
        (Method::POST, ["servers", id, "os-volume_attachments"]) => attach_volume(s, req, id),
        (Method::GET, ["limits"]) => limits(s),
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

fn no_instance(id: &str) -> Answer {
    nova_err(
        404,
        "itemNotFound",
        &format!("Instance {id} could not be found."),
    )
}

/// `GET /servers[/detail]?name=`.
fn list_servers(s: &mut State, req: &Req, detail: bool) -> Answer {
    for (k, _) in req.params() {
        if !["name", "status", "limit", "marker", "all_tenants"].contains(&k.as_str()) {
            return violation(s, req, format!("unsupported server list filter {k:?}"));
        }
    }
    let name = req.param("name");
    let base = s.base.clone();
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

/// `POST /servers/{id}/os-volume_attachments`.
fn attach_volume(s: &mut State, req: &Req, id: &str) -> Answer {
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
    let Some(si) = s.nova.servers.iter().position(|sv| sv.id == id) else {
        return no_instance(id);
    };
    if s.nova.servers[si].status != "ACTIVE" {
        return nova_err(
            409,
            "conflictingRequest",
            &format!("Cannot 'attach_volume' instance {id} while it is in vm_state building"),
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

/// `GET /limits`.
fn limits(s: &State) -> Answer {
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

/// Attributes of a server create request.
const SERVER_FIELDS: [&str; 14] = [
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

/// A refusal of a create request: a violation of the documented shape
/// (recorded) or an answer of Nova's.
enum No {
    Shape(String),
    Nova(Answer),
}

impl No {
    fn shape(why: impl Into<String>) -> No {
        No::Shape(why.into())
    }
}

/// `POST /servers`.
fn create_server(s: &mut State, req: &mut Req) -> Answer {
    let body = req.body.clone().unwrap_or(Value::Null);
    match checked_server(s, &body) {
        Ok(server) => boot(s, server),
        Err(No::Shape(why)) => violation(s, req, why),
        Err(No::Nova(a)) => a,
    }
}

/// The server a create request describes, checked as Nova checks it
/// (shape, image, flavor, networks, metadata, then quota).
fn checked_server(s: &mut State, body: &Value) -> Result<FakeServer, No> {
    let Some(outer) = body.as_object() else {
        return Err(No::shape("body must be {\"server\": {...}}"));
    };
    if outer
        .keys()
        .any(|k| k != "server" && k != "OS-SCH-HNT:scheduler_hints")
    {
        return Err(No::shape("unknown top-level key in server create"));
    }
    let Some(sv) = body["server"].as_object() else {
        return Err(No::shape("body must be {\"server\": {...}}"));
    };
    if let Some(k) = sv.keys().find(|k| !SERVER_FIELDS.contains(&k.as_str())) {
        return Err(No::shape(format!("unknown server attribute {k:?}")));
    }
    let Some(name) = sv
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty() && n.len() <= 255)
    else {
        return Err(No::shape(
            "server.name must be a string of 1..=255 characters",
        ));
    };
    let fl = flavor_and_image(s, sv)?;
    let user_data = user_data(sv)?;
    let networks = networks(s, sv)?;
    let security_groups = security_groups(sv)?;
    let metadata = metadata(sv)?;
    quota(s, &fl)?;
    let text = |k: &str| sv.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(FakeServer {
        id: s.next_id("9c4e"),
        name: name.into(),
        status: "BUILD".into(),
        flavor: fl.id.clone(),
        image: text("imageRef").unwrap_or_default(),
        availability_zone: text("availability_zone"),
        user_data,
        key_name: text("key_name"),
        networks,
        security_groups: if security_groups.is_empty() {
            vec!["default".into()]
        } else {
            security_groups
        },
        metadata,
        volumes: Vec::new(),
        create_body: Some(body.clone()),
        polls_left: s.nova.build_polls,
        fault: None,
    })
}

/// The flavor of `flavorRef`, once `imageRef` names a known image.
fn flavor_and_image(s: &State, sv: &Map<String, Value>) -> Result<Flavor, No> {
    let Some(flavor) = sv.get("flavorRef").and_then(Value::as_str) else {
        return Err(No::shape("server.flavorRef must be a flavor id string"));
    };
    let Some(image) = sv.get("imageRef").and_then(Value::as_str) else {
        return Err(No::shape("server.imageRef must be an image id string"));
    };
    if !s.nova.images.values().any(|i| i == image) {
        return Err(No::Nova(nova_err(
            400,
            "badRequest",
            "Can not find requested image",
        )));
    }
    s.nova
        .flavors
        .iter()
        .find(|f| f.id == flavor)
        .cloned()
        .ok_or_else(|| {
            No::Nova(nova_err(
                400,
                "badRequest",
                &format!("Flavor {flavor} could not be found."),
            ))
        })
}

/// `user_data`: base64 of at most 65535 bytes, decoded.
fn user_data(sv: &Map<String, Value>) -> Result<Option<String>, No> {
    match sv.get("user_data") {
        None => Ok(None),
        Some(Value::String(b64)) => {
            if b64.len() > 65535 {
                return Err(No::shape("user_data longer than 65535 bytes"));
            }
            match base64::engine::general_purpose::STANDARD.decode(b64) {
                Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
                Err(_) => Err(No::shape("user_data must be base64")),
            }
        }
        Some(_) => Err(No::shape("user_data must be a base64 string")),
    }
}

/// `networks`: `[{"uuid": id}]` of known networks.
fn networks(s: &State, sv: &Map<String, Value>) -> Result<Vec<String>, No> {
    let mut networks = Vec::new();
    let Some(n) = sv.get("networks") else {
        return Ok(networks);
    };
    let Some(list) = n.as_array() else {
        return Err(No::shape("networks must be a list of {\"uuid\": id}"));
    };
    for e in list {
        let Some(uuid) = e.get("uuid").and_then(Value::as_str) else {
            return Err(No::shape("networks entries must be {\"uuid\": id}"));
        };
        if !s.nova.networks.values().any(|id| id == uuid) {
            return Err(No::Nova(nova_err(
                400,
                "badRequest",
                &format!("Network {uuid} could not be found."),
            )));
        }
        networks.push(uuid.to_string());
    }
    Ok(networks)
}

/// `security_groups`: `[{"name": name}]`.
fn security_groups(sv: &Map<String, Value>) -> Result<Vec<String>, No> {
    let mut groups = Vec::new();
    let Some(g) = sv.get("security_groups") else {
        return Ok(groups);
    };
    let Some(list) = g.as_array() else {
        return Err(No::shape(
            "security_groups must be a list of {\"name\": name}",
        ));
    };
    for e in list {
        let Some(n) = e.get("name").and_then(Value::as_str) else {
            return Err(No::shape(
                "security_groups entries must be {\"name\": name}",
            ));
        };
        groups.push(n.to_string());
    }
    Ok(groups)
}

/// `metadata`: at most 128 string pairs of 1..=255 characters.
fn metadata(sv: &Map<String, Value>) -> Result<BTreeMap<String, String>, No> {
    let mut metadata = BTreeMap::new();
    let Some(m) = sv.get("metadata") else {
        return Ok(metadata);
    };
    let Some(obj) = m.as_object() else {
        return Err(No::shape("metadata must be an object of strings"));
    };
    if obj.len() > 128 {
        return Err(No::Nova(nova_err(
            403,
            "forbidden",
            "Quota exceeded for metadata_items: Requested 129, but already used 0 of 128 metadata_items",
        )));
    }
    for (k, v) in obj {
        let Some(v) = v.as_str() else {
            return Err(No::shape(format!(
                "metadata value of {k:?} must be a string"
            )));
        };
        if k.is_empty() || k.len() > 255 || v.len() > 255 {
            return Err(No::shape(
                "metadata keys and values must be 1..=255 characters",
            ));
        }
        metadata.insert(k.clone(), v.to_string());
    }
    Ok(metadata)
}

/// Quota, as Nova checks it: instances, then cores, then RAM.
fn quota(s: &State, fl: &Flavor) -> Result<(), No> {
    let l = s.nova.limits;
    let (n, cores, ram) = s.nova.used();
    let over = |what: &str, req_n: u64, used: u64, max: u64| {
        Err(No::Nova(nova_err(
            403,
            "forbidden",
            &format!(
                "Quota exceeded for {what}: Requested {req_n}, but already used {used} of {max} {what}"
            ),
        )))
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
    Ok(())
}

/// Adds the server (building) and answers `202`.
fn boot(s: &mut State, mut server: FakeServer) -> Answer {
    server.fault = s.nova.fail_next_boot.take();
    let id = server.id.clone();
    s.nova.servers.push(server);
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
