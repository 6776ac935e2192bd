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
