//! The accept loop: HTTP/1.1, one task per connection, graceful on shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::App;

/// How long open connections get to finish once shutdown starts.
const DRAIN: Duration = Duration::from_secs(2);

/// Serves `app` on `listener` until `shutdown` turns true.
pub async fn serve(listener: TcpListener, app: Arc<App>, mut shutdown: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let app = app.clone();
                        async move { Ok::<_, Infallible>(app.respond(req).await) }
                    });
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    let conn = graceful.watch(conn);
                    tokio::spawn(conn);
                }
                // Out of file descriptors and the like: pause instead of spinning.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}
