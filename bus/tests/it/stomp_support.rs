//! An in-process STOMP 1.2 broker for tests of what a real broker cannot be
//! made to do on demand (fall silent, speak TLS with a test CA). It speaks
//! through our own codec, answers CONNECT with a configurable `heart-beat`,
//! sends heart-beats as promised, answers every `receipt`, and routes a SEND
//! to the subscriptions whose destination is exactly the SEND's (or one of
//! its comma-separated destinations, as ActiveMQ's composite SEND).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use gearshift_bus::stomp::codec::StompCodec;
use gearshift_bus::stomp::frame::{Command, Frame};
use gearshift_bus::stomp::parse::Item;
use gearshift_bus::stomp::session::parse_heart_beat;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

/// A subscription: (connection, id, destination, that connection's outbox).
type SubEntry = (usize, String, String, mpsc::UnboundedSender<Frame>);

#[derive(Default)]
pub struct State {
    /// Connections accepted so far.
    pub connections: AtomicUsize,
    /// EOL heart-beats received from clients.
    pub heartbeats_in: AtomicUsize,
    /// The connection (1-based) that stops writing anything; 0: none.
    pub silent: AtomicUsize,
    /// Answer every SUBSCRIBE as RabbitMQ answers a forbidden one: an ERROR
    /// without `receipt-id`, then a close.
    pub refuse_subscribes: AtomicBool,
    /// Every frame received, with its connection number.
    pub frames: Mutex<Vec<(usize, Frame)>>,
    subs: Mutex<Vec<SubEntry>>,
    next_message: AtomicUsize,
}

pub struct FakeBroker {
    pub addr: SocketAddr,
    pub state: Arc<State>,
}

impl FakeBroker {
    /// Starts a broker that answers CONNECT with `heart_beat` (`sx,sy`).
    pub async fn start(heart_beat: &str, tls: Option<tokio_rustls::TlsAcceptor>) -> FakeBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = state.clone();
        let hb = heart_beat.to_string();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                // Small frames must leave at once: with paused time, a write held
                // back by Nagle's algorithm would let the clock jump ahead.
                let _ = tcp.set_nodelay(true);
                let n = st.connections.fetch_add(1, Ordering::SeqCst) + 1;
                let (st, hb, tls) = (st.clone(), hb.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve(tcp, n, st, hb).await,
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(tcp).await {
                                serve(s, n, st, hb).await
                            }
                        }
                    }
                });
            }
        });
        FakeBroker { addr, state }
    }

    pub fn silence(&self, connection: usize) {
        self.state.silent.store(connection, Ordering::SeqCst);
    }

    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    pub fn heartbeats_in(&self) -> usize {
        self.state.heartbeats_in.load(Ordering::SeqCst)
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://guest:guest@127.0.0.1:{}", self.addr.port())
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: S,
    n: usize,
    st: Arc<State>,
    hb: String,
) {
    let mut conn = Framed::new(io, StompCodec::default());
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Frame>();
    let sx = parse_heart_beat(&hb).map_or(0, |(sx, _)| sx);
    let mut tick = tokio::time::interval(Duration::from_millis((sx / 2).max(1)));
    let silent = |st: &State| st.silent.load(Ordering::SeqCst) == n;
    loop {
        tokio::select! {
            item = conn.next() => {
                let f = match item {
                    None | Some(Err(_)) => break,
                    Some(Ok(Item::HeartBeat)) => {
                        st.heartbeats_in.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    Some(Ok(Item::TooLarge { .. })) => continue,
                    Some(Ok(Item::Frame(f))) => f,
                };
                st.frames.lock().unwrap().push((n, f.clone()));
                let mut replies = vec![];
                match f.command {
                    Command::Connect | Command::Stomp => replies.push(
                        Frame::new(Command::Connected)
                            .header("version", "1.2")
                            .header("heart-beat", hb.clone()),
                    ),
                    Command::Subscribe if st.refuse_subscribes.load(Ordering::SeqCst) => {
                        let error = Frame::new(Command::Error)
                            .header("message", "access_refused")
                            .body(&b"ACCESS_REFUSED - read access denied"[..]);
                        let _ = conn.send(Item::Frame(error)).await;
                        break;
                    }
                    Command::Subscribe => st.subs.lock().unwrap().push((
                        n,
                        f.get("id").unwrap_or_default().to_string(),
                        f.get("destination").unwrap_or_default().to_string(),
                        out_tx.clone(),
                    )),
                    Command::Unsubscribe => {
                        let id = f.get("id").unwrap_or_default();
                        st.subs.lock().unwrap().retain(|(c, i, _, _)| !(*c == n && i == id));
                    }
                    // A SEND to a destination ending in `.fail` gets what RabbitMQ
                    // answers a SEND to a missing exchange: an ERROR, then a close.
                    Command::Send
                        if f.get("destination").is_some_and(|d| d.ends_with(".fail")) =>
                    {
                        let error = Frame::new(Command::Error)
                            .header("message", "not_found")
                            .body(&b"NOT_FOUND - no exchange"[..]);
                        let _ = conn.send(Item::Frame(error)).await;
                        break;
                    }
                    Command::Send => {
                        let dests: Vec<&str> =
                            f.get("destination").unwrap_or_default().split(',').collect();
                        for (_, id, d, tx) in st.subs.lock().unwrap().iter() {
                            if dests.contains(&d.as_str()) {
                                let m = st.next_message.fetch_add(1, Ordering::SeqCst);
                                let mut msg = Frame::new(Command::Message)
                                    .header("subscription", id.clone())
                                    .header("destination", d.clone())
                                    .header("message-id", format!("m{m}"))
                                    .header("ack", format!("a{m}"))
                                    .body(f.body.clone());
                                for h in ["reply-to", "correlation-id"] {
                                    if let Some(v) = f.get(h) {
                                        msg.push_header(h, v);
                                    }
                                }
                                let _ = tx.send(msg);
                            }
                        }
                    }
                    _ => {}
                }
                if let Some(r) = f.get("receipt") {
                    replies.push(Frame::new(Command::Receipt).header("receipt-id", r));
                }
                if !silent(&st) {
                    for r in replies {
                        if conn.send(Item::Frame(r)).await.is_err() {
                            return;
                        }
                    }
                }
                if f.command == Command::Disconnect {
                    break;
                }
            }
            Some(f) = out_rx.recv() => {
                if !silent(&st) && conn.send(Item::Frame(f)).await.is_err() {
                    break;
                }
            }
            _ = tick.tick(), if sx > 0 => {
                if !silent(&st) && conn.send(Item::HeartBeat).await.is_err() {
                    break;
                }
            }
        }
    }
    st.subs.lock().unwrap().retain(|(c, _, _, _)| *c != n);
}
