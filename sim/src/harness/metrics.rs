//! What the benchmark reads of the broker agent and of the machine: the
//! Prometheus text of `/metrics` over plain HTTP, histogram quantiles, and
//! the machine's CPU, memory and load.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The machine the figures were measured on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// `nproc`.
    pub nproc: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu: String,
    /// MemTotal in GiB.
    pub mem_gib: f64,
    /// 1-minute load average when the run started.
    pub load_1m: f64,
}

impl Machine {
    /// Reads /proc.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let load_1m = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0.0);
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            mem_gib: (mem_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            load_1m,
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound and released: a tiny race, fine here).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The Prometheus text of `http://127.0.0.1:<port>/metrics`.
pub async fn scrape(port: u16) -> anyhow::Result<Metrics> {
    Ok(Metrics::parse(&http_get(port, "/metrics").await?))
}

/// The body of `GET http://127.0.0.1:<port><path>` (HTTP/1.0, 16 MiB at
/// most, 5 s at most).
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.take(16 * 1024 * 1024).read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .with_context(|| format!("{path} did not answer within 5 s"))??;
    let text = String::from_utf8_lossy(&buf);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .context("no HTTP body")?;
    Ok(body.to_string())
}

/// Parsed Prometheus samples: name with labels -> value.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Every sample.
    pub samples: BTreeMap<String, f64>,
}

impl Metrics {
    /// Parses the text format (comments skipped).
    pub fn parse(text: &str) -> Metrics {
        let mut samples = BTreeMap::new();
        for l in text.lines() {
            if l.starts_with('#') || l.trim().is_empty() {
                continue;
            }
            if let Some((k, v)) = l.rsplit_once(' ')
                && let Ok(v) = v.parse::<f64>()
            {
                samples.insert(k.to_string(), v);
            }
        }
        Metrics { samples }
    }

    /// One sample, 0 when absent.
    pub fn get(&self, name: &str) -> f64 {
        self.samples.get(name).copied().unwrap_or(0.0)
    }

    /// Sum of every sample whose name (before labels) is `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name))
            .map(|(_, v)| v)
            .sum()
    }

    /// Cumulative histogram buckets of `name` (`<name>_bucket{le=...}`), by bound.
    pub fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut v: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter_map(|(k, c)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *c))
            })
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

/// The `q` quantile of the observations between two scrapes of a
/// histogram, as the upper bound of the bucket that holds it (a bound the
/// true value does not exceed). `None` without observations.
pub fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let old: BTreeMap<u64, f64> = before.iter().map(|(le, c)| (le.to_bits(), *c)).collect();
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| (*le, c - old.get(&le.to_bits()).copied().unwrap_or(0.0)))
        .collect();
    let total = diff.last().map(|x| x.1)?;
    if total <= 0.0 {
        return None;
    }
    let rank = (q * total).ceil().max(1.0);
    diff.iter().find(|(_, c)| *c >= rank).map(|(le, _)| *le)
}

/// Exact quantile of samples (nearest rank).
pub fn quantile(samples: &mut [f64], q: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    Some(samples[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_text_and_histogram_quantiles() {
        let before = Metrics::parse(
            "# HELP x\ngearshift_broker_reports_total 10\n\
             lat_bucket{le=\"0.01\"} 1\nlat_bucket{le=\"0.05\"} 1\nlat_bucket{le=\"+Inf\"} 1\n",
        );
        let after = Metrics::parse(
            "gearshift_broker_reports_total 110\n\
             lat_bucket{le=\"0.01\"} 90\nlat_bucket{le=\"0.05\"} 100\nlat_bucket{le=\"+Inf\"} 101\n",
        );
        assert_eq!(after.get("gearshift_broker_reports_total"), 110.0);
        let (b, a) = (before.buckets("lat"), after.buckets("lat"));
        assert_eq!(a.len(), 3);
        // 100 new observations: 89 <= 10 ms, 10 in (10, 50] ms, 1 above.
        assert_eq!(bucket_quantile(&b, &a, 0.5), Some(0.01));
        assert_eq!(bucket_quantile(&b, &a, 0.95), Some(0.05));
        assert_eq!(bucket_quantile(&b, &a, 1.0), Some(f64::INFINITY));
        assert_eq!(bucket_quantile(&a, &a, 0.5), None);
        let mut s = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&mut s, 0.5), Some(3.0));
        assert_eq!(quantile(&mut s, 0.99), Some(5.0));
    }
}
