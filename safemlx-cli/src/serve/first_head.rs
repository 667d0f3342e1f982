//! A connection's first request head, read and checked before hyper takes
//! the connection: hyper answers a malformed request with an empty 400 of
//! its own, where a client of this server is owed OpenAI's error body.
//! A head that parses is handed on, bytes and all ([`Prefixed`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::api::ApiError;

/// The most headers a request may have (hyper's own limit).
const MAX_HEADERS: usize = 100;

/// The most bytes a request head may have.
const MAX_HEAD: usize = 64 << 10;

/// What the first head came to.
pub enum FirstHead {
    /// A head that parses: the connection with the bytes read so far.
    Parsed(Prefixed),
    /// Nothing to serve: the client closed, or sent no whole head in time
    /// (hyper closes such a connection too).
    Closed,
}

/// Reads the connection's first request head within `limit`; a malformed
/// one is answered with a 400 (431 for too many or too large headers) in
/// OpenAI's error format, and the connection closed.
pub async fn read(mut stream: TcpStream, limit: Duration) -> FirstHead {
    let mut bytes = Vec::with_capacity(1024);
    let outcome = tokio::time::timeout(limit, async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            };
            bytes.extend_from_slice(&chunk[..n]);
            match check(&bytes) {
                Ok(true) => return Some(Ok(())),
                Ok(false) if bytes.len() > MAX_HEAD => {
                    return Some(Err(ApiError::new(
                        431,
                        format!("the request's head is over {MAX_HEAD} bytes"),
                    )))
                }
                Ok(false) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    })
    .await;
    match outcome {
        Ok(Some(Ok(()))) => FirstHead::Parsed(Prefixed {
            prefix: bytes,
            at: 0,
            stream,
        }),
        Ok(Some(Err(refusal))) => {
            let body = refusal.body().to_string();
            let reason = match refusal.status {
                431 => "Request Header Fields Too Large",
                _ => "Bad Request",
            };
            let response = format!(
                "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                refusal.status,
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
            FirstHead::Closed
        }
        Ok(None) | Err(_) => FirstHead::Closed,
    }
}

/// Whether `bytes` start with a whole request head (`Ok(false)`: not yet);
/// a head that cannot be a request, named.
fn check(bytes: &[u8]) -> Result<bool, ApiError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Partial) => Ok(false),
        Ok(httparse::Status::Complete(_)) => {
            for header in request.headers.iter() {
                if header.name.eq_ignore_ascii_case("content-length")
                    && (header.value.is_empty() || !header.value.iter().all(u8::is_ascii_digit))
                {
                    return Err(ApiError::new(
                        400,
                        format!(
                            "malformed HTTP request: Content-Length is {:?}, not a number of bytes",
                            String::from_utf8_lossy(header.value)
                        ),
                    ));
                }
            }
            Ok(true)
        }
        Err(httparse::Error::TooManyHeaders) => Err(ApiError::new(
            431,
            format!("the request has more than {MAX_HEADERS} headers"),
        )),
        Err(e) => Err(ApiError::new(
            400,
            format!("malformed HTTP request: {e}; send an HTTP/1.1 request such as POST /v1/chat/completions"),
        )),
    }
}

/// A connection whose first bytes were already read: they are read again
/// first, then the connection's.
pub struct Prefixed {
    prefix: Vec<u8>,
    at: usize,
    stream: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn heads_are_whole_partial_or_named_as_malformed() {
        assert!(check(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap());
        assert!(!check(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap());
        let bad = check(b"GARBAGE\r\n\r\n").unwrap_err();
        assert_eq!(bad.status, 400);
        assert!(
            bad.message.starts_with("malformed HTTP request: "),
            "{}",
            bad.message
        );
        let length = check(b"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n").unwrap_err();
        assert_eq!(
            length.message,
            "malformed HTTP request: Content-Length is \"abc\", not a number of bytes"
        );
    }
}
