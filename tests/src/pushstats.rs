//! moto's server mode as a real, independent CloudWatch for the push-stats
//! tests: started on a free loopback port, with IAM authentication turned
//! on (so a request whose SigV4 signature does not match is refused with
//! `SignatureDoesNotMatch`, checked by botocore's own signer inside moto),
//! and read back through boto3 from the same virtualenv.
//!
//! moto enforces signatures only once `INITIAL_NO_AUTH_ACTION_COUNT`
//! requests have been served without them; [`Moto::start`] creates an IAM
//! user with a policy allowing CloudWatch and an access key, then sets that
//! count to 0 through `POST /moto-api/reset-auth`, so every later request
//! (ours and the reader's) must be signed with that key.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

/// How long moto may take to start (it imports a lot).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates the user, its policy and access key, then turns auth on.
const SETUP: &str = r#"
import boto3, json, sys, urllib.request
ep = sys.argv[1]
iam = boto3.client("iam", endpoint_url=ep, region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="gearshift")
iam.put_user_policy(UserName="gearshift", PolicyName="cloudwatch", PolicyDocument=json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["cloudwatch:*", "monitoring:*"], "Resource": "*"}]}))
key = iam.create_access_key(UserName="gearshift")["AccessKey"]
req = urllib.request.Request(ep + "/moto-api/reset-auth", data=b"0", method="POST",
                             headers={"Content-Type": "text/plain"})
urllib.request.urlopen(req, timeout=10).read()
print(json.dumps({"access_key_id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))
"#;

/// Reads metrics back with boto3: ListMetrics for a namespace, and
/// GetMetricStatistics for each requested (name, dimensions).
const READ: &str = r#"
import boto3, json, sys, datetime
ep, key, secret, namespace = sys.argv[1:5]
queries = json.loads(sys.argv[5])
cw = boto3.client("cloudwatch", endpoint_url=ep, region_name="us-east-1",
                  aws_access_key_id=key, aws_secret_access_key=secret)
metrics = []
for page in cw.get_paginator("list_metrics").paginate(Namespace=namespace):
    metrics.extend(page["Metrics"])
now = datetime.datetime.now(datetime.timezone.utc)
stats = []
for q in queries:
    r = cw.get_metric_statistics(
        Namespace=namespace, MetricName=q["name"],
        Dimensions=[{"Name": k, "Value": v} for k, v in sorted(q["dimensions"].items())],
        StartTime=now - datetime.timedelta(hours=1), EndTime=now + datetime.timedelta(hours=1),
        Period=7200, Statistics=["SampleCount", "Sum", "Maximum", "Minimum"])
    stats.append([{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in d.items()}
                  for d in r["Datapoints"]])
print(json.dumps({"metrics": metrics, "stats": stats}))
"#;

/// A running moto server with CloudWatch and IAM auth on.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT/`.
    pub endpoint: String,
    /// The access key moto knows.
    pub access_key_id: String,
    /// Its secret.
    pub secret: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        // Our own child, by its handle; kill_on_drop is the backstop.
        let _ = self.child.start_kill();
    }
}

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

async fn python_json(args: &[&str], what: &str) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(crate::python())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: python did not finish within 60 s"))
    .unwrap_or_else(|e| panic!("{what}: cannot run python: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

impl Moto {
    /// Starts `python -m moto.server` on a free port and sets it up.
    /// Fails the test if moto is missing (run scripts/test-deps) or does
    /// not answer within a minute.
    pub async fn start() -> Moto {
        let port = free_port();
        let mut child = Command::new(crate::python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start moto (python -m moto.server); run scripts/test-deps");
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        gearshift_cloud::http::install_tls_provider();
        let http = reqwest::Client::new();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "moto exited at start ({status}); is moto[server] installed? run scripts/test-deps"
                );
            }
            let up = http
                .get(format!("{endpoint}/moto-api/"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok();
            if up {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "moto did not answer on {endpoint} within {START_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let keys = python_json(&["-c", SETUP, &endpoint], "moto IAM setup").await;
        Moto {
            child,
            endpoint: format!("{endpoint}/"),
            access_key_id: keys["access_key_id"].as_str().expect("key id").to_string(),
            secret: keys["secret"].as_str().expect("secret").to_string(),
        }
    }

    /// Reads `namespace` back through boto3: `(metrics, stats)` where
    /// `metrics` is ListMetrics' list and `stats[i]` the GetMetricStatistics
    /// datapoints of `queries[i]` = (name, dimensions).
    pub async fn read(
        &self,
        namespace: &str,
        queries: &[(&str, &[(&str, &str)])],
    ) -> (Vec<Value>, Vec<Vec<Value>>) {
        let q: Vec<Value> = queries
            .iter()
            .map(|(name, dims)| {
                serde_json::json!({
                    "name": name,
                    "dimensions": dims.iter().map(|(k, v)| (k.to_string(), Value::from(*v)))
                        .collect::<serde_json::Map<String, Value>>(),
                })
            })
            .collect();
        let q = serde_json::to_string(&q).expect("queries");
        let v = python_json(
            &[
                "-c",
                READ,
                self.endpoint.trim_end_matches('/'),
                &self.access_key_id,
                &self.secret,
                namespace,
                &q,
            ],
            "boto3 read-back",
        )
        .await;
        let metrics = v["metrics"].as_array().cloned().unwrap_or_default();
        let stats = v["stats"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| d.as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        (metrics, stats)
    }
}

/// The dimensions of a ListMetrics entry as sorted (name, value) pairs.
pub fn dims_of(metric: &Value) -> Vec<(String, String)> {
    let mut d: Vec<(String, String)> = metric["Dimensions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["Name"].as_str().unwrap_or_default().to_string(),
                        x["Value"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    d.sort();
    d
}
