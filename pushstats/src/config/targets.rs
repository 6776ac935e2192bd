//! `[push_stats.cloudwatch]` and `[push_stats.gnocchi]`: the two targets,
//! and the clients built from them.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::PushStatsConfig;
use crate::cloudwatch::{
    CloudWatchClient, CloudWatchOptions, DEFAULT_MAX_PER_REQUEST, SIGNING_SERVICE,
};
use crate::credentials::{AwsCredentials, CredentialSource, DEFAULT_CFN_CREDENTIALS, SecretString};
use crate::error::PushError;
use crate::gnocchi::{GnocchiClient, GnocchiOptions};
use crate::pusher::Sink;

/// `[push_stats.cloudwatch]`: a CloudWatch-compatible `PutMetricData` endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudWatchConfig {
    /// Endpoint URL: Heat's `http://<heat host>:8003/v1`, AWS's
    /// `https://monitoring.<region>.amazonaws.com/`. Required.
    pub endpoint: String,
    /// Region in the signature scope. Default `"us-east-1"` (Heat accepts any).
    pub region: String,
    /// Namespace. Default `"system/linux"` (cfn-push-stats').
    pub namespace: String,
    /// A cfn-credentials file (`AWSAccessKeyId=`, `AWSSecretKey=`), used
    /// unless both keys below are set. Default `"/etc/cfn/cfn-credentials"`.
    pub credential_file: PathBuf,
    /// Access key id, instead of the file. Default none.
    pub access_key_id: Option<String>,
    /// Secret key, instead of the file. Default none.
    pub secret_access_key: Option<SecretString>,
    /// `AlarmName` dimension values (cfn-push-stats' `--watch`): each datum
    /// is sent once per name. Default none.
    pub alarm_names: Vec<String>,
    /// Data per request. Default `20` (Heat's and old CloudWatch's limit).
    pub max_per_request: usize,
    /// Signing service name. Default `"monitoring"`.
    pub service: String,
}

impl Default for CloudWatchConfig {
    fn default() -> Self {
        CloudWatchConfig {
            endpoint: String::new(),
            region: "us-east-1".into(),
            namespace: "system/linux".into(),
            credential_file: PathBuf::from(DEFAULT_CFN_CREDENTIALS),
            access_key_id: None,
            secret_access_key: None,
            alarm_names: Vec::new(),
            max_per_request: DEFAULT_MAX_PER_REQUEST,
            service: SIGNING_SERVICE.into(),
        }
    }
}

impl CloudWatchConfig {
    /// Where the credentials come from.
    pub fn credential_source(&self) -> Result<CredentialSource, PushError> {
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) => Ok(CredentialSource::Explicit(AwsCredentials::new(
                id,
                secret.expose(),
            )?)),
            (None, None) => Ok(CredentialSource::File(self.credential_file.clone())),
            _ => Err(PushError::Config(
                "access_key_id and secret_access_key go together".into(),
            )),
        }
    }
}

/// `[push_stats.gnocchi]`: Gnocchi measures with a Keystone token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GnocchiConfig {
    /// Gnocchi's base URL (without `/v1`). Default none: the catalog's
    /// `metric` endpoint.
    pub endpoint: Option<String>,
    /// Cloud name in `clouds.yaml`. Default none (then `auth_env_file`,
    /// then the process's `OS_*` variables).
    pub cloud: Option<String>,
    /// `clouds.yaml` path (with `cloud`). Default: the standard search path.
    pub clouds_yaml: Option<PathBuf>,
    /// A file of `export OS_X=value` lines (the seeds' `auth.env`). Default none.
    pub auth_env_file: Option<PathBuf>,
    /// The resource of node samples: the node's Nova server id, so that an
    /// Aodh alarm can aggregate the group's servers by `server_group`.
    /// Default none: the node agent uses its node name.
    pub resource_id: Option<String>,
    /// Type of resources created when missing. Default `"generic"`.
    pub resource_type: String,
    /// Archive policy of metrics created when missing. Default none
    /// (Gnocchi's archive policy rules decide).
    pub archive_policy: Option<String>,
    /// Create a missing metric or resource on 404. Default `true`.
    pub create_missing: bool,
    /// Prefix of metric names. Default `"gearshift."`.
    pub metric_prefix: String,
}

impl Default for GnocchiConfig {
    fn default() -> Self {
        GnocchiConfig {
            endpoint: None,
            cloud: None,
            clouds_yaml: None,
            auth_env_file: None,
            resource_id: None,
            resource_type: "generic".into(),
            archive_policy: None,
            create_missing: true,
            metric_prefix: "gearshift.".into(),
        }
    }
}

impl GnocchiConfig {
    /// Keystone credentials: `cloud` in clouds.yaml, else `auth_env_file`,
    /// else the process's `OS_*` variables.
    pub fn credentials(&self) -> Result<gearshift_cloud::Credentials, PushError> {
        gearshift_cloud::Credentials::load(gearshift_cloud::CredentialsFrom::first_of(
            self.cloud.as_deref(),
            self.clouds_yaml.as_deref(),
            self.auth_env_file.as_deref(),
        ))
        .map_err(|e| PushError::Config(format!("gnocchi credentials: {e}")))
    }
}

impl PushStatsConfig {
    /// Builds the targets (reads credentials files; no network).
    /// `default_resource` is the Gnocchi resource of samples that name none
    /// when `gnocchi.resource_id` is not set (the node agent passes its name).
    pub fn build_sinks(
        &self,
        default_resource: Option<&str>,
    ) -> Result<Vec<Arc<dyn Sink>>, PushError> {
        let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
        if let Some(cw) = &self.cloudwatch {
            let endpoint = url::Url::parse(&cw.endpoint)
                .map_err(|e| PushError::Config(format!("cloudwatch.endpoint: {e}")))?;
            let creds = cw.credential_source()?.load()?;
            sinks.push(Arc::new(CloudWatchClient::new(
                CloudWatchOptions {
                    endpoint,
                    region: cw.region.clone(),
                    service: cw.service.clone(),
                    namespace: cw.namespace.clone(),
                    alarm_names: cw.alarm_names.clone(),
                    max_per_request: cw.max_per_request,
                    timeout: self.timeout,
                },
                creds,
            )?));
        }
        if let Some(g) = &self.gnocchi {
            let session = gearshift_cloud::Session::new(
                g.credentials()?,
                gearshift_cloud::SessionOptions::default(),
            )?;
            sinks.push(Arc::new(GnocchiClient::new(
                session,
                self.gnocchi_options(g, default_resource),
            )?));
        }
        Ok(sinks)
    }

    pub(crate) fn gnocchi_options(
        &self,
        g: &GnocchiConfig,
        default_resource: Option<&str>,
    ) -> GnocchiOptions {
        GnocchiOptions {
            endpoint: g.endpoint.clone(),
            default_resource: g
                .resource_id
                .clone()
                .or_else(|| default_resource.map(str::to_string)),
            resource_type: g.resource_type.clone(),
            archive_policy: g.archive_policy.clone(),
            create_missing: g.create_missing,
            metric_prefix: g.metric_prefix.clone(),
            timeout: self.timeout,
        }
    }
}
