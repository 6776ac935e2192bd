//! The agents' HTTP listener: `/metrics` in the Prometheus text format, plus
//! whatever routes the agent adds (the broker agent's dashboard).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A shared metrics registry.
pub type SharedRegistry = Arc<Mutex<Registry>>;

/// A router serving `/metrics` from `registry` and `/healthz`.
pub fn metrics_router(registry: SharedRegistry) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut out = String::new();
                    let r = registry.lock().unwrap_or_else(|p| p.into_inner());
                    if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
                        return (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            "encode failed",
                        )
                            .into_response();
                    }
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        out,
                    )
                        .into_response()
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Binds `addr` and serves `router` until `token` is cancelled. Returns the
/// bound address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    token: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_in(&TaskTracker::new(), addr, router, token).await
}

/// Like [`serve`], the server task tracked by `tracker` (the agent's
/// shutdown tree waits for it to close its connections).
pub async fn serve_in(
    tracker: &TaskTracker,
    addr: SocketAddr,
    router: Router,
    token: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tracker.spawn(async move {
        let r = axum::serve(listener, router)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "HTTP listener failed");
        }
    });
    Ok((local, task))
}

/// A listener that a reload can move: [`Listener::rebind`] binds the new
/// address before closing the old one, so a refused move keeps serving
/// where it was.
#[derive(Debug)]
pub struct Listener {
    tracker: TaskTracker,
    router: Router,
    parent: CancellationToken,
    current: Option<(SocketAddr, SocketAddr, CancellationToken)>,
}

impl Listener {
    /// Serves nothing yet; `router` is served on each address given to
    /// [`Listener::rebind`], until `parent` is cancelled.
    pub fn new(tracker: TaskTracker, router: Router, parent: CancellationToken) -> Self {
        Listener {
            tracker,
            router,
            parent,
            current: None,
        }
    }

    /// Serves on `addr` (`None`: nowhere) from now on. Nothing changes when
    /// `addr` is the address already asked for; a bind failure leaves the
    /// old listener serving. Returns the bound address.
    pub async fn rebind(
        &mut self,
        addr: Option<SocketAddr>,
    ) -> std::io::Result<Option<SocketAddr>> {
        if let Some((asked, bound, _)) = &self.current
            && Some(*asked) == addr
        {
            return Ok(Some(*bound));
        }
        let next = match addr {
            Some(a) => {
                let token = self.parent.child_token();
                let (bound, _) =
                    serve_in(&self.tracker, a, self.router.clone(), token.clone()).await?;
                Some((a, bound, token))
            }
            None => None,
        };
        if let Some((_, _, old)) = std::mem::replace(&mut self.current, next) {
            old.cancel();
        }
        Ok(self.current.as_ref().map(|(_, b, _)| *b))
    }

    /// The bound address, while serving.
    pub fn local(&self) -> Option<SocketAddr> {
        self.current.as_ref().map(|(_, b, _)| *b)
    }
}
