//! Keystone v3: credentials, token, catalog, endpoints.
//!
//! ## Where credentials come from
//! - [`Credentials::from_env`]: the `OS_*` variables an openrc / the seeds'
//!   `auth.env` sets (`OS_AUTH_URL`, `OS_USERNAME`/`OS_USER_ID`,
//!   `OS_PASSWORD`, `OS_PROJECT_NAME` or the v2-era `OS_TENANT_NAME`,
//!   `OS_PROJECT_ID`/`OS_TENANT_ID`, `OS_USER_DOMAIN_NAME`/`_ID`,
//!   `OS_PROJECT_DOMAIN_NAME`/`_ID`, `OS_DOMAIN_NAME`/`_ID` as a fallback for
//!   both, `OS_REGION_NAME`, `OS_INTERFACE`/`OS_ENDPOINT_TYPE`,
//!   `OS_AUTH_TYPE` (`password`, `v3password`, `v3applicationcredential`)
//!   with `OS_APPLICATION_CREDENTIAL_ID`/`_NAME`/`_SECRET`, `OS_CACERT`,
//!   `OS_INSECURE`).
//! - [`Credentials::from_env_file`]: the same variables read from a file of
//!   `export OS_X=value` lines (the seeds' `auth.env`), without a shell.
//! - [`Credentials::from_clouds_yaml`]: `clouds.yaml` (plus `secure.yaml`
//!   beside it), found at an explicit path, `$OS_CLIENT_CONFIG_FILE`,
//!   `./clouds.yaml`, `~/.config/openstack/clouds.yaml`, then
//!   `/etc/openstack/clouds.yaml`.
//!
//! An auth URL without a version gets `/v3`; a v2.0 URL (old openrc files)
//! is rewritten to `/v3` with a warning, since Keystone v2 is gone.
//! Without any domain, the `default` domain id is used, like the CLI does.
//!
//! ## Why not the `openstack_sdk` crate
//! We read `openstack_sdk` 0.22 (it is on our reqwest 0.13). It does not
//! fit: it has no Heat (orchestration) API, which two handlers and the
//! node agent need; its default features pull in interactive prompts,
//! web SSO, OIDC and a wasm plugin host; it persists tokens to `~/.osc`
//! by default; and it probes every endpoint's version document before the
//! first call, which our fake servers would have to mimic with no gain.
//! We need about a dozen calls, so a small client of our own is simpler
//! to audit and test. [`Session`] is what the other modules build on.
//!
//! ## Layout
//! - `credentials`: [`Credentials`] from `OS_*` variables or an `auth.env`
//!   file, and [`CredentialsFrom`], where a configuration takes them from.
//! - `clouds_yaml`: [`Credentials::from_clouds_yaml`] and its search path.
//! - `token`: the token request body, [`Token`] and its catalog.
//! - `session`: [`Session`], what the API clients build on.

mod clouds_yaml;
mod credentials;
mod session;
#[cfg(test)]
mod tests;
mod token;

pub use clouds_yaml::clouds_yaml_search_path;
pub use credentials::{
    AuthMethod, Credentials, CredentialsFrom, DomainRef, Interface, ProjectRef, Secret, UserRef,
    normalize_auth_url, parse_env_file,
};
pub use session::{Session, SessionOptions};
pub use token::{CatalogEntry, Endpoint, Token, token_request_body};
