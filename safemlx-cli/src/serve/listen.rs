//! Rank 0's connections: accepted up to a cap, each bounded in time while
//! it sends its request, served by hyper with the router, and closed
//! gracefully on SIGINT or SIGTERM.
//!
//! `axum::serve` has no timeouts: a client that sends half a request and
//! then nothing held its socket and task forever, and enough of them used
//! up the process's descriptors. Here a connection must finish its request
//! head within `--header-timeout`, and a request body may pause at most
//! `--body-timeout` between pieces (neither applies to a streamed
//! response); at most `--max-connections` are open at once (later ones
//! wait in the listen backlog), a number kept below the descriptor limit.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use super::first_head::{self, FirstHead};
use super::http::STOPPING;

/// The connection limits (`safemlx serve`'s flags).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a connection's request head (`--header-timeout`).
    pub header: Duration,
    /// Longest pause inside a request body (`--body-timeout`).
    pub body_idle: Duration,
    /// Connections open at once (`--max-connections`).
    pub connections: usize,
}

/// Descriptors kept for everything but client connections: the model's
/// files, the ranks' sockets, the runtime's own.
const RESERVED_DESCRIPTORS: u64 = 128;

/// `--max-connections`' default and bound: the descriptor limit less
/// [`RESERVED_DESCRIPTORS`], at most 4096, at least 1.
///
/// # Errors
/// A cap the descriptor limit leaves no room for.
pub fn connection_cap(asked: Option<usize>) -> Result<usize, String> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_err(|e| format!("cannot read the descriptor limit: {e}"))?;
    let room = usize::try_from(soft.saturating_sub(RESERVED_DESCRIPTORS)).unwrap_or(usize::MAX);
    match asked {
        None => Ok(room.clamp(1, 4096)),
        Some(0) => Err("--max-connections is 0; give at least 1".to_owned()),
        Some(n) if n <= room => Ok(n),
        Some(n) => Err(format!(
            "--max-connections {n} leaves too few of this process's {soft} file descriptors (ulimit -n) for the model and the ranks ({RESERVED_DESCRIPTORS}); give at most {room}, or raise the limit"
        )),
    }
}

/// Serves `router` on `listener` until SIGINT or SIGTERM, which set
/// `stop`: open requests end with a 503 at once, the scheduler ends its
/// loop, and no new connection is taken.
///
/// # Errors
/// The listener's or the runtime's error.
pub async fn run(
    listener: std::net::TcpListener,
    router: Router,
    stop: Arc<watch::Sender<Option<String>>>,
    limits: Limits,
) -> Result<(), String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot use the listener: {e}"))?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| format!("cannot use the listener: {e}"))?;
    let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_idle,
    ));
    // HTTP/1.1 only: hyper-util's automatic version detection waits for a
    // silent client's first bytes without any timeout.
    let mut builder = Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    let open = Arc::new(Semaphore::new(limits.connections));
    let graceful = GracefulShutdown::new();
    let mut signal = std::pin::pin!(stop_signal(Arc::clone(&stop)));
    loop {
        // A place first: beyond the cap, clients wait in the backlog.
        let permit = tokio::select! {
            permit = Arc::clone(&open).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut signal => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors or a connection reset before it was
                // taken: the listener is fine; try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let _ = stream.set_nodelay(true);
        let service = router
            .clone()
            .map_request(|request: hyper::Request<Incoming>| request.map(axum::body::Body::new));
        let service = TowerToHyperService::new(service);
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            // The first head checked here: a malformed one gets OpenAI's
            // error body (hyper's own 400 has none).
            if let FirstHead::Parsed(stream) = first_head::read(stream, limits.header).await {
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let _ = watcher.watch(connection).await;
            }
            drop(permit);
        });
    }
    drop(listener);
    // Open streams have had their 503; the rest finish or are cut.
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM and tells the open requests.
async fn stop_signal(stop: Arc<watch::Sender<Option<String>>>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| eprintln!("safemlx serve: cannot watch SIGTERM: {e}"))
        .ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    let name = tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        () = term => "SIGTERM",
    };
    eprintln!("safemlx serve: {name}: no new requests; ending the open ones");
    // The launcher says why when a rank failed.
    let why = safemlx_dist::stop_reason().map_or_else(
        || STOPPING.to_owned(),
        |reason| format!("the server stopped: {reason}"),
    );
    stop.send_replace(Some(why));
}
