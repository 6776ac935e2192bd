//! A TCP proxy in front of a broker (RabbitMQ's AMQP port, ActiveMQ's STOMP
//! port) that cuts or freezes only this test's connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const UP: u8 = 0;
const CUT: u8 = 1;
const FROZEN: u8 = 2;

/// A TCP proxy to a broker that can cut every connection and refuse new ones,
/// optionally terminating TLS on its side.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    epoch: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `target`.
    pub async fn start(target: SocketAddr, tls: Option<Arc<rustls::ServerConfig>>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(UP));
        let (epoch, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let (m, e, a) = (mode.clone(), epoch.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                a.fetch_add(1, Ordering::SeqCst);
                let mut cut = e.subscribe();
                match m.load(Ordering::SeqCst) {
                    CUT => {
                        drop(inbound);
                        continue;
                    }
                    FROZEN => {
                        // Accept, then never answer.
                        tokio::spawn(async move {
                            let _ = cut.changed().await;
                            drop(inbound);
                        });
                        continue;
                    }
                    _ => {}
                }
                let tls = tls.clone();
                let m = m.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let copy = async {
                        match tls {
                            Some(cfg) => {
                                let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                                if let Ok(mut s) = acceptor.accept(inbound).await {
                                    let _ =
                                        tokio::io::copy_bidirectional(&mut s, &mut outbound).await;
                                }
                            }
                            None => {
                                let mut inbound = inbound;
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                                    .await;
                            }
                        }
                    };
                    let mut copy = std::pin::pin!(copy);
                    tokio::select! {
                        _ = &mut copy => return,
                        _ = cut.changed() => {}
                    }
                    if m.load(Ordering::SeqCst) == FROZEN {
                        // Keep both sockets open but move no byte until restored.
                        let _ = cut.changed().await;
                    }
                });
            }
        });
        Proxy {
            addr,
            mode,
            epoch,
            accepted,
            task,
        }
    }

    /// Drops every proxied connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.mode.store(CUT, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Keeps every connection open but silent (a hung broker or a dead
    /// network path), until [`Proxy::restore`].
    pub fn freeze(&self) {
        self.mode.store(FROZEN, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    pub fn restore(&self) {
        // Release the frozen sockets first, so that no new connection sees this change.
        self.epoch.send_modify(|e| *e += 1);
        self.mode.store(UP, Ordering::SeqCst);
    }

    #[allow(dead_code)]
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.epoch.send_modify(|e| *e += 1);
        self.task.abort();
    }
}
