//! # gearshift-cloud: the OpenStack API clients
//!
//! Small async clients for the few OpenStack calls gearshift makes, shared
//! by the broker agent's handlers (Nova, Cinder, Heat, Magnum) and the node
//! agent's Heat signaller. Every call goes through one [`Session`] (a
//! Keystone v3 token kept fresh, the service catalog, a 401 retry), reads
//! bounded bodies, and fails with one typed [`CloudError`] whose
//! `is_retryable()` / `is_quota()` / `is_busy()` drive the callers' decisions.
//!
//! ## Layout
//! - [`auth`]: credentials from `OS_*` variables, `auth.env` files and
//!   `clouds.yaml` (and [`CredentialsFrom`], where a configuration takes
//!   them from); the [`Session`] (token, catalog, endpoints, requests).
//! - [`http`]: the HTTP client (TLS options, timeouts, bounded bodies) and
//!   the reading of each API's documented error body.
//! - [`error`]: [`CloudError`] and the per-API quota phrase checks.
//! - [`heat`]: stacks, resources, mark-unhealthy, signals and pre-signed
//!   alarm URLs: the one Heat client, used by the broker agent's `heat`
//!   handler and by the node agent's Heat signals.
//! - [`nova`]: servers, limits (quota pre-flight), flavors, volume
//!   attachments; image and network look-ups by name.
//! - [`cinder`]: Cinder volumes.
//! - [`magnum`]: clusters, node groups, resize.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod cinder;
pub mod error;
pub mod heat;
pub mod http;
pub mod magnum;
pub mod nova;

pub use auth::{Credentials, CredentialsFrom, Session, SessionOptions};
pub use error::{CloudError, Service};
