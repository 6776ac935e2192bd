//! A CloudWatch-compatible `PutMetricData` client: the AWS query API
//! (`POST` of a form body, `Action=PutMetricData&Version=2010-08-01`),
//! signed with Signature Version 4 ([`crate::sigv4`]).
//!
//! Endpoints that speak it: AWS CloudWatch itself, Heat's
//! `heat-api-cloudwatch` (port 8003, path `/v1`, where cfn-push-stats sent
//! its data until Heat removed that API), and moto (what our tests use).
//!
//! As cfn-push-stats did, every datum carries an `AlarmName` dimension per
//! watched alarm (`--watch`): Heat's CloudWatch API routed data to a watch
//! rule by that dimension. With several alarm names, each datum is sent
//! once per name (the OpenShift template had one high and one low alarm on
//! the same `NodeUtilization` figure).

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use gearshift_cloud::Service;
use gearshift_cloud::http::{HttpClient, Method};
use percent_encoding::percent_decode_str;

use crate::credentials::AwsCredentials;
use crate::error::{PushError, bounded};
use crate::http::transport;
use crate::sample::Sample;
use crate::sigv4::{self, Scope, SignableRequest, uri_encode};

/// The query API version of CloudWatch.
pub const API_VERSION: &str = "2010-08-01";
/// CloudWatch's signing name.
pub const SIGNING_SERVICE: &str = "monitoring";
/// Data per request: AWS takes 1000 today, Heat's API and old CloudWatch 20.
pub const DEFAULT_MAX_PER_REQUEST: usize = 20;

const TARGET: &str = "cloudwatch";

/// CloudWatch error codes that mean "slow down, try later" (sent with 400).
const THROTTLING_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "ServiceUnavailable",
    "InternalFailure",
];

/// Error codes that mean the credentials or the signature were refused.
const AUTH_CODES: &[&str] = &[
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "AuthFailure",
    "RequestExpired",
    "SignatureExpired",
];

/// Where and how to send.
#[derive(Debug, Clone)]
pub struct CloudWatchOptions {
    /// Endpoint URL, for example `http://heat.example.com:8003/v1` or
    /// `https://monitoring.us-east-1.amazonaws.com/`.
    pub endpoint: url::Url,
    /// Region in the signature scope.
    pub region: String,
    /// Signing service name (`monitoring`).
    pub service: String,
    /// Namespace (`system/linux` for cfn-push-stats).
    pub namespace: String,
    /// `AlarmName` dimension values (cfn-push-stats' `--watch`).
    pub alarm_names: Vec<String>,
    /// Data per request.
    pub max_per_request: usize,
    /// Whole-request timeout.
    pub timeout: Duration,
}

/// One prepared HTTP request (pure data: what would be sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRequest {
    /// The URL.
    pub url: String,
    /// Headers to send besides `Host` (which the HTTP client sets from the
    /// URL, to the value that was signed).
    pub headers: Vec<(String, String)>,
    /// The form body.
    pub body: String,
}

/// The client.
#[derive(Debug, Clone)]
pub struct CloudWatchClient {
    http: HttpClient,
    opts: CloudWatchOptions,
    creds: AwsCredentials,
}

/// The form parameters of one `PutMetricData` call.
pub fn form_params(
    namespace: &str,
    samples: &[Sample],
    alarm_names: &[String],
    now: DateTime<Utc>,
) -> Vec<(String, String)> {
    let mut p: Vec<(String, String)> = vec![
        ("Action".into(), "PutMetricData".into()),
        ("Version".into(), API_VERSION.into()),
        ("Namespace".into(), namespace.into()),
    ];
    let mut n = 0;
    for s in samples {
        let watches: Vec<Option<&String>> = if alarm_names.is_empty() {
            vec![None]
        } else {
            alarm_names.iter().map(Some).collect()
        };
        for watch in watches {
            n += 1;
            let m = format!("MetricData.member.{n}");
            p.push((format!("{m}.MetricName"), s.name.clone()));
            p.push((format!("{m}.Value"), format_value(s.value)));
            p.push((format!("{m}.Unit"), s.unit.as_str().into()));
            p.push((
                format!("{m}.Timestamp"),
                s.timestamp
                    .unwrap_or(now)
                    .to_rfc3339_opts(SecondsFormat::Millis, true),
            ));
            let mut dims: Vec<(&str, &str)> = s
                .dimensions
                .iter()
                .filter(|(k, _)| watch.is_none() || k.as_str() != "AlarmName")
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if let Some(w) = watch {
                dims.push(("AlarmName", w.as_str()));
            }
            for (i, (k, v)) in dims.iter().enumerate() {
                let d = format!("{m}.Dimensions.member.{}", i + 1);
                p.push((format!("{d}.Name"), k.to_string()));
                p.push((format!("{d}.Value"), v.to_string()));
            }
        }
    }
    p
}

/// Encodes form parameters (RFC 3986 unreserved set, as AWS SDKs do).
pub fn encode_form(params: &[(String, String)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A value as CloudWatch reads it: integers without a fraction, others in
/// Rust's shortest round-trip form (never an exponent).
fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The `Host` header value for `url` (port only when not the scheme's default).
fn host_header(url: &url::Url) -> Result<String, PushError> {
    let host = url
        .host_str()
        .ok_or_else(|| PushError::Config(format!("CloudWatch endpoint {url} has no host")))?;
    Ok(match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    })
}

impl CloudWatchClient {
    /// A client. Checks the options; no network.
    pub fn new(opts: CloudWatchOptions, creds: AwsCredentials) -> Result<Self, PushError> {
        if !matches!(opts.endpoint.scheme(), "http" | "https") {
            return Err(PushError::Config(format!(
                "CloudWatch endpoint {}: scheme must be http or https",
                opts.endpoint
            )));
        }
        host_header(&opts.endpoint)?;
        if opts.namespace.is_empty() || opts.namespace.len() > 255 {
            return Err(PushError::Config(
                "namespace must have 1 to 255 bytes".into(),
            ));
        }
        if opts.region.is_empty() || opts.service.is_empty() {
            return Err(PushError::Config("region and service must be set".into()));
        }
        if opts.max_per_request == 0 {
            return Err(PushError::Config(
                "max_per_request must be at least 1".into(),
            ));
        }
        let http = crate::http::client(opts.timeout, None, false)?;
        Ok(CloudWatchClient { http, opts, creds })
    }

    /// The options.
    pub fn options(&self) -> &CloudWatchOptions {
        &self.opts
    }

    /// Builds and signs the requests for `samples` at time `now` (pure:
    /// used by `--dry-run` and by the tests).
    pub fn prepare(
        &self,
        samples: &[Sample],
        now: DateTime<Utc>,
    ) -> Result<Vec<PreparedRequest>, PushError> {
        for s in samples {
            s.validate()?;
        }
        for a in &self.opts.alarm_names {
            crate::sample::check_dimension_value("AlarmName", a).map_err(PushError::Config)?;
        }
        let per_sample = self.opts.alarm_names.len().max(1);
        let chunk = (self.opts.max_per_request / per_sample).max(1);
        let host = host_header(&self.opts.endpoint)?;
        let raw_path = percent_decode_str(self.opts.endpoint.path())
            .decode_utf8_lossy()
            .to_string();
        let query: Vec<(String, String)> = self
            .opts
            .endpoint
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let mut out = Vec::new();
        for batch in samples.chunks(chunk) {
            let body = encode_form(&form_params(
                &self.opts.namespace,
                batch,
                &self.opts.alarm_names,
                now,
            ));
            let content_type = "application/x-www-form-urlencoded; charset=utf-8".to_string();
            let date = sigv4::amz_date(now);
            let to_sign = vec![
                ("content-type".to_string(), content_type.clone()),
                ("host".to_string(), host.clone()),
                ("x-amz-date".to_string(), date.clone()),
            ];
            let signed = sigv4::sign(
                &self.creds,
                &Scope {
                    region: &self.opts.region,
                    service: &self.opts.service,
                    time: now,
                },
                &SignableRequest {
                    method: "POST",
                    path: &raw_path,
                    query: &query,
                    headers: &to_sign,
                    body: body.as_bytes(),
                },
            );
            out.push(PreparedRequest {
                url: self.opts.endpoint.to_string(),
                headers: vec![
                    ("Content-Type".into(), content_type),
                    ("X-Amz-Date".into(), date),
                    ("Authorization".into(), signed.authorization),
                ],
                body,
            });
        }
        Ok(out)
    }

    /// Sends `samples` (in as many requests as `max_per_request` needs).
    /// Stops at the first failure: the caller retries the whole batch,
    /// which CloudWatch tolerates (a datum sent twice with the same
    /// timestamp only adds to the sample count).
    pub async fn put_metric_data(&self, samples: &[Sample]) -> Result<(), PushError> {
        for req in self.prepare(samples, Utc::now())? {
            self.send(req).await?;
        }
        Ok(())
    }

    async fn send(&self, req: PreparedRequest) -> Result<(), PushError> {
        let headers: Vec<(&str, &str)> = req
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let resp = self
            .http
            .send_bytes(
                Service::CloudWatch,
                Method::POST,
                &req.url,
                &headers,
                req.body.into_bytes(),
            )
            .await
            .map_err(|e| transport(TARGET, e))?;
        if resp.status.is_success() {
            return Ok(());
        }
        Err(classify(
            resp.status.as_u16(),
            &String::from_utf8_lossy(&resp.body),
        ))
    }
}

/// Turns an error answer into a [`PushError::Api`], reading the documented
/// `<ErrorResponse><Error><Code>…</Code><Message>…</Message>` body (or the
/// JSON protocol's `__type` / `message`).
pub fn classify(status: u16, body: &str) -> PushError {
    let (code, message) = match xml_field(body, "Code") {
        Some(code) => (Some(code), xml_field(body, "Message").unwrap_or_default()),
        None => match serde_json::from_str::<serde_json::Value>(body) {
            Ok(v) => (
                v.get("__type")
                    .and_then(|t| t.as_str())
                    .map(|t| t.rsplit('#').next().unwrap_or(t).to_string()),
                v.get("message")
                    .or_else(|| v.get("Message"))
                    .and_then(|m| m.as_str())
                    .unwrap_or_default()
                    .to_string(),
            ),
            Err(_) => (None, body.to_string()),
        },
    };
    let code_is = |list: &[&str]| code.as_deref().is_some_and(|c| list.contains(&c));
    let auth = status == 401 || status == 403 || code_is(AUTH_CODES);
    let retryable =
        !auth && (status >= 500 || status == 429 || status == 408 || code_is(THROTTLING_CODES));
    PushError::Api {
        target: TARGET,
        status,
        code,
        message: bounded(&xml_unescape(&message)),
        retryable,
        auth,
    }
}

/// The text of the first `<name>…</name>` element, if any.
fn xml_field(body: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&close)? + start;
    Some(body[start..end].trim().to_string())
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::SecretString;
    use crate::sample::Unit;
    use chrono::TimeZone;

    fn client(alarms: &[&str], max: usize) -> CloudWatchClient {
        CloudWatchClient::new(
            CloudWatchOptions {
                endpoint: url::Url::parse("http://heat.example.com:8003/v1").unwrap(),
                region: "RegionOne".into(),
                service: SIGNING_SERVICE.into(),
                namespace: "system/linux".into(),
                alarm_names: alarms.iter().map(|s| s.to_string()).collect(),
                max_per_request: max,
                timeout: Duration::from_secs(5),
            },
            AwsCredentials {
                access_key_id: "AKID".into(),
                secret_access_key: SecretString::new("secret"),
            },
        )
        .unwrap()
    }

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 5, 6, 7, 8, 9).unwrap()
    }

    #[test]
    fn heartbeat_body_is_what_cfn_push_stats_sent() {
        let reqs = client(&["stack-NodeScaleUp-x1"], 20)
            .prepare(&[Sample::heartbeat(Unit::COUNTER)], t0())
            .unwrap();
        assert_eq!(reqs.len(), 1);
        assert_eq!(
            reqs[0].body,
            "Action=PutMetricData&Version=2010-08-01&Namespace=system%2Flinux\
             &MetricData.member.1.MetricName=Heartbeat&MetricData.member.1.Value=1\
             &MetricData.member.1.Unit=Counter\
             &MetricData.member.1.Timestamp=2024-05-06T07%3A08%3A09.000Z\
             &MetricData.member.1.Dimensions.member.1.Name=AlarmName\
             &MetricData.member.1.Dimensions.member.1.Value=stack-NodeScaleUp-x1"
        );
        let auth = &reqs[0]
            .headers
            .iter()
            .find(|(k, _)| k == "Authorization")
            .unwrap()
            .1;
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKID/20240506/RegionOne/monitoring/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature="
            ),
            "{auth}"
        );
        assert_eq!(reqs[0].url, "http://heat.example.com:8003/v1");
    }

    #[test]
    fn dimensions_values_and_alarm_fanout() {
        let s = Sample::new("NodeUtilization", 42.5, Unit::PERCENT)
            .with_dimension("AutoScalingGroupName", "asg 1")
            .with_dimension("InstanceId", "i-1");
        let reqs = client(&["High", "Low"], 20).prepare(&[s], t0()).unwrap();
        let body = &reqs[0].body;
        assert!(body.contains("MetricData.member.1.Value=42.5"));
        assert!(body.contains("MetricData.member.1.Dimensions.member.1.Name=AutoScalingGroupName"));
        assert!(body.contains("MetricData.member.1.Dimensions.member.1.Value=asg%201"));
        assert!(body.contains("MetricData.member.1.Dimensions.member.3.Value=High"));
        assert!(body.contains("MetricData.member.2.Dimensions.member.3.Value=Low"));
        assert!(!body.contains("member.3.MetricName"));
    }

    #[test]
    fn chunks_and_validation() {
        let samples: Vec<Sample> = (0..45)
            .map(|i| Sample::new(format!("M{i}"), i as f64, Unit::COUNT))
            .collect();
        let reqs = client(&[], 20).prepare(&samples, t0()).unwrap();
        assert_eq!(reqs.len(), 3);
        assert!(reqs[2].body.contains("MetricData.member.5.MetricName=M44"));
        // two alarm names: 10 samples per request make 20 data
        assert_eq!(
            client(&["a", "b"], 20)
                .prepare(&samples, t0())
                .unwrap()
                .len(),
            5
        );
        let e = client(&[], 20)
            .prepare(&[Sample::new("X", f64::NAN, Unit::COUNT)], t0())
            .unwrap_err();
        assert!(matches!(e, PushError::InvalidSample { .. }));
    }

    #[test]
    fn values() {
        assert_eq!(format_value(1.0), "1");
        assert_eq!(format_value(-3.0), "-3");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(1e20), "100000000000000000000");
    }

    #[test]
    fn error_classification() {
        let xml = r#"<ErrorResponse xmlns="http://monitoring.amazonaws.com/doc/2010-08-01/"><Error><Type>Sender</Type><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match &amp; so on</Message></Error><RequestId>r</RequestId></ErrorResponse>"#;
        let e = classify(403, xml);
        assert!(e.is_auth() && !e.is_retryable(), "{e}");
        assert!(e.to_string().contains("SignatureDoesNotMatch"));
        assert!(e.to_string().contains("match & so on"));
        let e = classify(
            400,
            "<ErrorResponse><Error><Code>Throttling</Code><Message>Rate exceeded</Message></Error></ErrorResponse>",
        );
        assert!(e.is_retryable() && !e.is_auth());
        let e = classify(
            400,
            "<ErrorResponse><Error><Code>InvalidParameterValue</Code><Message>bad</Message></Error></ErrorResponse>",
        );
        assert!(!e.is_retryable());
        assert!(classify(503, "busy").is_retryable());
        let e = classify(
            400,
            r#"{"__type":"com.amazonaws#ThrottlingException","message":"slow"}"#,
        );
        assert!(e.is_retryable());
    }

    #[test]
    fn bad_options() {
        let mut o = client(&[], 20).opts.clone();
        o.endpoint = url::Url::parse("ftp://x/").unwrap();
        let creds = AwsCredentials::new("a", "b").unwrap();
        assert!(CloudWatchClient::new(o.clone(), creds.clone()).is_err());
        o.endpoint = url::Url::parse("http://x/").unwrap();
        o.max_per_request = 0;
        assert!(CloudWatchClient::new(o, creds).is_err());
    }
}
