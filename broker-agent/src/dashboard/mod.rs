//! The dashboard: one page served on the agent's HTTP listener next to
//! `/metrics` (`metrics.listen` in `broker.toml`). It shows the fleet by
//! district and profile with usage, the operations in flight with their
//! evacuation progress, the recent decisions and each group's latest
//! explanation, the exhausted groups, paused groups and cordoned nodes, and
//! the last day of the durable history (read from the state directory every
//! few seconds); it refreshes itself every second.
//!
//! The page is self-contained: its HTML, CSS and JavaScript are embedded in
//! the binary (no CDN, no external font), and a Content-Security-Policy
//! keeps it to its own origin. The JavaScript builds the page with
//! `textContent` only, so names and reasons coming from the bus are never
//! interpreted as markup.
//!
//! Routes:
//! - `GET /` (and `/dashboard`): the page;
//! - `GET /dashboard.css`, `GET /dashboard.js`: its style and script;
//! - `GET /api/dashboard`: everything the page shows, as one JSON
//!   [`Snapshot`] (also handy for `curl`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use chrono::{DateTime, Utc};
use gearshift_proto::msg::{Decision, Explanation};
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::{Agent, Observed, VERSION};
use crate::status::Status;

const INDEX_HTML: &str = include_str!("index.html");
const DASHBOARD_CSS: &str = include_str!("dashboard.css");
const DASHBOARD_JS: &str = include_str!("dashboard.js");

/// Decisions kept for the page.
pub const RECENT_DECISIONS: usize = 100;

/// History records shown: the newest of the last day, at most this many.
pub const HISTORY_SHOWN: usize = 300;

/// How often the history files are read again.
const HISTORY_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// One decision with the time the dashboard saw it.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionEntry {
    /// When it was published.
    pub at: DateTime<Utc>,
    /// The decision.
    pub decision: Decision,
}

/// A group the cloud has no capacity for.
#[derive(Debug, Clone, Serialize)]
pub struct ExhaustedGroup {
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// Since when and what the cloud said.
    pub detail: String,
}

/// Everything the page shows.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// The agent's name.
    pub agent: String,
    /// The agent's version.
    pub version: &'static str,
    /// When this snapshot was taken.
    pub at: DateTime<Utc>,
    /// When the dashboard started.
    pub since: DateTime<Utc>,
    /// The broker agent's status (fleet, groups, nodes, operations).
    pub status: Status,
    /// Recent decisions, newest first.
    pub decisions: Vec<DecisionEntry>,
    /// The latest explanation of each group.
    pub explanations: Vec<Explanation>,
    /// Exhausted groups.
    pub exhausted: Vec<ExhaustedGroup>,
    /// The last day of the history, newest first (saga steps, decisions,
    /// changed explanations, operator requests).
    pub history: Vec<crate::history::Record>,
}

struct Shared {
    agent: String,
    since: DateTime<Utc>,
    status: watch::Receiver<Arc<Status>>,
    decisions: Mutex<VecDeque<DecisionEntry>>,
    explanations: Mutex<BTreeMap<(String, String), Explanation>>,
    history: Mutex<Vec<crate::history::Record>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The dashboard of one broker agent: collects decisions and explanations
/// as they are published and serves the page.
#[derive(Clone)]
pub struct Dashboard {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("agent", &self.shared.agent)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// Watches `agent` (call before [`Agent::run`]) and its history until
    /// `token` is cancelled.
    pub fn spawn(agent: &Agent, name: impl Into<String>, token: CancellationToken) -> Dashboard {
        let d = Dashboard::from_parts(
            agent.status(),
            agent.observe(),
            name,
            token.clone(),
            &agent.tracker(),
        );
        d.follow_history(agent.state_dir().to_path_buf(), token, &agent.tracker());
        d
    }

    /// Reads the last day of the history in `dir` every few seconds, on a
    /// blocking thread, until `token` is cancelled.
    pub fn follow_history(
        &self,
        dir: std::path::PathBuf,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) {
        let s = self.shared.clone();
        tracker.spawn(async move {
            loop {
                let dir = dir.clone();
                let read = tokio::task::spawn_blocking(move || {
                    let filter = crate::history::Filter {
                        since: Some(Utc::now() - chrono::Duration::days(1)),
                        group: None,
                        limit: Some(HISTORY_SHOWN),
                    };
                    crate::history::read(&dir, &filter)
                })
                .await;
                if let Ok(Ok(mut records)) = read {
                    records.reverse();
                    *lock(&s.history) = records;
                }
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(HISTORY_REFRESH) => {}
                }
            }
        });
    }

    /// Watches a status channel and a decision stream until `token` is
    /// cancelled, on a task of `tracker`.
    pub fn from_parts(
        status: watch::Receiver<Arc<Status>>,
        mut observed: broadcast::Receiver<Observed>,
        name: impl Into<String>,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Dashboard {
        let shared = Arc::new(Shared {
            agent: name.into(),
            since: Utc::now(),
            status,
            decisions: Mutex::new(VecDeque::with_capacity(RECENT_DECISIONS)),
            explanations: Mutex::default(),
            history: Mutex::default(),
        });
        let s = shared.clone();
        tracker.spawn(async move {
            loop {
                let o = tokio::select! {
                    _ = token.cancelled() => return,
                    o = observed.recv() => o,
                };
                match o {
                    Ok(Observed::Decision(d)) => {
                        let mut q = lock(&s.decisions);
                        if q.len() == RECENT_DECISIONS {
                            q.pop_back();
                        }
                        q.push_front(DecisionEntry {
                            at: Utc::now(),
                            decision: d,
                        });
                    }
                    Ok(Observed::Explanation(x)) => {
                        lock(&s.explanations).insert((x.district.clone(), x.profile.clone()), x);
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::debug!(missed = n, "dashboard fell behind the decisions");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Dashboard { shared }
    }

    /// What the page shows, now.
    pub fn snapshot(&self) -> Snapshot {
        let status: Status = (**self.shared.status.borrow()).clone();
        let exhausted = status
            .groups
            .iter()
            .filter_map(|g| {
                g.exhausted.as_ref().map(|e| ExhaustedGroup {
                    district: g.district.clone(),
                    profile: g.profile.clone(),
                    detail: e.clone(),
                })
            })
            .collect();
        Snapshot {
            agent: self.shared.agent.clone(),
            version: VERSION,
            at: Utc::now(),
            since: self.shared.since,
            decisions: lock(&self.shared.decisions).iter().cloned().collect(),
            explanations: lock(&self.shared.explanations).values().cloned().collect(),
            exhausted,
            history: lock(&self.shared.history).clone(),
            status,
        }
    }

    /// The page's routes, to merge with the metrics router.
    pub fn router(&self) -> Router {
        let d = self.clone();
        let page = || async {
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-cache"),
                    (
                        header::CONTENT_SECURITY_POLICY,
                        "default-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'",
                    ),
                ],
                INDEX_HTML,
            )
        };
        Router::new()
            .route("/", get(page))
            .route("/dashboard", get(page))
            .route(
                "/dashboard.css",
                get(|| async {
                    (
                        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
                        DASHBOARD_CSS,
                    )
                }),
            )
            .route(
                "/dashboard.js",
                get(|| async {
                    (
                        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                        DASHBOARD_JS,
                    )
                }),
            )
            .route(
                "/api/dashboard",
                get(move || {
                    let d = d.clone();
                    async move {
                        (
                            [(header::CACHE_CONTROL, "no-store")],
                            axum::Json(d.snapshot()),
                        )
                            .into_response()
                    }
                }),
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_proto::msg::{DecisionKind, GroupStats, Outcome};

    fn decision(i: usize) -> Decision {
        Decision {
            decision: DecisionKind::ScaleUp,
            district: "d".into(),
            profile: "small".into(),
            op: Some(format!("op-{i}")),
            node: None,
            reason: "because".into(),
            handler: None,
            stats: None,
            dry_run: false,
            epoch: 0,
        }
    }

    #[tokio::test]
    async fn keeps_recent_decisions_and_the_latest_explanation_per_group() {
        let (_stx, srx) = watch::channel(Arc::new(Status::default()));
        let (otx, orx) = broadcast::channel(1024);
        let token = CancellationToken::new();
        let d = Dashboard::from_parts(srx, orx, "b", token.clone(), &TaskTracker::new());
        for i in 0..RECENT_DECISIONS + 5 {
            otx.send(Observed::Decision(decision(i))).unwrap();
        }
        for s in ["first", "second"] {
            otx.send(Observed::Explanation(Explanation {
                district: "d".into(),
                profile: "small".into(),
                evaluated_at: Utc::now(),
                outcome: Outcome::None,
                summary: s.into(),
                reasons: vec![],
                stats: GroupStats::default(),
                ops_in_flight: vec![],
            }))
            .unwrap();
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = d.snapshot();
            if s.explanations
                .first()
                .is_some_and(|x| x.summary == "second")
            {
                assert_eq!(s.decisions.len(), RECENT_DECISIONS);
                let newest = format!("op-{}", RECENT_DECISIONS + 4);
                assert_eq!(s.decisions[0].decision.op.as_deref(), Some(newest.as_str()));
                assert_eq!(s.explanations.len(), 1);
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "collector too slow");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        token.cancel();
    }

    #[tokio::test]
    async fn shows_the_last_day_of_the_history_newest_first() {
        use crate::history::{Event, Record, Writer};
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(dir.path(), &Default::default());
        for (i, hours) in [(1, 30), (2, 2), (3, 1)] {
            w.append(&Record {
                at: Utc::now() - chrono::Duration::hours(hours),
                event: Event::Decision(decision(i)),
            })
            .unwrap();
        }
        let (_stx, srx) = watch::channel(Arc::new(Status::default()));
        let (_otx, orx) = broadcast::channel(16);
        let token = CancellationToken::new();
        let tracker = TaskTracker::new();
        let d = Dashboard::from_parts(srx, orx, "b", token.clone(), &tracker);
        d.follow_history(dir.path().to_path_buf(), token.clone(), &tracker);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while d.snapshot().history.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "history never read");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let ops: Vec<_> = d
            .snapshot()
            .history
            .iter()
            .map(|r| match &r.event {
                Event::Decision(x) => x.op.clone().unwrap(),
                _ => panic!(),
            })
            .collect();
        assert_eq!(ops, vec!["op-3", "op-2"], "the last day, newest first");
        assert!(DASHBOARD_JS.contains("renderJournal"));
        token.cancel();
    }

    #[tokio::test]
    async fn serves_the_page_its_assets_and_the_snapshot() {
        let (_stx, srx) = watch::channel(Arc::new(Status::default()));
        let (_otx, orx) = broadcast::channel(16);
        let token = CancellationToken::new();
        let d = Dashboard::from_parts(srx, orx, "broker-x", token.clone(), &TaskTracker::new());
        let (addr, _task) = gearshift_service::http::serve(
            "127.0.0.1:0".parse().unwrap(),
            d.router(),
            token.clone(),
        )
        .await
        .unwrap();
        let get = |path: &str| {
            let path = path.to_string();
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            }
        };
        let page = get("/").await;
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(
            page.to_ascii_lowercase()
                .contains("content-security-policy")
        );
        assert!(page.contains("dashboard.js"));
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no external resources"
        );
        assert!(get("/dashboard.js").await.contains("api/dashboard"));
        assert!(get("/dashboard.css").await.starts_with("HTTP/1.1 200"));
        let api = get("/api/dashboard").await;
        let body = &api[api.find("\r\n\r\n").unwrap() + 4..];
        // Chunked or not, the JSON object is in there.
        let start = body.find('{').unwrap();
        let end = body.rfind('}').unwrap();
        let v: serde_json::Value = serde_json::from_str(&body[start..=end]).unwrap();
        assert_eq!(v["agent"], "broker-x");
        assert!(v["status"]["groups"].is_array());
        token.cancel();
    }
}
