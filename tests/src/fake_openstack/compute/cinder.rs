//! The fake Cinder (volumes under `/volume/v3/{project_id}`), and the
//! Glance and Neutron look-ups by name.

use std::collections::BTreeMap;

use axum::http::Method;
use serde_json::{Value, json};

use super::{FakeVolume, nova_err};
use crate::fake_openstack::{Answer, PROJECT_ID, Req, State, USER_ID, violation};

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
        (Method::POST, ["volumes"]) => create_volume(s, req),
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
                return no_volume(id);
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
        (Method::DELETE, ["volumes", id]) => delete_volume(s, id),
        _ => violation(s, req, "no such Cinder API call"),
    }
}

fn no_volume(id: &str) -> Answer {
    nova_err(
        404,
        "itemNotFound",
        &format!("Volume {id} could not be found."),
    )
}

/// `DELETE /volumes/{id}`: only an available, detached volume.
fn delete_volume(s: &mut State, id: &str) -> Answer {
    let Some(i) = s.nova.volumes.iter().position(|v| v.id == id) else {
        return no_volume(id);
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

/// Attributes of a volume create request.
const VOLUME_FIELDS: [&str; 12] = [
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

/// `POST /volumes`, within the volume and gigabyte quotas.
fn create_volume(s: &mut State, req: &Req) -> Answer {
    let body = req.body.clone().unwrap_or(Value::Null);
    let Some(v) = body["volume"].as_object().cloned() else {
        return violation(s, req, "body must be {\"volume\": {...}}");
    };
    if let Some(k) = v.keys().find(|k| !VOLUME_FIELDS.contains(&k.as_str())) {
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
