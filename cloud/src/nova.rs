//! Nova (compute API v2.1, no microversion header: the base 2.1 behaviour),
//! plus the two look-ups a server create needs: Glance images and Neutron
//! networks by name.
//!
//! Calls: `POST servers`, `GET servers/detail?name=`, `GET servers/{id}`,
//! `DELETE servers/{id}`, `GET limits`, `GET flavors/detail`,
//! `POST servers/{id}/os-volume_attachments`; Glance `GET v2/images?name=`;
//! Neutron `GET v2.0/networks?name=`.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Session;
use crate::error::{CloudError, Service, bounded, nova_names_quota};
use crate::heat::seg;

/// Largest `user_data` Nova accepts, after base64 (65535 bytes).
pub const MAX_USER_DATA_B64: usize = 65535;

/// What to boot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerCreate {
    /// Server name.
    pub name: String,
    /// Flavor id.
    pub flavor_id: String,
    /// Image id.
    pub image_id: String,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// User data (plain text; base64-encoded on the wire).
    pub user_data: Option<String>,
    /// Key pair name.
    pub key_name: Option<String>,
    /// Network ids.
    pub network_ids: Vec<String>,
    /// Security group names.
    pub security_groups: Vec<String>,
    /// Server metadata (at most 255 characters per key and value).
    pub metadata: BTreeMap<String, String>,
}

impl ServerCreate {
    /// The documented `POST /servers` body.
    pub fn to_body(&self) -> Result<Value, CloudError> {
        let mut s = serde_json::Map::new();
        s.insert("name".into(), json!(self.name));
        s.insert("flavorRef".into(), json!(self.flavor_id));
        s.insert("imageRef".into(), json!(self.image_id));
        if let Some(az) = &self.availability_zone {
            s.insert("availability_zone".into(), json!(az));
        }
        if let Some(ud) = &self.user_data {
            let b64 = base64::engine::general_purpose::STANDARD.encode(ud.as_bytes());
            if b64.len() > MAX_USER_DATA_B64 {
                return Err(CloudError::Config(format!(
                    "user data is {} bytes after base64; Nova takes at most {MAX_USER_DATA_B64}",
                    b64.len()
                )));
            }
            s.insert("user_data".into(), json!(b64));
        }
        if let Some(k) = &self.key_name {
            s.insert("key_name".into(), json!(k));
        }
        if !self.network_ids.is_empty() {
            let n: Vec<Value> = self
                .network_ids
                .iter()
                .map(|id| json!({ "uuid": id }))
                .collect();
            s.insert("networks".into(), json!(n));
        }
        if !self.security_groups.is_empty() {
            let g: Vec<Value> = self
                .security_groups
                .iter()
                .map(|n| json!({ "name": n }))
                .collect();
            s.insert("security_groups".into(), json!(g));
        }
        if !self.metadata.is_empty() {
            for (k, v) in &self.metadata {
                if k.is_empty() || k.len() > 255 || v.len() > 255 {
                    return Err(CloudError::Config(format!(
                        "server metadata {k:?}: keys and values are 1..=255 characters"
                    )));
                }
            }
            s.insert("metadata".into(), json!(self.metadata));
        }
        Ok(json!({ "server": s }))
    }
}

/// A server's fault (set when it is `ERROR`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Fault {
    /// Nova's message (for example a scheduling or quota failure).
    #[serde(default)]
    pub message: String,
    /// The code Nova recorded.
    #[serde(default)]
    pub code: Option<u16>,
}

/// A server, as `GET /servers/{id}` describes it (the fields we use).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Server {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// `BUILD`, `ACTIVE`, `ERROR`, `DELETED`, `SHUTOFF`, ...
    pub status: String,
    /// Metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Fault, when `ERROR`.
    #[serde(default)]
    pub fault: Option<Fault>,
    /// Availability zone.
    #[serde(default, rename = "OS-EXT-AZ:availability_zone")]
    pub availability_zone: Option<String>,
}

/// A flavor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
    #[serde(default)]
    pub disk: u64,
}

/// The quota part of `GET /limits` (`-1` means unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbsoluteLimits {
    /// `maxTotalInstances`.
    pub max_total_instances: i64,
    /// `totalInstancesUsed`.
    #[serde(default)]
    pub total_instances_used: i64,
    /// `maxTotalCores`.
    pub max_total_cores: i64,
    /// `totalCoresUsed`.
    #[serde(default)]
    pub total_cores_used: i64,
    /// `maxTotalRAMSize` (MiB).
    #[serde(rename = "maxTotalRAMSize")]
    pub max_total_ram_size: i64,
    /// `totalRAMUsed` (MiB).
    #[serde(default, rename = "totalRAMUsed")]
    pub total_ram_used: i64,
}

impl AbsoluteLimits {
    /// How many more servers of `flavor` fit, and which limit binds
    /// (`None` when nothing limits).
    pub fn servers_that_fit(&self, flavor: &Flavor) -> (Option<u64>, String) {
        let room = |max: i64, used: i64, each: u64| -> Option<u64> {
            if max < 0 {
                return None;
            }
            ((max - used).max(0) as u64).checked_div(each)
        };
        let checks = [
            (
                "instances",
                room(self.max_total_instances, self.total_instances_used, 1),
                self.total_instances_used,
                self.max_total_instances,
            ),
            (
                "cores",
                room(self.max_total_cores, self.total_cores_used, flavor.vcpus),
                self.total_cores_used,
                self.max_total_cores,
            ),
            (
                "ram",
                room(self.max_total_ram_size, self.total_ram_used, flavor.ram),
                self.total_ram_used,
                self.max_total_ram_size,
            ),
        ];
        let mut best: Option<(u64, &str, i64, i64)> = None;
        for (what, r, used, max) in checks {
            if let Some(r) = r
                && best.is_none_or(|(b, ..)| r < b)
            {
                best = Some((r, what, used, max));
            }
        }
        match best {
            Some((n, what, used, max)) => (
                Some(n),
                format!(
                    "{n} more {} server(s) fit; {what} binds ({used} of {max} used; instances {}/{}, cores {}/{}, ram {}/{} MiB)",
                    flavor.name,
                    self.total_instances_used,
                    self.max_total_instances,
                    self.total_cores_used,
                    self.max_total_cores,
                    self.total_ram_used,
                    self.max_total_ram_size
                ),
            ),
            None => (None, "no compute quota applies".into()),
        }
    }
}

/// Nova client.
#[derive(Debug, Clone)]
pub struct Nova {
    session: Session,
}

impl Nova {
    /// A client on this session.
    pub fn new(session: Session) -> Self {
        Nova { session }
    }

    /// The session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<crate::http::Response, CloudError> {
        self.session
            .request(Service::Compute, method, path, &[], body)
            .await
    }

    /// Boots a server; returns its id. Quota refusals (403/413 "Quota
    /// exceeded") come back with `is_quota()`.
    pub async fn create_server(&self, req: &ServerCreate) -> Result<String, CloudError> {
        let body = req.to_body()?;
        let resp = self.call(Method::POST, "servers", Some(&body)).await?;
        #[derive(Deserialize)]
        struct Created {
            server: IdOnly,
        }
        #[derive(Deserialize)]
        struct IdOnly {
            id: String,
        }
        let c: Created = resp.json(Service::Compute, "servers")?;
        Ok(c.server.id)
    }

    /// A server, or `None` if Nova does not know it (404) or it is `DELETED`.
    pub async fn get_server(&self, id: &str) -> Result<Option<Server>, CloudError> {
        let path = format!("servers/{}", seg(id));
        match self.call(Method::GET, &path, None).await {
            Ok(resp) => {
                #[derive(Deserialize)]
                struct Body {
                    server: Server,
                }
                let b: Body = resp.json(Service::Compute, &path)?;
                Ok((b.server.status != "DELETED").then_some(b.server))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Servers whose name matches Nova's `name` filter (a regular
    /// expression on the server side; callers compare names exactly).
    pub async fn list_servers(&self, name_filter: Option<&str>) -> Result<Vec<Server>, CloudError> {
        let mut path = String::from("servers/detail");
        if let Some(n) = name_filter {
            path.push_str("?name=");
            path.push_str(&url::form_urlencoded::byte_serialize(n.as_bytes()).collect::<String>());
        }
        let mut out = Vec::new();
        // Nova pages at its configured max_limit and links the next page.
        for _ in 0..100 {
            let resp = self.call(Method::GET, &path, None).await?;
            #[derive(Deserialize)]
            struct Page {
                servers: Vec<Server>,
                #[serde(default)]
                servers_links: Vec<crate::heat::Link>,
            }
            let page: Page = resp.json(Service::Compute, &path)?;
            out.extend(page.servers.into_iter().filter(|s| s.status != "DELETED"));
            match page.servers_links.into_iter().find(|l| l.rel == "next") {
                Some(next) => path = next.href,
                None => return Ok(out),
            }
        }
        Err(CloudError::Decode {
            service: Service::Compute,
            url: "servers/detail".into(),
            message: "more than 100 pages of servers".into(),
        })
    }

    /// Deletes a server; a server already gone is fine.
    pub async fn delete_server(&self, id: &str) -> Result<(), CloudError> {
        match self
            .call(Method::DELETE, &format!("servers/{}", seg(id)), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits for `ACTIVE`. `ERROR` is [`CloudError::Failed`] with Nova's
    /// fault (quota flagged when the fault names one).
    pub async fn wait_active(
        &self,
        id: &str,
        timeout: Duration,
        poll: Duration,
    ) -> Result<Server, CloudError> {
        let start = tokio::time::Instant::now();
        loop {
            let last = match self.get_server(id).await? {
                None => {
                    return Err(CloudError::Failed {
                        what: format!("server {id}"),
                        state: "DELETED".into(),
                        reason: "the server disappeared while booting".into(),
                        quota: false,
                    });
                }
                Some(s) if s.status == "ACTIVE" => return Ok(s),
                Some(s) if s.status == "ERROR" => {
                    let reason = s.fault.map(|f| f.message).unwrap_or_default();
                    return Err(CloudError::Failed {
                        what: format!("server {} ({id})", s.name),
                        state: "ERROR".into(),
                        quota: nova_names_quota(403, &reason),
                        reason: bounded(&reason),
                    });
                }
                Some(s) => s.status,
            };
            if start.elapsed() >= timeout {
                return Err(CloudError::Timeout {
                    what: format!("server {id} to become ACTIVE"),
                    waited: timeout,
                    last_state: last,
                });
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Waits until the server is gone (404 or `DELETED`).
    pub async fn wait_gone(
        &self,
        id: &str,
        timeout: Duration,
        poll: Duration,
    ) -> Result<(), CloudError> {
        let start = tokio::time::Instant::now();
        loop {
            let Some(s) = self.get_server(id).await? else {
                return Ok(());
            };
            if start.elapsed() >= timeout {
                return Err(CloudError::Timeout {
                    what: format!("server {id} to be deleted"),
                    waited: timeout,
                    last_state: s.status,
                });
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// The project's absolute limits and usage.
    pub async fn limits(&self) -> Result<AbsoluteLimits, CloudError> {
        let resp = self.call(Method::GET, "limits", None).await?;
        #[derive(Deserialize)]
        struct Body {
            limits: Inner,
        }
        #[derive(Deserialize)]
        struct Inner {
            absolute: AbsoluteLimits,
        }
        let b: Body = resp.json(Service::Compute, "limits")?;
        Ok(b.limits.absolute)
    }

    /// Every flavor visible to the project.
    pub async fn flavors(&self) -> Result<Vec<Flavor>, CloudError> {
        let resp = self.call(Method::GET, "flavors/detail", None).await?;
        #[derive(Deserialize)]
        struct Body {
            flavors: Vec<Flavor>,
        }
        let b: Body = resp.json(Service::Compute, "flavors/detail")?;
        Ok(b.flavors)
    }

    /// The flavor with this id, or else this name.
    pub async fn find_flavor(&self, name_or_id: &str) -> Result<Flavor, CloudError> {
        let all = self.flavors().await?;
        all.iter()
            .find(|f| f.id == name_or_id)
            .or_else(|| all.iter().find(|f| f.name == name_or_id))
            .cloned()
            .ok_or_else(|| CloudError::Config(format!("no flavor with id or name {name_or_id:?}")))
    }

    /// Attaches a volume (`POST servers/{id}/os-volume_attachments`).
    pub async fn attach_volume(
        &self,
        server_id: &str,
        volume_id: &str,
        device: Option<&str>,
    ) -> Result<(), CloudError> {
        let mut att = json!({ "volumeId": volume_id });
        if let Some(d) = device {
            att["device"] = json!(d);
        }
        let body = json!({ "volumeAttachment": att });
        self.call(
            Method::POST,
            &format!("servers/{}/os-volume_attachments", seg(server_id)),
            Some(&body),
        )
        .await?;
        Ok(())
    }
}

/// Whether `s` looks like a UUID (then it is used as an id without a look-up).
pub fn looks_like_uuid(s: &str) -> bool {
    let hex = s.chars().filter(|c| *c != '-').collect::<String>();
    hex.len() == 32
        && hex.chars().all(|c| c.is_ascii_hexdigit())
        && (s.len() == 32 || s.len() == 36)
}

/// The image id for `name_or_id` (a UUID is taken as is; otherwise Glance
/// `GET v2/images?name=` must find exactly one).
pub async fn find_image(session: &Session, name_or_id: &str) -> Result<String, CloudError> {
    if looks_like_uuid(name_or_id) {
        return Ok(name_or_id.to_string());
    }
    let base = session.endpoint(Service::Image).await?;
    let root = if base.ends_with("/v2") {
        base
    } else {
        format!("{base}/v2")
    };
    let q: String = url::form_urlencoded::byte_serialize(name_or_id.as_bytes()).collect();
    let url = format!("{root}/images?name={q}");
    let resp = session
        .request(Service::Image, Method::GET, &url, &[], None)
        .await?;
    #[derive(Deserialize)]
    struct Body {
        images: Vec<Named>,
    }
    let b: Body = resp.json(Service::Image, &url)?;
    one_named(b.images, "image", name_or_id)
}

/// The network id for `name_or_id` (a UUID is taken as is; otherwise
/// Neutron `GET v2.0/networks?name=` must find exactly one).
pub async fn find_network(session: &Session, name_or_id: &str) -> Result<String, CloudError> {
    if looks_like_uuid(name_or_id) {
        return Ok(name_or_id.to_string());
    }
    let base = session.endpoint(Service::Network).await?;
    let root = if base.ends_with("/v2.0") {
        base
    } else {
        format!("{base}/v2.0")
    };
    let q: String = url::form_urlencoded::byte_serialize(name_or_id.as_bytes()).collect();
    let url = format!("{root}/networks?name={q}");
    let resp = session
        .request(Service::Network, Method::GET, &url, &[], None)
        .await?;
    #[derive(Deserialize)]
    struct Body {
        networks: Vec<Named>,
    }
    let b: Body = resp.json(Service::Network, &url)?;
    one_named(b.networks, "network", name_or_id)
}

#[derive(Deserialize)]
struct Named {
    id: String,
    #[serde(default)]
    name: Option<String>,
}

fn one_named(list: Vec<Named>, what: &str, name: &str) -> Result<String, CloudError> {
    let matching: Vec<Named> = list
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Err(CloudError::Config(format!("no {what} named {name:?}"))),
        _ => Err(CloudError::Config(format!(
            "{} {what}s are named {name:?}; give the id",
            matching.len()
        ))),
    }
}

#[cfg(test)]
mod tests;
